// 4-bit affine dequantization of a product's weight for a prompt (MatMulNBits over many rows), as
// one CUDA kernel (mx::fast::cuda_kernel).
//
// Why: a prompt's 4-bit products dequantize every weight each run and multiply densely; MLX's
// own dequantization kernel moves these bytes at a fraction of the GPU's bandwidth. Here a thread
// takes one 32-bit word (eight values) and writes them with one vector store.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// w[n, k] = q[n, k] * scales[n, k / group] + biases[n, k / group], q the 4-bit values of `words`
// ([N, K / 8] uint32, value j of a word in its bits 4j..4j+3, as MLX's affine layout), scales and
// biases [N, K / group] of a floating dtype; returns [N, K] in `out`, or std::nullopt where the
// kernel does not apply (not a CUDA GPU stream, other shapes or dtypes): the caller then uses
// mx::dequantize.
std::optional<mx::array> dequantize_int4(const mx::array& words, const mx::array& scales, const mx::array& biases,
                                         int group, mx::Dtype out, mx::Stream s);

// How many graph nodes this process has built with the kernel (the report's evidence).
uint64_t dequantize_int4_nodes();

}  // namespace ortmlx::kernels::cuda
