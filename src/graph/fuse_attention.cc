#include "graph/fuse_attention.h"

#include <optional>

namespace ortmlx::graph {

namespace {

bool is(const Node& n, const char* op, size_t inputs) {
  return n.domain.empty() && n.op_type == op && n.inputs.size() == inputs && n.outputs.size() == 1 &&
         n.has_output(0) && n.has_input(0) && (inputs < 2 || n.has_input(1)) && !n.attrs.count(kMatMulAttention);
}

}  // namespace

int fuse_attention(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  // The one node reading `v` (once), when `v` stays inside the pattern.
  auto next = [&](const std::string& v) { return uses.only_reader(g, v); };
  auto scalar = [&](const std::string& name) -> std::optional<float> {
    const ConstTensor* t = g.constant(name);
    if (!t || !is_float(t->dtype) || t->numel() != 1) return std::nullopt;
    return static_cast<float>(t->float_at(0));
  };
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (auto& first : g.nodes) {
    if (!is(first, "MatMul", 2) || gone[first.index]) continue;
    std::vector<size_t> taken{first.index};
    std::string v = first.outputs[0];
    Node* n = next(v);
    bool divide = false;
    float scale = 1.f;
    if (n && (is(*n, "Div", 2) || is(*n, "Mul", 2))) {
      const bool div = n->op_type == "Div";
      std::optional<float> c;
      if (n->inputs[0] == v && n->inputs[1] != v) c = scalar(n->inputs[1]);
      else if (!div && n->inputs[1] == v && n->inputs[0] != v) c = scalar(n->inputs[0]);
      if (!c) continue;
      divide = div, scale = *c;
      taken.push_back(n->index);
      v = n->outputs[0];
      n = next(v);
    }
    std::string bias;
    if (n && is(*n, "Add", 2) && n->inputs[0] != n->inputs[1]) {
      bias = n->inputs[0] == v ? n->inputs[1] : n->inputs[0];
      taken.push_back(n->index);
      v = n->outputs[0];
      n = next(v);
    }
    if (!n || !is(*n, "Softmax", 1)) continue;
    const int64_t axis = n->attr_int("axis", n->since_version < 13 ? 1 : -1);
    const ValueInfo* si = g.info(v);
    const int64_t rank = si && si->rank() >= 0 ? si->rank() : -1;
    if (axis != -1 && !(rank >= 1 && axis == rank - 1)) continue;  // (before opset 13 too: the last axis alone)
    taken.push_back(n->index);
    v = n->outputs[0];
    Node* last = next(v);
    if (!last || !is(*last, "MatMul", 2) || last->inputs[0] != v || last->inputs[1] == v) continue;
    // Each value the fused node reads must exist before it: Q, K^T and the bias come before the
    // first MatMul's readers, V before the last MatMul.
    last->inputs = {first.inputs[0], first.inputs[1], last->inputs[1], bias};
    Attribute a;
    a.type = AttrType::Floats;
    a.floats = {divide ? 1.f : 0.f, scale};
    // A Transpose [0, 2, 1, 3] alone reading the result (the heads put back beside each other,
    // before the output projection's Reshape) goes too: the fused node writes [B, S, N, Hv].
    Node* t = next(last->outputs[0]);
    if (t && is(*t, "Transpose", 1) && t->attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3}) {
      a.floats.push_back(1.f);
      last->outputs[0] = t->outputs[0];
      taken.push_back(t->index);
    }
    last->attrs[kMatMulAttention] = std::move(a);
    for (size_t i : taken) gone[i] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
