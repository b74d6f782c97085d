#include "graph/fuse_conv_activation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace ortmlx::graph {

namespace {

using Kind = ConvActivation::Kind;

constexpr std::pair<Kind, const char*> kNames[] = {
    {Kind::Relu, "Relu"},         {Kind::LeakyRelu, "LeakyRelu"}, {Kind::Clip, "Clip"},
    {Kind::Mul, "Mul"},           {Kind::Add, "Add"},             {Kind::HardSigmoid, "HardSigmoid"},
    {Kind::HardSwish, "HardSwish"}, {Kind::Sigmoid, "Sigmoid"},   {Kind::Tanh, "Tanh"},
    {Kind::Swish, "Swish"},       {Kind::AddInput, "AddInput"},
};

// The rewrite of one graph: who reads what, and which nodes are gone.
class Fuser {
 public:
  Fuser(Graph& g, const std::vector<std::string>& graph_outputs)
      : g_(g), uses_(g, graph_outputs), readers_(uses_.readers), producer_(uses_.producer), kept_(uses_.kept),
        gone_(g.nodes.size(), false) {}

  // Fuses the steps after `conv`; returns how many nodes went.
  int fuse(Node& conv) {
    const size_t max_rank = conv_rank(conv);
    std::vector<size_t> taken;
    const int folded = fold_channel_affine(conv, taken);
    std::string v = conv.outputs[0];
    std::vector<ConvActivation> steps;
    std::string residual;
    for (;;) {
      if (kept_.count(v)) break;
      const auto& r = readers(v);
      std::optional<std::string> next;
      if (r.size() == 1 && steps.empty() && residual.empty()) next = residual_add(conv, g_.nodes[r[0]], v, steps, taken, residual);
      if (!next && r.size() == 1) next = single(g_.nodes[r[0]], v, max_rank, steps, taken);
      if (r.size() == 2 && r[0] != r[1]) next = pair(g_.nodes[r[0]], g_.nodes[r[1]], v, max_rank, steps, taken);
      if (!next) break;
      v = *next;
    }
    for (size_t i : taken) gone_[i] = true;
    if (steps.empty()) return folded;
    conv.outputs[0] = v;
    if (!residual.empty()) {
      if (residual_free(conv, residual, taken)) {
        Attribute one;
        one.type = AttrType::Int;
        one.i = 1;
        conv.attrs[kConvResidualFree] = one;
      }
      conv.inputs.resize(3);  // (an absent bias stays "")
      conv.inputs.push_back(residual);
    }
    Attribute kinds, params;
    kinds.type = AttrType::Strings;
    params.type = AttrType::Floats;
    for (const auto& s : steps) {
      kinds.strings.push_back(activation_name(s.kind));
      params.floats.push_back(s.a);
      params.floats.push_back(s.b);
    }
    conv.attrs[kConvActivation] = std::move(kinds);
    conv.attrs[kConvActivationParams] = std::move(params);
    return static_cast<int>(taken.size());
  }

  const std::vector<bool>& gone() const { return gone_; }

 private:
  // The M per-channel values of a float constant that multiplies or adds to a Conv output of
  // rank `rank` without broadcasting it further: one element, or [.., M, 1.., 1] with the M on
  // the channel axis.
  std::optional<std::vector<double>> channel_values(const std::string& name, int64_t m, size_t rank) const {
    const ConstTensor* t = g_.constant(name);
    if (!t || !is_float(t->dtype) || t->transposed || t->shape.size() > rank) return std::nullopt;
    if (t->numel() == 1) return std::vector<double>(static_cast<size_t>(m), t->float_at(0));
    const size_t r = t->shape.size();
    if (r + 1 < rank || t->numel() != m) return std::nullopt;
    const size_t axis = r - (rank - 1);  // the channel axis, counted in t's own dims
    for (size_t d = 0; d < r; ++d)
      if (t->shape[d] != (d == axis ? m : 1)) return std::nullopt;
    return t->to_floats();
  }

