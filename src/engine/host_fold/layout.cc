// Layout and generator folds (folds.h): Identity, Unsqueeze, Squeeze, Reshape, Gather, Concat,
// Slice, ReduceSum, Range, Expand, ConstantOfShape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>

#include "engine/host_fold/folds.h"
#include "ops/op_context.h"

namespace ortmlx::ops::host_fold {

Folded identity(const graph::Node&, const In& in) { return *in[0]; }

namespace {

Folded reshaped(const Ints& a, Dims shape) {
  if (numel(shape) != static_cast<int64_t>(a.v.size())) return std::nullopt;
  Ints r = a;
  r.shape = std::move(shape);
  return r;
}

}  // namespace

Folded unsqueeze(const graph::Node& n, const In& in) {
  if (n.since_version >= 13 && (in.size() < 2 || !in[1])) return std::nullopt;  // axes required
  if (n.since_version >= 13 && !int_param(in[1])) return std::nullopt;
  Dims axes = n.since_version < 13 ? n.attr_ints("axes") : in[1]->v;
  const Ints& a = *in[0];
  const int64_t r = static_cast<int64_t>(a.shape.size() + axes.size());
  std::vector<bool> added(static_cast<size_t>(r), false);
  for (int64_t ax : axes) {
    auto k = axis_in(ax, r);
    if (!k || added[*k]) return std::nullopt;
    added[*k] = true;
  }
  Dims out;
  size_t next = 0;
  for (int64_t i = 0; i < r; ++i) out.push_back(added[i] ? 1 : a.shape[next++]);
  return reshaped(a, out);
}

Folded squeeze(const graph::Node& n, const In& in) {
  const Ints& a = *in[0];
  const int64_t r = static_cast<int64_t>(a.shape.size());
  std::optional<Dims> axes;
  if (n.since_version < 13) {
    if (n.has_attr("axes")) axes = n.attr_ints("axes");
  } else if (in.size() > 1 && in[1]) {
    if (!int_param(in[1])) return std::nullopt;
    axes = in[1]->v;
  }
  std::vector<bool> drop(static_cast<size_t>(r), false);
  if (!axes) {
    for (int64_t i = 0; i < r; ++i) drop[i] = a.shape[i] == 1;
  } else {
    for (int64_t ax : *axes) {
      auto k = axis_in(ax, r);
      if (!k || a.shape[*k] != 1) return std::nullopt;
      drop[*k] = true;
    }
  }
  Dims out;
  for (int64_t i = 0; i < r; ++i)
    if (!drop[i]) out.push_back(a.shape[i]);
  return reshaped(a, out);
}

Folded reshape(const graph::Node& n, const In& in) {
  if (n.since_version < 5 || in.size() < 2 || !in[1] || !int_param(in[1])) return std::nullopt;
  const Ints& a = *in[0];
  const bool allowzero = n.attr_int("allowzero", 0) != 0;
  Dims out = in[1]->v;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0 && !allowzero) {
      if (i >= a.shape.size()) return std::nullopt;
      out[i] = a.shape[i];
    }
    if (out[i] == -1) {
      if (infer >= 0) return std::nullopt;
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      return std::nullopt;
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || static_cast<int64_t>(a.v.size()) % known != 0) return std::nullopt;
    out[infer] = static_cast<int64_t>(a.v.size()) / known;
  }
  return reshaped(a, out);
}

Folded gather(const graph::Node& n, const In& in) {
  const Ints &data = *in[0], &idx = *in[1];
  if (is_bool(idx) || !int_param(in[1])) return std::nullopt;
  const int64_t r = static_cast<int64_t>(data.shape.size());
  auto axis = axis_in(n.attr_int("axis", 0), r);
  if (!axis) return std::nullopt;
  const int64_t dim = data.shape[*axis];
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < *axis; ++i) outer *= data.shape[i];
  for (int64_t i = *axis + 1; i < r; ++i) inner *= data.shape[i];
  Dims out(data.shape.begin(), data.shape.begin() + *axis);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), data.shape.begin() + *axis + 1, data.shape.end());
  if (static_cast<size_t>(numel(out)) > kHostFoldMaxElements) return std::nullopt;
  Ints res{{}, out, data.dtype};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j : idx.v) {
      if (j < 0) j += dim;
      if (j < 0 || j >= dim) return std::nullopt;
      for (int64_t i = 0; i < inner; ++i) res.v.push_back(data.v[static_cast<size_t>((o * dim + j) * inner + i)]);
    }
  return res;
}

