#include "graph/fuse_skip_norm.h"

namespace ortmlx::graph {

int fuse_skip_norm(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  auto float32 = [&](const std::string& v) {
    const ValueInfo* vi = g.info(v);
    return vi && vi->is_tensor && vi->dtype == DType::Float32;
  };
  auto last_axis = [&](const Node& n) {
    const int64_t axis = n.attr_int("axis", -1);
    if (axis == -1) return true;
    const ValueInfo* vi = g.info(n.inputs[0]);
    return vi && vi->rank() > 0 && axis == vi->rank() - 1;
  };
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (auto& norm : g.nodes) {
    if (!norm.domain.empty() || norm.op_type != "LayerNormalization" || norm.inputs.size() < 2 ||
        !norm.has_input(0) || !norm.has_input(1) || !norm.has_output(0) || norm.has_output(1) ||
        norm.has_output(2) || norm.attr_int("stash_type", 1) != 1 || !last_axis(norm))
      continue;
    auto p = uses.producer.find(norm.inputs[0]);
    if (p == uses.producer.end()) continue;
    const Node& add = g.nodes[p->second];
    if (gone[add.index] || !add.domain.empty() || add.op_type != "Add" || add.inputs.size() != 2 ||
        !add.has_input(0) || !add.has_input(1) || uses.only_reader(g, add.outputs[0]) != &norm ||
        !float32(add.inputs[0]) || !float32(add.inputs[1]))
      continue;
    // SkipLayerNormalization(input, skip, gamma, beta): the normalization's place, after the Add's.
    const float eps = norm.attr_float("epsilon", 1e-5f);
    std::vector<std::string> ins{add.inputs[0], add.inputs[1], norm.inputs[1]};
    if (norm.has_input(2)) ins.push_back(norm.inputs[2]);
    norm.domain = "com.microsoft";
    norm.op_type = "SkipLayerNormalization";
    norm.since_version = 1;
    norm.inputs = std::move(ins);
    norm.outputs.resize(1);
    norm.attrs.clear();
    Attribute a;
    a.type = AttrType::Float;
    a.f = eps;
    norm.attrs["epsilon"] = a;
    gone[add.index] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
