// The gated activation of a Llama-style MLP, Sigmoid(g) -> Mul(g, .) -> Mul(., up), as one node:
// the last Mul, marked by kMulSwiGlu, with inputs [g, up]; the Sigmoid and the first Mul go.
//
// Why: on MLX's CPU device the EP's kernel (kernels/cpu/unary.cc, cpu_swiglu) computes
// g * sigmoid(g) * up in one pass split over the threads; as nodes they are a sigmoid map and two
// of MLX's single-threaded products over a prompt's [S, intermediate] activations.
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// The attribute a fused Mul carries (internal: ONNX attributes never start with '_').
inline constexpr const char* kMulSwiGlu = "_ortmlx_swiglu";

// Rewrites `g` in place (nodes stay in topological order and are renumbered). The sigmoid and
// the first product must be read by the next node of the chain alone and be neither one of
// `graph_outputs` nor read inside a control-flow body; g and up float32 (their value infos).
// Returns how many were fused.
int fuse_swiglu(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
