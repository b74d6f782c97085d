#include "graph/fuse_conv_relu.h"

#include <unordered_map>
#include <unordered_set>

namespace ortmlx::graph {

int fuse_conv_relu(Graph& g, const std::vector<std::string>& graph_outputs) {
  std::unordered_map<std::string, int> readers;
  std::unordered_set<std::string> kept(graph_outputs.begin(), graph_outputs.end());
  std::unordered_map<std::string, size_t> conv_of;  // a Conv's output -> the Conv
  for (const auto& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.has_input(i)) ++readers[n.inputs[i]];
    for (const auto& [attr, body] : n.subgraphs())
      for (const auto& name : outer_names(*body)) kept.insert(name);
    if (n.domain.empty() && n.op_type == "Conv" && n.outputs.size() == 1 && !n.has_attr(kConvActivation))
      conv_of[n.outputs[0]] = n.index;
  }
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (const auto& n : g.nodes) {
    if (!n.domain.empty() || n.op_type != "Relu" || n.inputs.size() != 1 || n.outputs.size() != 1 ||
        n.outputs[0].empty())
      continue;
    const std::string& x = n.inputs[0];
    auto it = conv_of.find(x);
    if (it == conv_of.end() || readers[x] != 1 || kept.count(x)) continue;
    Node& conv = g.nodes[it->second];
    conv.outputs[0] = n.outputs[0];
    Attribute a;
    a.type = AttrType::String;
    a.s = "Relu";
    conv.attrs[kConvActivation] = a;
    gone[n.index] = true;
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