Folded concat(const graph::Node& n, const In& in) {
  std::vector<const Ints*> xs;
  for (const auto& x : in) {
    if (!x) return std::nullopt;
    xs.push_back(&*x);
  }
  if (xs.empty()) return std::nullopt;
  const int64_t r = static_cast<int64_t>(xs[0]->shape.size());
  auto axis = axis_in(n.attr_int("axis", 0), r);
  if (!axis) return std::nullopt;
  Dims out = xs[0]->shape;
  out[*axis] = 0;
  for (auto* x : xs) {
    if (x->dtype != xs[0]->dtype || static_cast<int64_t>(x->shape.size()) != r) return std::nullopt;
    for (int64_t i = 0; i < r; ++i)
      if (i != *axis && x->shape[i] != out[i]) return std::nullopt;
    out[*axis] += x->shape[*axis];
  }
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < *axis; ++i) outer *= out[i];
  for (int64_t i = *axis + 1; i < r; ++i) inner *= out[i];
  Ints res{{}, out, xs[0]->dtype};
  for (int64_t o = 0; o < outer; ++o)
    for (auto* x : xs) {
      const int64_t chunk = x->shape[*axis] * inner;
      res.v.insert(res.v.end(), x->v.begin() + o * chunk, x->v.begin() + (o + 1) * chunk);
    }
  return res;
}

Folded slice(const graph::Node& n, const In& in) {
  const Ints& a = *in[0];
  const int64_t r = static_cast<int64_t>(a.shape.size());
  Dims starts, ends, axes, steps;
  if (n.since_version < 10) {
    starts = n.attr_ints("starts");
    ends = n.attr_ints("ends");
    axes = n.attr_ints("axes");
  } else {
    if (in.size() < 3 || !in[1] || !in[2]) return std::nullopt;
    for (size_t i = 1; i < in.size(); ++i)
      if (!int_param(in[i])) return std::nullopt;
    starts = in[1]->v;
    ends = in[2]->v;
    if (in.size() > 3 && in[3]) axes = in[3]->v;
    if (in.size() > 4 && in[4]) steps = in[4]->v;
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return std::nullopt;
  Dims begin(r, 0), step(r, 1), count = a.shape;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto k = axis_in(axes[i], r);
    if (!k || seen[*k] || steps[i] == 0) return std::nullopt;
    seen[*k] = true;
    const int64_t d = a.shape[*k], st = steps[i];
    int64_t s = starts[i], e = ends[i];
    if (d == 0) {  // nothing to take (and the clamps below need d >= 1)
      count[*k] = 0;
      continue;
    }
    if (s < 0) s += d;
    if (e < 0) e += d;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      count[*k] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      count[*k] = s > e ? (s - e - st - 1) / -st : 0;
    }
    begin[*k] = s;
    step[*k] = st;
  }
  Dims in_strides(r, 1);
  for (int64_t i = r - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * a.shape[i];
  Ints res{{}, count, a.dtype};
  const int64_t n_out = numel(count);
  Dims idx(r, 0);
  for (int64_t k = 0; k < n_out; ++k) {
    int64_t off = 0;
    for (int64_t i = 0; i < r; ++i) off += (begin[i] + idx[i] * step[i]) * in_strides[i];
    res.v.push_back(a.v[static_cast<size_t>(off)]);
    for (int64_t i = r; i-- > 0;) {
      if (++idx[i] < count[i]) break;
      idx[i] = 0;
    }
  }
  return res;
}

