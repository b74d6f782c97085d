#include "graph/fuse_swiglu.h"

namespace ortmlx::graph {

int fuse_swiglu(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  auto plain = [](const Node& n, const char* op, size_t inputs) {
    return n.domain.empty() && n.op_type == op && n.inputs.size() == inputs && n.outputs.size() == 1 &&
           n.has_output(0) && n.has_input(0) && (inputs < 2 || n.has_input(1)) && !n.attrs.count(kMulSwiGlu);
  };
  auto float32 = [&](const std::string& v) {
    const ValueInfo* vi = g.info(v);
    return vi && vi->dtype == DType::Float32;
  };
  std::vector<bool> gone(g.nodes.size(), false);
  int done = 0;
  for (auto& sig : g.nodes) {
    if (!plain(sig, "Sigmoid", 1) || gone[sig.index]) continue;
    const std::string& gate = sig.inputs[0];
    Node* silu = uses.only_reader(g, sig.outputs[0]);
    if (!silu || !plain(*silu, "Mul", 2)) continue;
    const bool gate_first = silu->inputs[0] == gate && silu->inputs[1] == sig.outputs[0];
    if (!gate_first && !(silu->inputs[1] == gate && silu->inputs[0] == sig.outputs[0])) continue;
    Node* last = uses.only_reader(g, silu->outputs[0]);
    if (!last || !plain(*last, "Mul", 2) || last->inputs[0] == last->inputs[1]) continue;
    const std::string& up = last->inputs[0] == silu->outputs[0] ? last->inputs[1] : last->inputs[0];
    if (!float32(gate) || !float32(up) || !float32(last->outputs[0])) continue;
    last->inputs = {gate, up};
    Attribute mark;
    mark.type = AttrType::Int;
    mark.i = 1;
    last->attrs[kMulSwiGlu] = std::move(mark);
    gone[sig.index] = gone[silu->index] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
