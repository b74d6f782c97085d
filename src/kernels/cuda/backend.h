// Whether this process runs MLX's CUDA backend: the EP's CUDA kernels (mx::fast::cuda_kernel)
// exist only there, and each returns std::nullopt elsewhere.
#pragma once

namespace ortmlx::kernels::cuda {

bool available();

}  // namespace ortmlx::kernels::cuda
