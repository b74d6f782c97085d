#include "partition/partition.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <unordered_map>

#include "ops/lowp.h"
#include "ops/registry.h"

namespace ortmlx::partition {

using graph::DType;

namespace {

// `lowp_ok`: the op opted in to float8/float4/int4/uint4 (OpEntry::lowp), held as bytes.
bool mlx_can_hold(DType t, bool gpu, bool lowp_ok = false) {
  if (lowp_ok && ops::lowp::is_lowp(t)) return true;
  if (t == DType::Float64) return !gpu;  // MLX rejects float64 on every GPU backend
  return ops::to_mlx_dtype(t).has_value();
}

std::string check_value(const graph::Graph& g, const std::string& name, bool gpu,
                        const char* role, size_t i, bool lowp_ok = false) {
  if (name.empty()) return {};
  auto where = std::string(role) + " " + std::to_string(i) + " '" + name + "'";
  if (auto* c = g.constant(name)) {
    if (!mlx_can_hold(c->dtype, gpu, lowp_ok))
      return where + " has dtype " + graph::dtype_name(c->dtype) + (gpu ? " (not on the GPU)" : "");
    return {};
  }
  auto* v = g.info(name);
  if (!v) return {};  // no static info: checked again at run time
  if (!v->is_tensor && v->kind != graph::ValueInfo::Kind::Tensor &&
      v->kind != graph::ValueInfo::Kind::Sequence)
    return where + " is not a tensor, a sequence of tensors or an optional of either (" +
           (v->kind == graph::ValueInfo::Kind::Map ? "a map" : "a nested container") + ")";
  if (v->dtype != DType::Undefined && !mlx_can_hold(v->dtype, gpu, lowp_ok))
    return where + " has dtype " + graph::dtype_name(v->dtype) +
           (gpu ? " (not on the GPU)" : " (no MLX dtype)");
  for (auto d : v->dims)
    if (d > INT32_MAX) return where + " has a dim over MLX's int32 limit";
  return {};
}

struct Bits {
  std::vector<uint64_t> w;
  explicit Bits(size_t n = 0) : w((n + 63) / 64, 0) {}
  void set(size_t i) { w[i >> 6] |= uint64_t{1} << (i & 63); }
  bool get(size_t i) const { return (w[i >> 6] >> (i & 63)) & 1; }
  void or_with(const Bits& o) {
    for (size_t i = 0; i < w.size(); ++i) w[i] |= o.w[i];
  }
};

}  // namespace

std::string check_node(const graph::Graph& g, const graph::Node& n, const Options& opt) {
  const auto* entry = ops::find_op(n.domain, n.op_type, n.since_version);
  if (!entry) {
    return "no MLX translator for " + (n.domain.empty() ? std::string("ai.onnx") : n.domain) +
           "." + n.op_type + " opset " + std::to_string(n.since_version);
  }
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (auto r = check_value(g, n.inputs[i], opt.gpu, "input", i, entry->lowp); !r.empty())
      return r;
  for (size_t i = 0; i < n.outputs.size(); ++i)
    if (auto r = check_value(g, n.outputs[i], opt.gpu, "output", i, entry->lowp); !r.empty())
      return r;
  if (entry->check) {
    ops::NodeQuery q{g, n, opt.gpu};
    auto s = entry->check(q);
    if (!s.ok) return s.reason.empty() ? "declined by the op's support check" : s.reason;
  }
  // A control-flow node is claimed whole, bodies included: every node inside must be
  // translatable (recursively, for nested bodies), and so must the values a body returns.
  for (const auto& [attr, body] : n.subgraphs()) {
    auto where = "subgraph '" + attr + "': ";
    for (size_t i = 0; i < body->inputs.size(); ++i)
      if (auto r = check_value(*body, body->inputs[i], opt.gpu, "input", i); !r.empty())
        return where + r;
    for (size_t i = 0; i < body->outputs.size(); ++i)
      if (auto r = check_value(*body, body->outputs[i], opt.gpu, "output", i); !r.empty())
        return where + r;
    for (const auto& inner : body->nodes)
      if (auto r = check_node(*body, inner, opt); !r.empty())
        return where + inner.describe() + ": " + r;
  }
  return {};
}

std::vector<std::vector<size_t>> convex_groups(const graph::Graph& g,
                                               const std::vector<bool>& claimed) {
  const size_t n = g.nodes.size();
  // Producer of each value, then data edges u -> v.
  std::unordered_map<std::string_view, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (auto& o : g.nodes[i].outputs)
      if (!o.empty()) producer.emplace(o, i);
  std::vector<std::vector<size_t>> succ(n), pred(n);
  auto add_edge = [&](const std::string& in, size_t v) {
    if (in.empty()) return;
    auto it = producer.find(in);
    if (it != producer.end() && it->second != v) {
      succ[it->second].push_back(v);
      pred[v].push_back(it->second);
    }
  };
  for (size_t v = 0; v < n; ++v) {
    for (auto& in : g.nodes[v].inputs) add_edge(in, v);
    // Values read inside an If/Loop/Scan body order the node just like explicit inputs.
    for (auto& in : g.nodes[v].implicit_inputs) add_edge(in, v);
  }
  // Kahn's order (ORT gives topological order, but do not rely on it).
  std::vector<size_t> indeg(n), order;
  order.reserve(n);
  for (size_t v = 0; v < n; ++v) indeg[v] = pred[v].size();
  for (size_t v = 0; v < n; ++v)
    if (!indeg[v]) order.push_back(v);
  for (size_t k = 0; k < order.size(); ++k)
    for (auto s : succ[order[k]])
      if (--indeg[s] == 0) order.push_back(s);
  if (order.size() != n) return {};  // a cycle: claim nothing rather than guess

  // Descendant and ancestor sets of every node.
  std::vector<Bits> desc(n, Bits(n)), anc(n, Bits(n));
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    for (auto s : succ[*it]) {
      desc[*it].set(s);
      desc[*it].or_with(desc[s]);
    }
  for (auto v : order)
    for (auto p : pred[v]) {
      anc[v].set(p);
      anc[v].or_with(anc[p]);
    }

  // Union-find over claimed nodes; each group keeps the union of its members' desc/anc sets.
  std::vector<size_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::vector<Bits> gdesc(n), ganc(n), members(n);
  for (size_t v = 0; v < n; ++v)
    if (claimed[v]) {
      gdesc[v] = desc[v];
      ganc[v] = anc[v];
      members[v] = Bits(n);
      members[v].set(v);
    }
  // A union is convex iff no node outside it is both a descendant and an ancestor of it.
  auto convex_union = [&](size_t a, size_t b) {
    for (size_t w = 0; w < gdesc[a].w.size(); ++w) {
      uint64_t between = (gdesc[a].w[w] | gdesc[b].w[w]) & (ganc[a].w[w] | ganc[b].w[w]);
      if (between & ~(members[a].w[w] | members[b].w[w])) return false;
    }
    return true;
  };
  auto try_merge = [&](size_t x, size_t y) {
    size_t a = find(x), b = find(y);
    if (a == b || !convex_union(a, b)) return;
    parent[b] = a;
    gdesc[a].or_with(gdesc[b]);
    ganc[a].or_with(ganc[b]);
    members[a].or_with(members[b]);
    gdesc[b] = ganc[b] = members[b] = Bits();
  };
  // First along data edges, then siblings that read the same value (fewer, larger groups).
  for (auto v : order) {
    if (!claimed[v]) continue;
    for (auto p : pred[v])
      if (claimed[p]) try_merge(p, v);
  }
  std::unordered_map<std::string_view, size_t> first_reader;
  for (auto v : order) {
    if (!claimed[v]) continue;
    for (auto& in : g.nodes[v].inputs) {
      if (in.empty()) continue;
      auto [it, fresh] = first_reader.emplace(in, v);
      if (!fresh) try_merge(it->second, v);
    }
  }

  std::unordered_map<size_t, size_t> group_of_root;
  std::vector<std::vector<size_t>> groups;
  for (auto v : order) {
    if (!claimed[v]) continue;
    auto r = find(v);
    auto [it, fresh] = group_of_root.emplace(r, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(v);
  }
  return groups;
}

namespace {

bool non_tensor(const graph::Graph& g, const std::string& name) {
  if (name.empty() || g.constant(name)) return false;
  const auto* v = g.info(name);
  return v && !v->is_tensor;
}

// ORT's kernel API gives a fused node tensor outputs only: a sequence or optional produced in a
// group must be consumed there. Returns the reason a node's non-tensor output escapes its group
// (another group, an ORT node, or a graph output), or "".
std::string escaping_output(const graph::Graph& g, size_t i, const std::vector<int>& group_of) {
  const graph::Node& n = g.nodes[i];
  for (const auto& o : n.outputs) {
    if (!non_tensor(g, o)) continue;
    const char* kind = g.info(o)->kind == graph::ValueInfo::Kind::Sequence ? "sequence"
                                                                            : "optional";
    if (std::find(g.outputs.begin(), g.outputs.end(), o) != g.outputs.end())
      return "output '" + o + "' is a " + kind +
             " and a graph output: a plugin EP's fused node can only return tensors";
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      const graph::Node& m = g.nodes[k];
      bool reads = std::find(m.inputs.begin(), m.inputs.end(), o) != m.inputs.end() ||
                   std::find(m.implicit_inputs.begin(), m.implicit_inputs.end(), o) !=
                       m.implicit_inputs.end();
      if (reads && group_of[k] != group_of[i])
        return "output '" + o + "' is a " + kind + " read by " + m.describe() +
               " outside the fused group: a plugin EP's fused node can only return tensors";
    }
  }
  return {};
}

}  // namespace

Result partition(const graph::Graph& g, const Options& opt) {
  Result r;
  std::vector<bool> claimed(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto reason = check_node(g, g.nodes[i], opt);
    if (reason.empty())
      claimed[i] = true;
    else
      r.declined.push_back({i, std::move(reason)});
  }
  // Group, then decline the producers of sequences/optionals that would leave their group, and
  // regroup: each round declines at least one node, so this ends.
  for (;;) {
    r.groups = convex_groups(g, claimed);
    std::vector<int> group_of(g.nodes.size(), -1);
    for (size_t k = 0; k < r.groups.size(); ++k)
      for (size_t i : r.groups[k]) group_of[i] = static_cast<int>(k);
    bool changed = false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (!claimed[i]) continue;
      if (auto why = escaping_output(g, i, group_of); !why.empty()) {
        claimed[i] = false;
        r.declined.push_back({i, std::move(why)});
        changed = true;
      }
    }
    if (!changed) break;
  }
  return r;
}

}  // namespace ortmlx::partition
