#include "graph/fuse_matmul_bias.h"

#include <unordered_map>
#include <unordered_set>

namespace ortmlx::graph {

int fuse_matmul_bias(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  const auto& kept = uses.kept;
  const auto& readers = uses.readers;
  auto plain = [](const Node& n, const char* op) {
    return n.domain.empty() && n.op_type == op && n.inputs.size() == 2 && n.outputs.size() == 1 && n.has_output(0) &&
           n.has_input(0) && n.has_input(1);
  };
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (auto& mm : g.nodes) {
    if (!plain(mm, "MatMul") || mm.has_attr(kMatMulBias) || kept.count(mm.outputs[0])) continue;
    const ConstTensor* w = g.constant(mm.inputs[1]);
    if (!w || !is_float(w->dtype) || w->shape.size() != 2) continue;
    auto r = readers.find(mm.outputs[0]);
    if (r == readers.end() || r->second.size() != 1) continue;
    const Node& add = g.nodes[r->second[0]];
    if (!plain(add, "Add") || add.inputs[0] == add.inputs[1]) continue;
    const std::string& bias = add.inputs[0] == mm.outputs[0] ? add.inputs[1] : add.inputs[0];
    const ConstTensor* b = g.constant(bias);
    if (!b || b->dtype != w->dtype || b->shape != std::vector<int64_t>{w->shape[1]}) continue;
    mm.inputs.push_back(bias);
    mm.outputs[0] = add.outputs[0];
    mm.attrs[kMatMulBias] = Attribute{};
    mm.attrs[kMatMulBias].type = AttrType::Int;
    mm.attrs[kMatMulBias].i = 1;
    gone[add.index] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
