#include "kernels/cuda/backend.h"

#include <mlx/backend/cuda/cuda.h>

namespace ortmlx::kernels::cuda {

bool available() {
  static const bool cuda = mlx::core::cu::is_available();
  return cuda;
}

}  // namespace ortmlx::kernels::cuda
