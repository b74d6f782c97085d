// A fused group (or a control-flow body) as the engine translates it: a plan of steps over value
// slots. Engine-private (program.h, shape_family.h); src/ep never sees it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "graph/view.h"
#include "ops/op_context.h"
#include "ops/registry.h"

namespace ortmlx::engine {

namespace mx = mlx::core;

struct StepIO {
  std::vector<int> in;   // value slot per node input, -1 = absent
  std::vector<int> out;  // value slot per node output, -1 = unused
  // Per subgraph of the node (If/Loop/Scan): the slots, in this scope, of the outer-scope
  // values that body reads (in the order of its Plan::outer).
  std::vector<std::pair<const graph::Graph*, std::vector<int>>> bodies;
};

// One scope ready to translate: the fused group itself, or a control-flow body. Slots:
// [0, num_inputs) the scope's inputs (for the group: fused inputs, then its constants, all
// passed as arguments so mx::compile sees them as inputs); then, for bodies, the body's
// constants and its outer-scope values; then node outputs.
struct Plan {
  const graph::Graph* graph = nullptr;
  std::vector<const ops::OpEntry*> entries;
  std::vector<StepIO> steps;
  size_t num_inputs = 0;
  std::vector<std::pair<int, mx::array>> constants;  // bodies only: (slot, value)
  std::vector<std::string> outer;                    // bodies only: names read from outside
  std::vector<int> outer_slots;
  std::vector<int> output_slots;
  size_t num_slots = 0;
};

// The values of a translation, by slot.
using Slots = std::vector<std::optional<ops::Value>>;

// What each fused input is, as arguments: -1 a tensor (one argument), -2 an empty optional
// (none), n >= 0 a sequence whose n items are n arguments. Part of the signature.
using Layout = std::vector<int>;

}  // namespace ortmlx::engine
