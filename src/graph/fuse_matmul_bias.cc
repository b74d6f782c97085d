#include "graph/fuse_matmul_bias.h"

#include <unordered_map>
#include <unordered_set>

namespace ortmlx::graph {

int fuse_matmul_bias(Graph& g, const std::vector<std::string>& graph_outputs) {
  std::unordered_set<std::string> kept(graph_outputs.begin(), graph_outputs.end());
  std::unordered_map<std::string, std::vector<size_t>> readers;
  for (const auto& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.has_input(i)) readers[n.inputs[i]].push_back(n.index);
    for (const auto& [attr, body] : n.subgraphs())
      for (const auto& name : outer_names(*body)) kept.insert(name);
  }
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
  if (!done) return 0;
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() - done);
  for (auto& n : g.nodes)
    if (!gone[n.index]) nodes.push_back(std::move(n));
  for (size_t i = 0; i < nodes.size(); ++i) nodes[i].index = i;
  g.nodes = std::move(nodes);
  return done;
}

}  // namespace ortmlx::graph
