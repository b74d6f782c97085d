#include "graph/fuse_matmul_bias.h"

#include <algorithm>
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

int fuse_matmul_gelu(Graph& g, const std::vector<std::string>& graph_outputs) {
  const ValueUses uses(g, graph_outputs);
  std::vector<bool> gone(g.nodes.size(), false);
  auto is_gelu = [](const Node* n) {
    return n && n->domain == "com.microsoft" && n->op_type == "Gelu" && n->inputs.size() == 1 && n->outputs.size() == 1 &&
           n->has_output(0);
  };
  int done = 0;
  for (auto& mm : g.nodes) {
    // A MatMul (its bias fused or not) or a Gemm, with no other mark of the EP's.
    const bool matmul = mm.op_type == "MatMul";
    if (!mm.domain.empty() || (!matmul && mm.op_type != "Gemm") || mm.outputs.size() != 1 || !mm.has_output(0) ||
        mm.inputs.size() < 2 || (matmul && mm.inputs.size() != (mm.has_attr(kMatMulBias) ? 3u : 2u)))
      continue;
    if (std::any_of(mm.attrs.begin(), mm.attrs.end(), [](const auto& a) {
          return !a.first.empty() && a.first[0] == '_' && a.first != kMatMulBias;
        }))
      continue;
    const ConstTensor* w = g.constant(mm.inputs[1]);
    if (!w || w->dtype != DType::Float32 || w->shape.size() != 2) continue;
    // The Gelu reads the product, or a Reshape of it (ORT writes a MatMul and Add of 3-D rows as
    // a Gemm between Reshapes): an elementwise map commutes with the Reshape, which then takes
    // the Gelu's output.
    Node* reader = uses.only_reader(g, mm.outputs[0]);
    Node* reshape = reader && reader->domain.empty() && reader->op_type == "Reshape" ? reader : nullptr;
    const Node* gelu = reshape ? uses.only_reader(g, reshape->outputs[0]) : reader;
    if (!is_gelu(gelu) || (reshape && (reshape->outputs.size() != 1 || reshape->inputs[0] != mm.outputs[0]))) continue;
    if (reshape)
      reshape->outputs[0] = gelu->outputs[0];
    else
      mm.outputs[0] = gelu->outputs[0];
    mm.attrs[kMatMulGelu] = Attribute{};
    mm.attrs[kMatMulGelu].type = AttrType::Int;
    mm.attrs[kMatMulGelu].i = 1;
    gone[gelu->index] = true;
    ++done;
  }
  if (done) erase_nodes(g, gone);
  return done;
}

}  // namespace ortmlx::graph
