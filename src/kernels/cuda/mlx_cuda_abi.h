// What the EP's CUDA helpers know of MLX's CUDA backend and the CUDA driver without their headers
// (MLX's CUDA headers need the CUDA toolkit, which the EP's build does not require).
//
// MLX's buffer record (mlx/backend/cuda/allocator.h, CudaBuffer) is mirrored here and checked
// against the allocator's own size() on an MLX allocation before the first use; the driver's
// entry points are those of the libcuda.so.1 MLX already loaded (never loaded here).
#pragma once

#include <cstddef>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda::abi {

namespace mx = mlx::core;

struct CudaBufferView {
  void* data;
  size_t size;
  int device;  // -1: managed or pinned host memory
};

// CUDA driver API entry points (CUresult is an int; CUdeviceptr an unsigned long long).
struct Driver {
  int (*memcpy_dtoh)(void* dst, unsigned long long src, size_t bytes) = nullptr;
  int (*memcpy)(unsigned long long dst, unsigned long long src, size_t bytes) = nullptr;
  int (*ctx_get_device)(int* device) = nullptr;
  int (*ctx_get_current)(void** ctx) = nullptr;
  int (*mem_host_alloc)(void** p, size_t bytes, unsigned int flags) = nullptr;
  int (*mem_free_host)(void* p) = nullptr;
  int (*stream_synchronize)(void* stream) = nullptr;
  bool loaded() const { return memcpy_dtoh != nullptr; }
};

// The driver MLX loaded, or one with nothing loaded (the CPU or Metal backend).
const Driver& driver();

// Whether MLX's buffer records have the mirrored layout (checked once on a fresh allocation;
// off for good after a record disagrees).
bool layout_ok();

// `a`'s buffer record, or null when the layout is not known to match (a disagreeing record
// turns the mirror off for good).
const CudaBufferView* view_of(const mx::array& a);

}  // namespace ortmlx::kernels::cuda::abi
