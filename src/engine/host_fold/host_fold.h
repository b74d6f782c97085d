// Shape arithmetic on the host, without MLX. Exported models compute their reshape targets,
// position ranges and mask sizes from Shape ops (Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape); translated as MLX ops, each such chain costs one MLX evaluation when a translator
// reads its result (~50 us on the CPU stream, ~200 us with the GPU's launches and sync), and a
// decode step of an exported model reads dozens. The engine folds a node here instead when all
// of its inputs are small, already-evaluated arrays (integers, or floats holding integers the
// dtype represents exactly: see host_fold.cc) that depend on shapes and constants only, or in
// eager runs on a fused input's data (Program::fold_on_host checks that); what this file does not
// cover goes to the translator.
#pragma once

#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "graph/view.h"

namespace ortmlx::ops {

namespace mx = mlx::core;

// Larger tensors are left to MLX (the same bound as host-read signature keys).
constexpr size_t kHostFoldMaxElements = 4096;

// The node's outputs computed on the host (evaluated, row-contiguous arrays), or nullopt when
// the op, an attribute, a dtype or a size is not covered, or the inputs are invalid (the
// translator then reports the error). inputs[i] is empty for an omitted optional input.
std::optional<std::vector<mx::array>> fold_on_host(const graph::Node& n,
                                                   const std::vector<std::optional<mx::array>>& inputs);

// Whether fold_on_host covers this op type at all (the engine skips its checks otherwise).
bool host_foldable_op(const graph::Node& n);

}  // namespace ortmlx::ops
