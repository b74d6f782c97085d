// The bias Add after a MatMul by a constant as part of the MatMul: the MatMul node takes the
// Add's output and the bias as a third input, marked by kMatMulBias, and the Add goes.
//
// Why: on MLX's CPU device the EP's product kernel (kernels/cpu/packed_gemm.cc) starts its sums
// from the bias; as a node of its own the Add is one more pass over the product (MLX's
// elementwise kernels are single-threaded) and one more primitive to schedule a run (an
// encoder layer's projections and feed-forward products each have one).
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// The attribute a fused MatMul carries (internal: ONNX attributes never start with '_').
inline constexpr const char* kMatMulBias = "_ortmlx_bias";

// Rewrites `g` in place (nodes stay in topological order and are renumbered): a MatMul whose
// second input is a float constant 2-D [K, N] and whose output only an Add reads, with a float
// constant [N] of the same dtype as the Add's other operand. The product's value must be
// neither one of `graph_outputs` nor read inside a control-flow body. Returns how many Adds went.
int fuse_matmul_bias(Graph& g, const std::vector<std::string>& graph_outputs);

// The GELU after such a product as part of it too (an encoder's feed-forward layer): the kernel
// applies it to each tile of the product as it stores it, while the tile is in L1, instead of a
// pass of its own over the product.
inline constexpr const char* kMatMulGelu = "_ortmlx_gelu";

// Rewrites `g` in place: a MatMul (its bias fused or not) or a Gemm whose second input is a
// float32 constant 2-D, and whose output only a com.microsoft Gelu reads (graph/fuse_gelu's, or
// the model's), directly or through a Reshape only it reads (ORT's Gemm of 3-D rows), takes the
// Gelu's output (or, with the Reshape, the Reshape does), marked by kMatMulGelu, and the Gelu
// goes. The values between must be neither one of `graph_outputs` nor read inside a
// control-flow body. Returns how many Gelus went.
int fuse_matmul_gelu(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
