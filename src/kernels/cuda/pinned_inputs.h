// Inputs the GPU reads from pinned host memory (MLX's CUDA backend).
//
// Why: an MLX array made from host data (allocator::malloc + memcpy) lives in CUDA managed memory
// there; the host's writes leave its pages on the host and the first kernel that reads it faults
// them over to the GPU, a cost per buffer larger than a decode step's small kernels. Kernels read
// pinned host memory in place over the bus, with no fault. Its buffers come from a pool (pinning
// is slow) and go back to it when MLX lets go of the array, which it does only after the kernels
// that read it have finished.
#pragma once

#include <cstddef>
#include <optional>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// A row-contiguous array of `shape` and `dtype` holding a copy of the bytes at `src`, in pinned
// host memory; std::nullopt where that is not available (not MLX's CUDA backend, no CUDA context
// current on this thread, a buffer layout this build does not know, pinning failed): the caller
// copies the usual way.
std::optional<mx::array> pinned_copy(const void* src, const mx::Shape& shape, mx::Dtype dtype);

// Process totals, for tests and reports: arrays made by pinned_copy, and the pinned bytes held
// (in use and pooled).
size_t pinned_copies();
size_t pinned_bytes();

}  // namespace ortmlx::kernels::cuda
