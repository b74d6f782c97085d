// A Relu after a Conv as part of the Conv: the Conv node takes over the Relu's output and gets
// the attribute kConvActivation ("Relu"), and the Relu node goes.
//
// Why: on MLX's CPU device a convolution runs through oneDNN, which applies the Relu to each
// output block while it is still in cache (a post-op); as its own node the Relu is one more pass
// over the activations, single-threaded in MLX's CPU backend.
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// The attribute a fused Conv carries (an internal name: ONNX attributes never start with '_').
inline constexpr const char* kConvActivation = "_ortmlx_activation";

// Rewrites `g` in place (nodes stay in topological order and are renumbered). A pair qualifies
// when the Relu is the only reader of the Conv's output and that output is neither one of
// `graph_outputs` nor read inside a control-flow body. Returns how many pairs were fused.
int fuse_conv_relu(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
