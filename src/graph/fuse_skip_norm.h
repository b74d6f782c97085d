// A residual Add followed by LayerNormalization over the last axis, as one com.microsoft
// SkipLayerNormalization node (an encoder layer's two residual connections).
//
// Why: on MLX's CPU device the normalization and its add are then one kernel of the EP's
// (kernels/cpu/layer_norm.cc, cpu_skip_norm) that makes each row's sum and normalizes it in one
// pass, split over the threads; as two nodes the add is one of MLX's single-threaded
// elementwise kernels writing the whole sum first.
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// Rewrites `g` in place (nodes stay in topological order and are renumbered). The Add's output
// must be read by the LayerNormalization alone and be neither one of `graph_outputs` nor read
// inside a control-flow body; both of the Add's inputs float32 (known from the value infos);
// the normalization over the last axis (axis -1, or the last of a known rank), with float32
// statistics and only its first output. Returns how many were fused.
int fuse_skip_norm(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
