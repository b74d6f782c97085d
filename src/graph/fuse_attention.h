// An encoder's attention as one node: MatMul(Q, K^T) -> [Div or Mul by a scalar constant] ->
// [Add of a bias] -> Softmax over the last axis -> MatMul(., V) [-> Transpose 0, 2, 1, 3]
// becomes the last MatMul, marked by kMatMulAttention, with inputs [Q, K^T, V, bias or ""]; the
// other nodes go. (The Transpose: the kernel writes each head's rows where the heads lie side
// by side, so that the output projection's Reshape is a view, not a copy.)
//
// Why: on MLX's CPU device the EP's attention kernel (kernels/cpu/attention.cc) keeps each
// query row's scores in cache from the product through the softmax to the weighted sum of V;
// as nodes of their own they are five primitives a layer and three passes over the scores.
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// The attribute a fused MatMul carries (internal: ONNX attributes never start with '_'): two
// floats, whether the scores are divided (1) or multiplied (0) and by what; a third, 1, when a
// Transpose [0, 2, 1, 3] of the result was fused too (the node's output is then [B, S, N, Hv]).
inline constexpr const char* kMatMulAttention = "_ortmlx_attention";

// Rewrites `g` in place (nodes stay in topological order and are renumbered). Every value
// between the first MatMul and the last must be read by the next node of the pattern alone and
// be neither one of `graph_outputs` nor read inside a control-flow body; the scale is a float
// constant of one element; the Softmax's axis is the last (opset 13 on, or a known rank).
// Returns how many attentions were fused.
int fuse_attention(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