  // BatchNormalization (inference, constant statistics), Mul and Add by per-channel constants
  // right after a Conv with a constant float32 weight go into a new weight and bias (y * s + t:
  // W * s per output channel, b * s + t), as ORT's Conv-BN, Conv-Mul and Conv-Add fusions do:
  // each would otherwise be a pass over the activations (or a reorder around a blocked output).
  // Returns how many nodes went (listed in `taken`).
  int fold_channel_affine(Node& conv, std::vector<size_t>& taken) {
    const ConstTensor* w = g_.constant(conv.inputs[1]);
    if (!w || w->dtype != DType::Float32 || w->transposed || w->shape.size() < 3 || w->shape[0] < 1) return 0;
    const ConstTensor* b = conv.has_input(2) ? g_.constant(conv.inputs[2]) : nullptr;
    if (conv.has_input(2) && (!b || b->dtype != DType::Float32 || b->numel() != w->shape[0])) return 0;
    const int64_t m = w->shape[0];
    const size_t rank = w->shape.size();
    std::vector<double> scale(static_cast<size_t>(m), 1.0), shift(static_cast<size_t>(m), 0.0);
    std::string v = conv.outputs[0];
    int folded = 0;
    for (;;) {
      const auto& r = readers(v);
      if (kept_.count(v) || r.size() != 1) break;
      const Node& n = g_.nodes[r[0]];
      if (is(n, "BatchNormalization", 5) && n.attr_int("training_mode", 0) == 0 && n.inputs[0] == v) {
        std::vector<std::vector<double>> p;  // scale, B, mean, var: [M] each
        for (size_t i = 1; i < 5; ++i)
          if (const ConstTensor* t = g_.constant(n.inputs[i]); t && is_float(t->dtype) && t->shape == std::vector<int64_t>{m})
            p.push_back(t->to_floats());
        if (p.size() != 4) break;
        const double eps = n.attr_float("epsilon", 1e-5f);
        for (size_t k = 0; k < scale.size(); ++k) {
          const double f = p[0][k] / std::sqrt(p[3][k] + eps);  // scale / sqrt(var + eps)
          scale[k] *= f;
          shift[k] = (shift[k] - p[2][k]) * f + p[1][k];
        }
      } else if (is(n, "Mul", 2) || is(n, "Add", 2)) {
        if (n.inputs[0] == n.inputs[1]) break;
        const std::string& other = n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
        auto c = channel_values(other, m, rank);
        if (!c) break;
        for (size_t k = 0; k < scale.size(); ++k) {
          if (n.op_type == "Mul") scale[k] *= (*c)[k], shift[k] *= (*c)[k];
          else shift[k] += (*c)[k];
        }
      } else {
        break;
      }
      taken.push_back(n.index);
      v = n.outputs[0];
      ++folded;
    }
    if (!folded) return 0;
    for (size_t k = 0; k < scale.size(); ++k)
      if (!std::isfinite(scale[k]) || !std::isfinite(shift[k])) {
        taken.resize(taken.size() - static_cast<size_t>(folded));
        return 0;
      }
    const int64_t per = w->numel() / m;
    std::vector<float> w2(static_cast<size_t>(w->numel())), b2(static_cast<size_t>(m));
    for (int64_t k = 0; k < m; ++k) {
      const double s = scale[static_cast<size_t>(k)];
      for (int64_t j = 0; j < per; ++j)
        w2[static_cast<size_t>(k * per + j)] = static_cast<float>(w->float_at(static_cast<size_t>(k * per + j)) * s);
      b2[static_cast<size_t>(k)] = static_cast<float>((b ? b->float_at(static_cast<size_t>(k)) : 0.0) * s +
                                                      shift[static_cast<size_t>(k)]);
    }
    // (named after the Conv's own output: node names may be empty or repeat, value names not)
    const std::string base = conv.outputs[0] + "/ortmlx_folded_affine";
    g_.constants[base + "/w"] = ConstTensor::from_bytes(DType::Float32, w->shape, w2.data(), w2.size() * sizeof(float));
    g_.constants[base + "/b"] = ConstTensor::from_bytes(DType::Float32, {m}, b2.data(), b2.size() * sizeof(float));
    conv.inputs.resize(std::max<size_t>(conv.inputs.size(), 3));
    conv.inputs[1] = base + "/w";
    conv.inputs[2] = base + "/b";
    conv.outputs[0] = v;
    return folded;
  }

