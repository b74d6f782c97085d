// The residual add and RMS normalization of SkipSimplifiedLayerNormalization as one CUDA kernel
// (mx::fast::cuda_kernel).
//
// Why: a decoder layer runs two of these nodes, and as MLX ops each is two kernels (the add, then
// mx::fast::rms_norm reading the sum back); a decode step is bound by its count of kernels, not
// by the bytes they move.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// sum = x + skip (+ bias), rounded to x's dtype; y = sum / sqrt(mean(sum^2) + eps) * gamma over
// the last axis, accumulated in float32. x and skip [..., D] of one shape, gamma and bias [D], all
// of one floating dtype. Returns {y, sum}, or std::nullopt where the kernel does not apply (not a
// CUDA GPU stream, other shapes or dtypes): the caller then uses MLX's ops.
std::optional<std::pair<mx::array, mx::array>> skip_rms_norm(const mx::array& x, const mx::array& skip,
                                                             const mx::array& gamma,
                                                             const std::optional<mx::array>& bias,
                                                             float eps, mx::Stream s);

// How many graph nodes this process has built with the kernel (the report's evidence).
uint64_t skip_rms_norm_nodes();

}  // namespace ortmlx::kernels::cuda
