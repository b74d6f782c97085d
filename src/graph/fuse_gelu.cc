#include "graph/fuse_gelu.h"

#include <cmath>
#include <optional>

namespace ortmlx::graph {

int fuse_gelu(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  const auto& producer = uses.producer;
  auto plain = [](const Node& n, const char* op, size_t inputs) {
    return n.domain.empty() && n.op_type == op && n.inputs.size() == inputs && n.outputs.size() == 1 &&
           n.has_output(0) && n.has_input(0) && (inputs < 2 || n.has_input(1));
  };
  // The one node reading `v` (once), when `v` stays inside the chain.
  auto only_reader = [&](const std::string& v) { return uses.only_reader(g, v); };
  auto scalar = [&](const std::string& name) -> std::optional<float> {
    const ConstTensor* t = g.constant(name);
    if (!t || !is_float(t->dtype) || t->numel() != 1) return std::nullopt;
    return static_cast<float>(t->float_at(0));
  };
  // Of a two-input node: the operand other than `v`, when the other is the constant `c`.
  auto other_is = [&](const Node& n, const std::string& v, float c) {
    const std::string& o = n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
    auto k = scalar(o);
    return (n.inputs[0] == v) != (n.inputs[1] == v) && k && *k == c;
  };
  auto mul_of = [](const Node& n, const std::string& a, const std::string& b) {
    return (n.inputs[0] == a && n.inputs[1] == b) || (n.inputs[0] == b && n.inputs[1] == a);
  };
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (auto& erf : g.nodes) {
    if (!plain(erf, "Erf", 1) || gone[erf.index]) continue;
    auto p = producer.find(erf.inputs[0]);
    if (p == producer.end()) continue;
    const Node& scale = g.nodes[p->second];
    if (only_reader(erf.inputs[0]) != &erf || !(plain(scale, "Div", 2) || plain(scale, "Mul", 2))) continue;
    std::string x;
    std::optional<float> c;
    if (scale.op_type == "Div") x = scale.inputs[0], c = scalar(scale.inputs[1]);
    else if (auto k = scalar(scale.inputs[1])) x = scale.inputs[0], c = k;
    else x = scale.inputs[1], c = scalar(scale.inputs[0]);
    const float want = scale.op_type == "Div" ? static_cast<float>(M_SQRT2) : static_cast<float>(M_SQRT1_2);
    if (!c || std::fabs(*c - want) > 1e-4f || x == erf.inputs[0]) continue;
    Node* add = only_reader(erf.outputs[0]);
    if (!add || !plain(*add, "Add", 2) || !other_is(*add, erf.outputs[0], 1.f)) continue;
    Node* m1 = only_reader(add->outputs[0]);
    if (!m1 || !plain(*m1, "Mul", 2)) continue;
    Node* last = nullptr;
    std::vector<size_t> taken{scale.index, erf.index, add->index, m1->index};
    if (mul_of(*m1, x, add->outputs[0])) {  // x (1 + erf) then times 0.5
      Node* m2 = only_reader(m1->outputs[0]);
      if (!m2 || !plain(*m2, "Mul", 2) || !other_is(*m2, m1->outputs[0], 0.5f)) continue;
      last = m2;
    } else {  // (0.5 x) (1 + erf)
      const std::string& h = m1->inputs[0] == add->outputs[0] ? m1->inputs[1] : m1->inputs[0];
      auto ph = producer.find(h);
      if (ph == producer.end() || only_reader(h) != m1) continue;
      const Node& half = g.nodes[ph->second];
      if (!plain(half, "Mul", 2) || !mul_of(half, x, half.inputs[0] == x ? half.inputs[1] : half.inputs[0]) ||
          !other_is(half, x, 0.5f))
        continue;
      taken.push_back(half.index);
      last = m1;
    }
    // The last node of the chain becomes the Gelu (its position: after every node it replaces).
    Node& gelu = *last;
    gelu.domain = "com.microsoft";
    gelu.op_type = "Gelu";
    gelu.since_version = 1;
    gelu.inputs = {x};
    gelu.attrs.clear();
    for (size_t i : taken)
      if (i != gelu.index) gone[i] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