  const std::vector<size_t>& readers(const std::string& v) const {
    static const std::vector<size_t> none;
    auto it = readers_.find(v);
    return it == readers_.end() ? none : it->second;
  }

  // A value that only `node` reads and that stays inside the fused Conv.
  bool only_read_by(const std::string& v, const Node& node) const {
    const auto& r = readers(v);
    return !kept_.count(v) && r.size() == 1 && r[0] == node.index;
  }

  static bool is(const Node& n, const char* op, size_t inputs) {
    return n.domain.empty() && n.op_type == op && n.inputs.size() == inputs && n.outputs.size() == 1 &&
           n.has_output(0);
  }

  // The Conv's rank, the most a scalar operand may have without changing the output's shape.
  size_t conv_rank(const Node& conv) const {
    if (auto* w = g_.constant(conv.inputs[1])) return w->shape.size();
    if (auto* vi = g_.info(conv.outputs[0]); vi && vi->rank() >= 0) return static_cast<size_t>(vi->rank());
    return 1;
  }

  // The value of a one-element float constant of at most `max_rank` dims.
  std::optional<float> scalar(const std::string& name, size_t max_rank) const {
    const ConstTensor* t = g_.constant(name);
    if (!t || !is_float(t->dtype) || t->numel() != 1 || t->shape.size() > max_rank) return std::nullopt;
    return static_cast<float>(t->float_at(0));
  }

  // The other operand of a two-input node that reads `v` once, as a scalar constant.
  std::optional<float> other_scalar(const Node& n, const std::string& v, size_t max_rank) const {
    if (n.inputs[0] == v && n.inputs[1] != v) return scalar(n.inputs[1], max_rank);
    if (n.inputs[1] == v && n.inputs[0] != v) return scalar(n.inputs[0], max_rank);
    return std::nullopt;
  }

  // Clip's bounds (attributes before opset 11, constant inputs since), when `n` is a Clip of `v`.
  std::optional<std::pair<float, float>> clip_bounds(const Node& n, const std::string& v, size_t max_rank) const {
    if (!n.domain.empty() || n.op_type != "Clip" || n.inputs.empty() || n.inputs[0] != v || n.outputs.size() != 1 ||
        !n.has_output(0))
      return std::nullopt;
    const float inf = std::numeric_limits<float>::infinity();
    if (n.since_version < 11) {
      if (n.inputs.size() != 1) return std::nullopt;
      return std::pair{n.attr_float("min", -inf), n.attr_float("max", inf)};
    }
    std::pair<float, float> b{-inf, inf};
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      if (!n.has_input(i)) continue;
      if (n.inputs[i] == v || i > 2) return std::nullopt;
      auto c = scalar(n.inputs[i], max_rank);
      if (!c) return std::nullopt;
      (i == 1 ? b.first : b.second) = *c;
    }
    return b;
  }

  // The residual Add after a Conv whose other operand exists before the Conv; its output is the
  // next value. The Conv: one of a single group with a constant float32 weight (oneDNN adds the
  // residual as its Sum post-op), or a grouped 1x1 (stride 1, no padding: the pointwise
  // kernel's convolutions).
  std::optional<std::string> residual_add(const Node& conv, const Node& n, const std::string& v,
                                          std::vector<ConvActivation>& steps, std::vector<size_t>& taken,
                                          std::string& residual) const {
    if (!(is(n, "Add", 2) || is(n, "Sum", 2)) || n.inputs[0] == n.inputs[1] || conv.inputs.size() > 3) return std::nullopt;
    const std::string& r = n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
    if (g_.constant(r)) return std::nullopt;  // (a constant's Add is a scalar step or nothing)
    if (auto p = producer_.find(r); p != producer_.end() && p->second >= conv.index) return std::nullopt;
    const ConstTensor* w = g_.constant(conv.inputs[1]);
    if (!w) return std::nullopt;
    const bool single_group = conv.attr_int("group", 1) == 1 && w->dtype == DType::Float32 && !w->transposed;
    if (!single_group && !pointwise_grouped(conv, *w)) return std::nullopt;
    steps.push_back({Kind::AddInput});
    taken.push_back(n.index);
    residual = r;
    return n.outputs[0];
  }

