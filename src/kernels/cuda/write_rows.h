// New rows written into KV buffers in place, all of a step's in one CUDA kernel
// (mx::fast::cuda_kernel).
//
// Why: a decode step into shared past/present buffers (onnxruntime-genai's
// past_present_share_buffer) adds one row to two buffers a layer. As MLX slice updates these are
// a kernel each and a second evaluation after the step's own (the buffers can only be donated
// once nothing else holds them); written by one kernel inside the step's evaluation they cost
// one launch. The kernel writes through its input pointers, which MLX's semantics do not foresee:
// the caller guarantees each buffer is the output ORT bound to it (the present is the past with
// rows added) and that nothing else in the evaluation reads the rows written.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// buffers[i] [1, H, T, D] (row-contiguous, one shape and dtype for all) gets updates[i]
// [1, H, S, D] written at rows [starts[i], starts[i] + S) of axis 2; starts[i] is a one-element
// int32 array, clipped to [0, T - S]. Returns an array to evaluate with the step (its values are
// meaningless), or std::nullopt where the kernel does not apply (not a CUDA GPU stream, other
// shapes or dtypes, more than 256 buffers): the caller then writes the rows otherwise.
std::optional<mx::array> write_rows(const std::vector<mx::array>& buffers, const std::vector<mx::array>& updates,
                                    const std::vector<mx::array>& starts, mx::Stream s);

}  // namespace ortmlx::kernels::cuda
