// Products of matmul.cc shared with other op families: exact integer products through float
// matmuls (the integer convolutions of conv_extra.cc) and the CPU's packed product by a constant
// (MatMulNBits' prompts, contrib/quantized_matmul.cc).
#pragma once

#include <optional>

#include "ops/op_context.h"

namespace ortmlx::ops {

// a @ b (rank >= 2, numpy batch broadcasting) for integer-valued arrays with |a|, |b| < 2^bits,
// returned exactly as int64: K is cut into chunks whose partial sums fit the mantissa of the
// float type used (float64 on the CPU, float32 elsewhere).
mx::array exact_matmul(mx::array a, mx::array b, int bits, mx::Stream s);

// a @ b (+ bias [N]) for float32 rows a [..., K] (two or more) and a 2-D float32 b [K, N] that is a
// constant of the program (its buffer never changes: the kernel lays it out once), through
// cpu_packed_matmul (kernels/cpu/kernels.h), split over the threads from the switches'
// cpu_conv_parallel_min_flops; std::nullopt when that path is off or does not fit. `gelu`: the
// GELU of the product, applied by the kernel as it stores it where cpu_unary would compute it
// (the same bits), else by gelu_erf after it.
// `weight_of`: the node (MatMul, Gemm) whose constant input 1 b is, or a view of (a transposed
// B): b's panels are then laid out once for the program (OpContext::prepared), not by each
// primitive that meets them.
std::optional<mx::array> packed_product(const mx::array& a, const mx::array& b, mx::Stream s,
                                        const std::optional<mx::array>& bias = std::nullopt, bool gelu = false,
                                        const OpContext* weight_of = nullptr);

}  // namespace ortmlx::ops