  // Whether the fused `conv` may write over `residual` (kConvResidualFree): produced by a node,
  // not kept, and read otherwise only by Convs `conv` depends on (`taken`: the fused nodes, the
  // residual's Add among them).
  bool residual_free(const Node& conv, const std::string& residual, const std::vector<size_t>& taken) const {
    if (kept_.count(residual) || !producer_.count(residual)) return false;
    for (size_t r : readers(residual)) {
      if (std::find(taken.begin(), taken.end(), r) != taken.end()) continue;
      const Node& n = g_.nodes[r];
      if (gone_[r] || !n.domain.empty() || n.op_type != "Conv" || !depends_on(conv, r)) return false;
    }
    return true;
  }

  // Whether node `target` is among the nodes whose outputs `n` reads, directly or through others
  // (nodes lie in topological order: none after `n`, none before `target`, is on the way).
  bool depends_on(const Node& n, size_t target) const {
    std::vector<size_t> stack{n.index};
    std::unordered_set<size_t> seen;
    while (!stack.empty()) {
      const Node& m = g_.nodes[stack.back()];
      stack.pop_back();
      auto visit = [&](const std::string& v) {
        auto p = producer_.find(v);
        if (p == producer_.end() || p->second < target || p->second >= m.index || !seen.insert(p->second).second) return;
        stack.push_back(p->second);
      };
      for (const auto& v : m.inputs)
        if (!v.empty()) visit(v);
      for (const auto& v : m.implicit_inputs) visit(v);
    }
    return seen.count(target) > 0;
  }

  // A grouped 1x1 Conv of stride 1 without padding.
  static bool pointwise_grouped(const Node& conv, const ConstTensor& w) {
    if (conv.attr_int("group", 1) < 2 || w.shape.size() != 4 || w.shape[2] != 1 || w.shape[3] != 1) return false;
    for (auto st : conv.attr_ints("strides"))
      if (st != 1) return false;
    for (auto pd : conv.attr_ints("pads"))
      if (pd != 0) return false;
    const std::string pad = conv.attr_string("auto_pad", "NOTSET");
    return pad == "NOTSET" || pad == "VALID";
  }