// ReduceSum over integers (a mask's length: ReduceSum(attention_mask) - 1 is GroupQueryAttention's
// seqlens_k in the genai decoders).
Folded reduce_sum(const graph::Node& n, const In& in) {
  const Ints& a = *in[0];
  // Floats: the kernel's order of additions could round a partial sum; not folded.
  if (is_bool(a) || is_float(a.dtype) || !int_param(in.size() > 1 ? in[1] : std::nullopt)) return std::nullopt;
  const int64_t r = static_cast<int64_t>(a.shape.size());
  Dims raw;
  bool noop = false;
  if (n.since_version >= 13) {
    if (in.size() > 1 && in[1]) raw = in[1]->v;
    noop = n.attr_int("noop_with_empty_axes", 0) != 0;
  } else {
    raw = n.attr_ints("axes");
  }
  if (r == 0 || (raw.empty() && noop)) return a;  // a sum over no axes is the identity
  std::vector<bool> reduced(static_cast<size_t>(r), raw.empty());
  for (int64_t ax : raw) {
    auto k = axis_in(ax, r);
    if (!k) return std::nullopt;
    reduced[*k] = true;  // a repeated axis counts once, as ORT takes it
  }
  const bool keep = n.attr_int("keepdims", 1) != 0;
  Dims out;
  for (int64_t i = 0; i < r; ++i) {
    if (!reduced[i]) out.push_back(a.shape[i]);
    else if (keep) out.push_back(1);
  }
  // Each input element adds into the output element of its index without the reduced axes.
  Dims out_stride(static_cast<size_t>(r), 0);
  int64_t st = 1;
  for (int64_t i = r; i-- > 0;)
    if (!reduced[i]) out_stride[i] = st, st *= a.shape[i];
  Ints res{std::vector<int64_t>(static_cast<size_t>(numel(out)), 0), out, a.dtype};
  Dims idx(static_cast<size_t>(r), 0);
  for (size_t k = 0; k < a.v.size(); ++k) {
    int64_t o = 0;
    for (int64_t i = 0; i < r; ++i) o += idx[i] * out_stride[i];
    res.v[static_cast<size_t>(o)] = add_w(res.v[static_cast<size_t>(o)], a.v[k]);
    for (int64_t i = r; i-- > 0;) {
      if (++idx[i] < a.shape[i]) break;
      idx[i] = 0;
    }
  }
  return res;
}

Folded range(const graph::Node&, const In& in) {
  const Ints &a = *in[0], &b = *in[1], &c = *in[2];
  if (!scalar_like(a) || !scalar_like(b) || !scalar_like(c) || is_bool(a) || a.dtype != b.dtype ||
      a.dtype != c.dtype)
    return std::nullopt;
  const int64_t start = a.v[0], limit = b.v[0], delta = c.v[0];
  if (delta == 0) return std::nullopt;
  const int64_t diff = limit - start;
  int64_t n = 0;
  if (delta > 0 && diff > 0) n = (diff + delta - 1) / delta;
  if (delta < 0 && diff < 0) n = (-diff + -delta - 1) / -delta;
  if (static_cast<size_t>(n) > kHostFoldMaxElements) return std::nullopt;
  Ints res{{}, {n}, a.dtype};
  for (int64_t i = 0; i < n; ++i) {
    res.v.push_back(start + i * delta);  // |values| <= max(|start|, |limit|) + |delta|
    if (is_float(a.dtype) && !exact_in(res.v.back(), a.dtype)) return std::nullopt;
  }
  return res;
}

Folded expand(const graph::Node&, const In& in) {
  if (!int_param(in[1])) return std::nullopt;
  const Ints& a = *in[0];
  auto out = broadcast({&a.shape, &in[1]->v});
  if (!out || static_cast<size_t>(numel(*out)) > kHostFoldMaxElements) return std::nullopt;
  return Ints{spread(a, *out), *out, a.dtype};
}

Folded constant_of_shape(const graph::Node& n, const In& in) {
  if (!int_param(in[0])) return std::nullopt;
  const Dims& shape = in[0]->v;
  for (int64_t d : shape)
    if (d < 0) return std::nullopt;
  if (static_cast<size_t>(numel(shape)) > kHostFoldMaxElements) return std::nullopt;
  const graph::Attribute* value = n.attr("value");
  if (!value || !value->t || value->t->numel() != 1) return std::nullopt;  // float32 0 by default
  auto t = to_mlx_dtype(value->t->dtype);
  if (!t || !covered(*t)) return std::nullopt;
  if (is_float(*t)) {
    auto x = float_as_integer(value->t->float_at(0));
    if (!x || !exact_in(*x, *t)) return std::nullopt;
    return Ints{std::vector<int64_t>(static_cast<size_t>(numel(shape)), *x), shape, *t};
  }
  return Ints{std::vector<int64_t>(static_cast<size_t>(numel(shape)), wrap(value->t->int_at(0), *t)), shape, *t};
}

}  // namespace ortmlx::ops::host_fold
