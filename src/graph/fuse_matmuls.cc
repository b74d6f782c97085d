#include "graph/fuse_matmuls.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/fuse_matmul_bias.h"

namespace ortmlx::graph {

namespace {

// The per-N width of a constant laid out N-major (its bytes divide into n equal rows), or 0.
size_t row_bytes(const ConstTensor& t, int64_t n) {
  if (n <= 0 || !t.data || t.nbytes % static_cast<size_t>(n) != 0) return 0;
  return t.nbytes / static_cast<size_t>(n);
}

// What must agree for two nodes to share one product (beyond reading the same input).
std::string group_key(const Graph& g, const Node& n) {
  if (n.domain.empty() && n.op_type == "MatMul") {
    // A fused bias (graph/fuse_matmul_bias.h) is concatenated like the weights: every member
    // of such a group has one.
    const bool bias = n.has_attr(kMatMulBias);
    if (n.inputs.size() != (bias ? 3u : 2u) || !n.has_input(0) || !n.has_input(1) || g.constant(n.inputs[0]))
      return {};
    const auto* w = g.constant(n.inputs[1]);
    if (!w || w->shape.size() != 2 || !is_float(w->dtype) || w->shape[0] <= 0 || w->shape[1] <= 0 ||
        !w->data)
      return {};
    if (bias && !g.constant(n.inputs[2])) return {};  // ([N], B's dtype: fuse_matmul_bias checked)
    return std::string(bias ? "mmb|" : "mm|") + n.inputs[0] + "|" + std::to_string(static_cast<int>(w->dtype)) + "|" +
           std::to_string(w->shape[0]);
  }
  if (n.domain == "com.microsoft" && n.op_type == "MatMulNBits") {
    if (!n.has_input(0) || !n.has_input(1) || !n.has_input(2) || g.constant(n.inputs[0])) return {};
    if (n.has_input(4) || n.attr_int("weight_prepacked", 0) != 0) return {};  // g_idx: K-ordered
    const int64_t N = n.attr_int("N", 0);
    std::string key = "nb|" + n.inputs[0];
    for (const char* a : {"K", "bits", "block_size", "accuracy_level"})
      key += "|" + std::to_string(n.attr_int(a, -1));
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (!n.has_input(i)) {
        key += "|-";
        continue;
      }
      const auto* c = g.constant(n.inputs[i]);
      const size_t row = c ? row_bytes(*c, N) : 0;
      if (!row) return {};
      key += "|" + std::to_string(static_cast<int>(c->dtype)) + ":" + std::to_string(row);
    }
    return key;
  }
  return {};
}

int64_t n_of(const Graph& g, const Node& n) {
  return n.op_type == "MatMul" ? g.constant(n.inputs[1])->shape[1] : n.attr_int("N", 0);
}

// The constants of input `i` of `nodes`, concatenated along N.
ConstTensor concat_n(const Graph& g, const std::vector<const Node*>& nodes, size_t i, bool dense) {
  const auto* first = g.constant(nodes[0]->inputs[i]);
  int64_t total = 0;
  size_t bytes = 0;
  for (const auto* n : nodes) {
    total += n_of(g, *n);
    bytes += g.constant(n->inputs[i])->nbytes;
  }
  ConstTensor t;
  t.dtype = first->dtype;
  auto buf = std::make_shared<std::vector<std::byte>>(bytes);
  std::byte* out = buf->data();
  if (dense) {
    // [K, N_j] row-major: row k of the result is row k of every weight in turn.
    const int64_t K = first->shape[0];
    const size_t es = dtype_size(first->dtype);
    for (int64_t k = 0; k < K; ++k)
      for (const auto* n : nodes) {
        const auto* w = g.constant(n->inputs[i]);
        const size_t row = static_cast<size_t>(w->shape[1]) * es;
        std::memcpy(out, static_cast<const std::byte*>(w->data) + static_cast<size_t>(k) * row, row);
        out += row;
      }
    t.shape = {K, total};
  } else {
    for (const auto* n : nodes) {
      const auto* c = g.constant(n->inputs[i]);
      std::memcpy(out, c->data, c->nbytes);
      out += c->nbytes;
    }
    t.shape = first->shape;
    t.shape[0] = first->shape.size() == 1 ? static_cast<int64_t>(first->shape[0] / n_of(g, *nodes[0]) * total)
                                          : total;
  }
  t.data = buf->data();
  t.nbytes = bytes;
  t.owned = std::move(buf);
  return t;
}

}  // namespace

int fuse_sibling_matmuls(Graph& g) {
  // Groups by key, in the order of their first member.
  std::unordered_map<std::string, std::vector<size_t>> groups;
  std::vector<std::string> order;
  std::unordered_map<std::string, int> readers;  // how many nodes read each value
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs) readers[in]++;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto key = group_key(g, g.nodes[i]);
    if (key.empty()) continue;
    // A weight another node also reads stays where it is (it would be held twice).
    if (readers[g.nodes[i].inputs[1]] != 1) continue;
    auto [it, fresh] = groups.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(i);
  }
  int fused = 0;
  std::vector<bool> drop(g.nodes.size(), false);
  std::unordered_map<size_t, std::vector<Node>> replace;  // first member -> its replacement
  for (const auto& key : order) {
    const auto& idx = groups[key];
    if (idx.size() < 2) continue;
    std::vector<const Node*> nodes;
    for (auto i : idx) nodes.push_back(&g.nodes[i]);
    const Node& first = *nodes[0];
    const bool dense = first.op_type == "MatMul";
    const std::string base = first.name + "/ortmlx_fused_siblings";
    Node product = first;
    product.name = base;
    product.outputs = {base + "/out"};
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (const auto* n : nodes) {
      sizes.push_back(n_of(g, *n));
      total += sizes.back();
    }
    for (size_t i = 1; i < first.inputs.size(); ++i) {
      if (!first.has_input(i)) continue;
      auto name = base + "/in" + std::to_string(i);
      g.constants[name] = concat_n(g, nodes, i, dense && i == 1);  // (a MatMul's bias: 1-D)
      product.inputs[i] = name;
    }
    if (!dense) product.attrs["N"].i = total;
    Node split;
    split.name = base + "/split";
    split.op_type = "Split";
    split.since_version = 11;  // sizes as an attribute
    split.inputs = {product.outputs[0]};
    for (const auto* n : nodes) split.outputs.push_back(n->outputs[0]);
    auto& axis = split.attrs["axis"];
    axis.type = AttrType::Int;
    axis.i = -1;
    auto& split_sizes = split.attrs["split"];
    split_sizes.type = AttrType::Ints;
    split_sizes.ints = sizes;
    // The product's value: the first output's info with N columns.
    if (const auto* vi = g.info(first.outputs[0])) {
      ValueInfo v = *vi;
      v.name = product.outputs[0];
      if (v.has_shape && !v.dims.empty()) v.dims.back() = total;
      if (!v.dim_names.empty()) v.dim_names.back().clear();
      g.values[v.name] = std::move(v);
    }
    for (auto i : idx) drop[i] = true;
    replace[idx[0]] = {std::move(product), std::move(split)};
    ++fused;
  }
  if (!fused) return 0;
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = replace.find(i); it != replace.end())
      for (auto& n : it->second) nodes.push_back(std::move(n));
    else if (!drop[i])
      nodes.push_back(std::move(g.nodes[i]));
  }
  for (size_t i = 0; i < nodes.size(); ++i) nodes[i].index = i;
  g.nodes = std::move(nodes);
  return fused;
}

}  // namespace ortmlx::graph