  // A step whose one node reads `v` alone; its output is the next value.
  std::optional<std::string> single(const Node& n, const std::string& v, size_t max_rank,
                                    std::vector<ConvActivation>& steps, std::vector<size_t>& taken) const {
    std::optional<ConvActivation> s;
    if (is(n, "Relu", 1)) s = ConvActivation{Kind::Relu};
    else if (is(n, "LeakyRelu", 1)) s = ConvActivation{Kind::LeakyRelu, n.attr_float("alpha", 0.01f)};
    else if (is(n, "Sigmoid", 1)) s = ConvActivation{Kind::Sigmoid};
    else if (is(n, "Tanh", 1)) s = ConvActivation{Kind::Tanh};
    else if (is(n, "HardSwish", 1)) s = ConvActivation{Kind::HardSwish};
    else if (is(n, "HardSigmoid", 1))
      s = ConvActivation{Kind::HardSigmoid, n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)};
    else if (is(n, "Mul", 2) || is(n, "Add", 2)) {
      if (auto c = other_scalar(n, v, max_rank)) s = ConvActivation{n.op_type == "Mul" ? Kind::Mul : Kind::Add, *c};
    } else if (auto b = clip_bounds(n, v, max_rank)) {
      s = ConvActivation{Kind::Clip, b->first, b->second};
    }
    if (!s) return std::nullopt;
    steps.push_back(*s);
    taken.push_back(n.index);
    return n.outputs[0];
  }

  // The Mul of `v` by `t`, in either order.
  static bool mul_of(const Node& m, const std::string& v, const std::string& t) {
    return is(m, "Mul", 2) && ((m.inputs[0] == v && m.inputs[1] == t) || (m.inputs[0] == t && m.inputs[1] == v));
  }

  // The single reader of `v` when it is a Div by the constant `d`.
  const Node* div_by(const std::string& v, float d, size_t max_rank) const {
    const auto& r = readers(v);
    if (kept_.count(v) || r.size() != 1) return nullptr;
    const Node& n = g_.nodes[r[0]];
    if (!is(n, "Div", 2) || n.inputs[0] != v) return nullptr;
    auto c = scalar(n.inputs[1], max_rank);
    return c && *c == d ? &n : nullptr;
  }

  // Steps whose two nodes read `v`: Mul(v, Sigmoid(v)) (Swish); Mul(v, HardSigmoid(v)) with
  // HardSwish's constants; v * Clip(v + 3, 0, 6) / 6 (HardSwish as exporters write it, the Div
  // after the Mul or before it).
  std::optional<std::string> pair(const Node& p, const Node& q, const std::string& v, size_t max_rank,
                                  std::vector<ConvActivation>& steps, std::vector<size_t>& taken) const {
    for (const auto* first : {&p, &q}) {
      const Node& f = *first;
      const Node& m = first == &p ? q : p;  // the Mul that reads v and what `f` leads to
      if (is(f, "Sigmoid", 1) && only_read_by(f.outputs[0], m) && mul_of(m, v, f.outputs[0])) {
        steps.push_back({Kind::Swish});
        taken.insert(taken.end(), {f.index, m.index});
        return m.outputs[0];
      }
      if (is(f, "HardSigmoid", 1) && f.attr_float("alpha", 0.2f) == 1.f / 6.f && f.attr_float("beta", 0.5f) == 0.5f &&
          only_read_by(f.outputs[0], m) && mul_of(m, v, f.outputs[0])) {
        steps.push_back({Kind::HardSwish});
        taken.insert(taken.end(), {f.index, m.index});
        return m.outputs[0];
      }
      // v + 3 -> Clip(0, 6) -> [/ 6] -> * v -> [/ 6]
      if (!is(f, "Add", 2) || other_scalar(f, v, max_rank) != 3.f) continue;
      const auto& ra = readers(f.outputs[0]);
      if (kept_.count(f.outputs[0]) || ra.size() != 1) continue;
      const Node& clip = g_.nodes[ra[0]];
      auto b = clip_bounds(clip, f.outputs[0], max_rank);
      if (!b || b->first != 0.f || b->second != 6.f) continue;
      const std::string& c = clip.outputs[0];
      if (const Node* d = div_by(c, 6.f, max_rank); d && only_read_by(d->outputs[0], m) && mul_of(m, v, d->outputs[0])) {
        steps.push_back({Kind::HardSwish});
        taken.insert(taken.end(), {f.index, clip.index, d->index, m.index});
        return m.outputs[0];
      }
      if (!only_read_by(c, m) || !mul_of(m, v, c)) continue;
      if (const Node* d = div_by(m.outputs[0], 6.f, max_rank)) {
        steps.push_back({Kind::HardSwish});
        taken.insert(taken.end(), {f.index, clip.index, m.index, d->index});
        return d->outputs[0];
      }
    }
    return std::nullopt;
  }

  Graph& g_;
  const ValueUses uses_;
  const std::unordered_map<std::string, std::vector<size_t>>& readers_;
  const std::unordered_map<std::string, size_t>& producer_;
  const std::unordered_set<std::string>& kept_;
  std::vector<bool> gone_;
};

}  // namespace

const char* activation_name(ConvActivation::Kind k) {
  for (const auto& [kind, name] : kNames)
    if (kind == k) return name;
  return "?";
}

