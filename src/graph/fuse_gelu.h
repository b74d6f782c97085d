// GELU written out as nodes, 0.5 x (1 + erf(x / sqrt 2)), as one com.microsoft Gelu node: the
// chain Div(x, sqrt 2) (or Mul by 1 / sqrt 2) -> Erf -> Add 1 -> Mul by x -> Mul by 0.5, or with
// 0.5 x computed first and multiplied last.
//
// Why: on MLX's CPU device the EP's GELU kernel (kernels/cpu/unary.cc) computes it in one pass
// over the activations, split over the threads; as nodes they are an erf map between two of
// MLX's single-threaded elementwise kernels (an encoder's feed-forward layer has one).
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// Rewrites `g` in place (nodes stay in topological order and are renumbered). Every value
// between x and the result must be read by the next node of the chain alone and be neither one
// of `graph_outputs` nor read inside a control-flow body; the constants are one-element floats
// (sqrt 2 or its inverse within 1e-4, 1 and 0.5 exactly). Returns how many were fused.
int fuse_gelu(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