std::vector<ConvActivation> conv_activations(const Node& conv) {
  std::vector<ConvActivation> out;
  const Attribute* kinds = conv.attr(kConvActivation);
  const Attribute* params = conv.attr(kConvActivationParams);
  if (!kinds || !params || params->floats.size() != 2 * kinds->strings.size()) return out;
  for (size_t i = 0; i < kinds->strings.size(); ++i) {
    ConvActivation s;
    bool known = false;
    for (const auto& [kind, name] : kNames)
      if (kinds->strings[i] == name) s.kind = kind, known = true;
    if (!known) throw std::invalid_argument("unknown fused activation '" + kinds->strings[i] + "'");
    s.a = params->floats[2 * i];
    s.b = params->floats[2 * i + 1];
    out.push_back(s);
  }
  return out;
}

int mark_blocked16_convs(Graph& g, const std::vector<std::string>& graph_outputs) {
  if (g.is_subgraph) return 0;
  // Whether a Conv reads what node `from` computes, through any nodes in between.
  const ValueUses uses(g, graph_outputs);
  auto feeds_a_conv = [&](size_t from) {
    std::vector<size_t> todo{from};
    std::vector<bool> seen(g.nodes.size(), false);
    while (!todo.empty()) {
      const Node& n = g.nodes[todo.back()];
      todo.pop_back();
      for (const auto& v : n.outputs) {
        auto it = uses.readers.find(v);
        if (v.empty() || it == uses.readers.end()) continue;
        for (size_t r : it->second) {
          if (seen[r]) continue;
          seen[r] = true;
          if (g.nodes[r].op_type == "Conv") return true;
          todo.push_back(r);
        }
      }
    }
    return false;
  };
  std::vector<Node*> convs;
  bool winograd = false;
  for (auto& n : g.nodes) {
    if (!(n.domain.empty() && n.op_type == "Conv")) continue;
    const ValueInfo* w = n.has_input(1) ? g.info(n.inputs[1]) : nullptr;
    if (!w || w->rank() != 4) return 0;
    const auto& d = w->dims;  // [M, C / group, kh, kw]
    const int64_t group = n.attr_int("group", 1);
    if (d[0] <= 0 || d[1] <= 0 || (d[1] % 16 && !(group == 1 && d[1] < 16))) return 0;
    if (group > 1 && (d[0] / group) % 16) return 0;
    // Other output channels only where no convolution comes after (a classifier's): its input
    // is read in blocks of 16, its output reordered once.
    if (d[0] % 16 && feeds_a_conv(n.index)) return 0;
    const auto ones = std::vector<int64_t>{1, 1};
    winograd = winograd || (group == 1 && d[1] % 16 == 0 && d[2] == 3 && d[3] == 3 &&
                            n.attr_ints("strides", ones) == ones && n.attr_ints("dilations", ones) == ones);
    convs.push_back(&n);
  }
  if (!winograd) return 0;
  Attribute one;
  one.type = AttrType::Int;
  one.i = 1;
  for (Node* n : convs) n->attrs[kConvBlocked16] = one;
  for (auto& n : g.nodes) {
    if (!(n.domain.empty() && n.op_type == "Concat") || n.inputs.size() < 2 || n.attr_int("axis", 0) != 1) continue;
    const bool of_convs = std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& v) {
      auto p = uses.producer.find(v);
      auto r = uses.readers.find(v);
      return !v.empty() && p != uses.producer.end() && g.nodes[p->second].op_type == "Conv" && !uses.kept.count(v) &&
             r != uses.readers.end() && r->second.size() == 1;
    });
    if (of_convs) n.attrs[kConcatOfConvs] = one;
  }
  return static_cast<int>(convs.size());
}

int fuse_conv_activation(Graph& g, const std::vector<std::string>& graph_outputs) {
  Fuser f(g, graph_outputs);
  int done = 0;
  for (auto& n : g.nodes)
    if (n.domain.empty() && n.op_type == "Conv" && n.inputs.size() >= 2 && n.outputs.size() == 1 && n.has_output(0) &&
        !n.has_attr(kConvActivation) && !f.gone()[n.index])
      done += f.fuse(n);
  if (done) erase_nodes(g, f.gone());
  return done;
}

}  // namespace ortmlx::graph
