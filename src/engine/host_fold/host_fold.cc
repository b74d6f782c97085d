// Host folding of shape arithmetic: see host_fold.h. Values are held as int64 (every covered
// dtype fits), computed with ONNX's semantics (integer Div truncates toward zero, overflow wraps
// in the tensor's own width as ORT's kernels do), and wrapped back to their dtype at the end.
// Whatever is invalid (an index out of range, a division by zero, mismatched shapes) is not
// folded: the op's translator then fails with its usual message.
//
// Floating-point tensors are folded only while every value is an integer the dtype holds
// exactly (masks: 0, 1, -65504, -inf excluded). Then each op's exact result, when the dtype
// holds it, is what the float kernel computes too (it rounds the exact result, which needs no
// rounding); any result it does not hold exactly (an overflow, a fraction, a negative zero)
// refuses the fold, and MLX computes the node as before. This is what lets an exporter's
// additive attention bias, built from the mask's data in fp16, be known on the host in a decode
// step, where the attention ops drop it when it is all zeros (ops/contrib/attention.cc).
#include "engine/host_fold/host_fold.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "ops/op_context.h"

namespace ortmlx::ops {

namespace {

using Dims = std::vector<int64_t>;

struct Ints {
  std::vector<int64_t> v;
  Dims shape;
  mx::Dtype dtype = mx::int64;
};
using In = std::vector<std::optional<Ints>>;
using Folded = std::optional<Ints>;

bool is_float(mx::Dtype t) { return t == mx::float16 || t == mx::bfloat16 || t == mx::float32; }

bool covered(mx::Dtype t) {
  switch (t.val()) {
    case mx::Dtype::Val::float16:
    case mx::Dtype::Val::bfloat16:
    case mx::Dtype::Val::float32:
    case mx::Dtype::Val::bool_:
    case mx::Dtype::Val::int8:
    case mx::Dtype::Val::int16:
    case mx::Dtype::Val::int32:
    case mx::Dtype::Val::int64:
    case mx::Dtype::Val::uint8:
    case mx::Dtype::Val::uint16:
    case mx::Dtype::Val::uint32:
      return true;
    default:
      return false;  // float64, and uint64 (its upper half does not fit int64 comparisons)
  }
}

int64_t numel(const Dims& d) {
  return std::accumulate(d.begin(), d.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Whether the float dtype holds the integer x exactly (then a float kernel's result is x too).
bool exact_in(int64_t x, mx::Dtype t) {
  constexpr int64_t kExactDouble = int64_t{1} << 53;
  if (x > kExactDouble || x < -kExactDouble) return false;
  const auto f = static_cast<float>(x);
  if (static_cast<double>(f) != static_cast<double>(x)) return false;  // float32 rounds it
  if (t == mx::float16) return static_cast<float>(static_cast<mx::float16_t>(f)) == f;
  if (t == mx::bfloat16) return static_cast<float>(static_cast<mx::bfloat16_t>(f)) == f;
  return true;
}

// A float value as the integer it holds; nullopt for a fraction, an infinity or NaN, a magnitude
// beyond double's exact integers, or a negative zero (held as 0 it would lose its sign).
std::optional<int64_t> float_as_integer(double x) {
  if (!std::isfinite(x) || x != std::trunc(x) || std::abs(x) > 9007199254740992.0 || (x == 0 && std::signbit(x)))
    return std::nullopt;
  return static_cast<int64_t>(x);
}

std::optional<Ints> read(const mx::array& a) {
  if (!a.is_available() || !a.flags().row_contiguous || a.size() > kHostFoldMaxElements ||
      !covered(a.dtype()))
    return std::nullopt;
  Ints h;
  h.dtype = a.dtype();
  h.shape.assign(a.shape().begin(), a.shape().end());
  if (is_float(a.dtype())) {
    for (double x : evaluated_floats(a)) {
      auto i = float_as_integer(x);
      if (!i) return std::nullopt;
      h.v.push_back(*i);
    }
    return h;
  }
  h.v = evaluated_ints(a);
  return h;
}

// The value as the dtype stores it (two's complement wrap, as ORT's kernels overflow).
int64_t wrap(int64_t x, mx::Dtype t) {
  switch (t.val()) {
    case mx::Dtype::Val::bool_: return x != 0;
    case mx::Dtype::Val::int8: return static_cast<int8_t>(x);
    case mx::Dtype::Val::int16: return static_cast<int16_t>(x);
    case mx::Dtype::Val::int32: return static_cast<int32_t>(x);
    case mx::Dtype::Val::uint8: return static_cast<uint8_t>(x);
    case mx::Dtype::Val::uint16: return static_cast<uint16_t>(x);
    case mx::Dtype::Val::uint32: return static_cast<uint32_t>(x);
    default: return x;
  }
}

mx::array to_array(Ints h) {
  mx::Shape shape;
  for (int64_t d : h.shape) shape.push_back(static_cast<int>(d));
  if (is_float(h.dtype)) {  // exact_in held for every value (see elementwise)
    std::vector<float> f(h.v.begin(), h.v.end());
    return mx::array(f.begin(), std::move(shape), h.dtype);
  }
  for (auto& x : h.v) x = wrap(x, h.dtype);
  return mx::array(h.v.begin(), std::move(shape), h.dtype);
}

// A parameter input (axes, shape, indices, repeats) must be integer-typed.
bool int_param(const std::optional<Ints>& h) { return !h || !is_float(h->dtype); }

std::optional<int64_t> axis_in(int64_t a, int64_t rank) {
  if (a < 0) a += rank;
  if (a < 0 || a >= rank) return std::nullopt;
  return a;
}

bool scalar_like(const Ints& h) { return h.v.size() == 1; }

// ---- broadcasting ------------------------------------------------------------------------------

std::optional<Dims> broadcast(const std::vector<const Dims*>& shapes) {
  size_t r = 0;
  for (auto* s : shapes) r = std::max(r, s->size());
  Dims out(r, 1);
  for (auto* s : shapes)
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t d = (*s)[s->size() - 1 - i];
      int64_t& o = out[r - 1 - i];
      if (d == o || d == 1) continue;
      if (o != 1) return std::nullopt;
      o = d;
    }
  return out;
}

// a's values laid out over `out` (a broadcasts to it).
std::vector<int64_t> spread(const Ints& a, const Dims& out) {
  const size_t r = out.size(), n = static_cast<size_t>(numel(out));
  Dims strides(r, 0);
  int64_t st = 1;
  for (size_t i = 0; i < a.shape.size(); ++i) {
    const size_t ai = a.shape.size() - 1 - i, oi = r - 1 - i;
    strides[oi] = a.shape[ai] == 1 ? 0 : st;
    st *= a.shape[ai];
  }
  std::vector<int64_t> v(n);
  Dims idx(r, 0);
  for (size_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < r; ++i) off += idx[i] * strides[i];
    v[k] = a.v[static_cast<size_t>(off)];
    for (size_t i = r; i-- > 0;) {
      if (++idx[i] < out[i]) break;
      idx[i] = 0;
    }
  }
  return v;
}

// Elementwise over broadcast inputs; `f` returns nullopt to refuse (a zero divisor).
Folded elementwise(const std::vector<const Ints*>& xs, mx::Dtype out_dtype,
                   const std::function<std::optional<int64_t>(const std::vector<int64_t>&)>& f) {
  std::vector<const Dims*> shapes;
  for (auto* x : xs) shapes.push_back(&x->shape);
  auto out = broadcast(shapes);
  if (!out || static_cast<size_t>(numel(*out)) > kHostFoldMaxElements) return std::nullopt;
  std::vector<std::vector<int64_t>> vals;
  for (auto* x : xs) vals.push_back(spread(*x, *out));
  Ints r{{}, *out, out_dtype};
  r.v.resize(static_cast<size_t>(numel(*out)));
  std::vector<int64_t> args(xs.size());
  for (size_t k = 0; k < r.v.size(); ++k) {
    for (size_t j = 0; j < xs.size(); ++j) args[j] = vals[j][k];
    auto y = f(args);
    if (!y || (is_float(out_dtype) && !exact_in(*y, out_dtype))) return std::nullopt;
    r.v[k] = wrap(*y, out_dtype);
  }
  return r;
}

bool is_bool(const Ints& h) { return h.dtype == mx::bool_; }
bool is_signed(const Ints& h) { return mx::issubdtype(h.dtype, mx::signedinteger); }

// Wrapping integer arithmetic without signed-overflow UB (wrap() then narrows to the dtype).
int64_t add_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
int64_t sub_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
int64_t mul_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }

Folded arithmetic(const graph::Node& n, const In& in) {
  const Ints &a = *in[0], &b = *in[1];
  if (a.dtype != b.dtype || is_bool(a)) return std::nullopt;
  const std::string_view op = n.op_type;
  const mx::Dtype t = a.dtype;
  // Narrow dtypes compute in int64 and wrap; for Div the operands are already in range, so
  // truncation in int64 equals truncation in the narrow type (except MIN / -1, refused).
  if (is_float(t))  // exact integer results only (see the top of the file)
    return elementwise({&a, &b}, t, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
      int64_t y = 0;
      bool inexact = false;  // an int64 overflow, or a quotient with a fraction
      if (op == "Add") inexact = __builtin_add_overflow(x[0], x[1], &y);
      else if (op == "Sub") inexact = __builtin_sub_overflow(x[0], x[1], &y);
      else if (op == "Mul") inexact = __builtin_mul_overflow(x[0], x[1], &y);
      else if (x[1] == 0 || x[0] % x[1] != 0) inexact = true;  // Div
      else y = x[0] / x[1];
      if (inexact) return std::nullopt;
      // x + (-x) and x - x are +0 in IEEE arithmetic; a zero product or quotient with a
      // negative operand is -0, which an integer cannot hold.
      if (y == 0 && (op == "Mul" || op == "Div") && (x[0] < 0 || x[1] < 0)) return std::nullopt;
      return y;
    });
  return elementwise({&a, &b}, t, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "Add") return add_w(x[0], x[1]);
    if (op == "Sub") return sub_w(x[0], x[1]);
    if (op == "Mul") return mul_w(x[0], x[1]);
    if (x[1] == 0 || (x[1] == -1 && x[0] == INT64_MIN)) return std::nullopt;  // Div
    return x[0] / x[1];
  });
}

Folded min_max(const graph::Node& n, const In& in) {
  std::vector<const Ints*> xs;
  for (const auto& x : in) {
    if (!x || x->dtype != in[0]->dtype || is_bool(*x)) return std::nullopt;
    xs.push_back(&*x);
  }
  if (xs.empty()) return std::nullopt;
  const bool is_max = n.op_type == "Max";
  return elementwise(xs, xs[0]->dtype, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    return is_max ? *std::max_element(x.begin(), x.end()) : *std::min_element(x.begin(), x.end());
  });
}

Folded compare(const graph::Node& n, const In& in) {
  const Ints &a = *in[0], &b = *in[1];
  if (a.dtype != b.dtype) return std::nullopt;
  const std::string_view op = n.op_type;
  if (is_bool(a) && op != "Equal") return std::nullopt;
  return elementwise({&a, &b}, mx::bool_, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "Equal") return x[0] == x[1];
    if (op == "Less") return x[0] < x[1];
    if (op == "Greater") return x[0] > x[1];
    if (op == "LessOrEqual") return x[0] <= x[1];
    return x[0] >= x[1];  // GreaterOrEqual
  });
}

Folded logical(const graph::Node& n, const In& in) {
  const std::string_view op = n.op_type;
  if (op == "Not") {
    if (!is_bool(*in[0])) return std::nullopt;
    return elementwise({&*in[0]}, mx::bool_, [](const std::vector<int64_t>& x) -> std::optional<int64_t> { return !x[0]; });
  }
  const Ints &a = *in[0], &b = *in[1];
  if (!is_bool(a) || !is_bool(b)) return std::nullopt;
  return elementwise({&a, &b}, mx::bool_, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "And") return x[0] && x[1];
    if (op == "Or") return x[0] || x[1];
    return x[0] != x[1];  // Xor
  });
}

Folded unary(const graph::Node& n, const In& in) {
  const Ints& a = *in[0];
  if (is_bool(a)) return std::nullopt;
  if (n.op_type == "Neg") {
    if (is_float(a.dtype))  // -0 is refused (see Mul)
      return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> {
        if (x[0] == 0) return std::nullopt;
        return -x[0];
      });
    if (!is_signed(a)) return std::nullopt;
    return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> { return sub_w(0, x[0]); });
  }
  return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> {  // Abs
    return x[0] < 0 ? sub_w(0, x[0]) : x[0];
  });
}

Folded where(const graph::Node&, const In& in) {
  const Ints &c = *in[0], &x = *in[1], &y = *in[2];
  if (!is_bool(c) || x.dtype != y.dtype) return std::nullopt;
  return elementwise({&c, &x, &y}, x.dtype, [](const std::vector<int64_t>& v) -> std::optional<int64_t> {
    return v[0] ? v[1] : v[2];
  });
}

Folded cast(const graph::Node& n, const In& in) {
  auto to = to_mlx_dtype(static_cast<graph::DType>(n.attr_int("to", 0)));
  if (!to || !covered(*to)) return std::nullopt;
  Ints r = *in[0];
  const bool from_float = is_float(r.dtype);
  r.dtype = *to;
  for (auto& x : r.v) {
    if (is_float(*to)) {
      if (!exact_in(x, *to)) return std::nullopt;  // the cast would round
    } else if (from_float && *to != mx::bool_ && wrap(x, *to) != x) {
      return std::nullopt;  // out of the integer type's range: no defined result
    } else {
      x = wrap(x, *to);
    }
  }
  return r;
}

// ---- layout ops --------------------------------------------------------------------------------

Folded identity(const graph::Node&, const In& in) { return *in[0]; }

Folded reshaped(const Ints& a, Dims shape) {
  if (numel(shape) != static_cast<int64_t>(a.v.size())) return std::nullopt;
  Ints r = a;
  r.shape = std::move(shape);
  return r;
}

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

using FoldFn = Folded (*)(const graph::Node&, const In&);

const std::unordered_map<std::string_view, std::pair<FoldFn, size_t>>& table() {
  // op -> (fold, number of leading inputs that must be present)
  static const std::unordered_map<std::string_view, std::pair<FoldFn, size_t>> t = {
      {"Identity", {identity, 1}},     {"Unsqueeze", {unsqueeze, 1}},
      {"Squeeze", {squeeze, 1}},       {"Reshape", {reshape, 2}},
      {"Gather", {gather, 2}},         {"Concat", {concat, 1}},
      {"Cast", {cast, 1}},             {"Add", {arithmetic, 2}},
      {"Sub", {arithmetic, 2}},        {"Mul", {arithmetic, 2}},
      {"Div", {arithmetic, 2}},        {"Min", {min_max, 1}},
      {"Max", {min_max, 1}},           {"Neg", {unary, 1}},
      {"Abs", {unary, 1}},             {"Equal", {compare, 2}},
      {"Less", {compare, 2}},          {"Greater", {compare, 2}},
      {"LessOrEqual", {compare, 2}},   {"GreaterOrEqual", {compare, 2}},
      {"Not", {logical, 1}},           {"And", {logical, 2}},
      {"Or", {logical, 2}},            {"Xor", {logical, 2}},
      {"Where", {where, 3}},           {"Slice", {slice, 1}},
      {"Range", {range, 3}},           {"Expand", {expand, 2}},
      {"ConstantOfShape", {constant_of_shape, 1}},
      {"ReduceSum", {reduce_sum, 1}},
  };
  return t;
}

}  // namespace

bool host_foldable_op(const graph::Node& n) {
  return n.domain.empty() && table().count(n.op_type) != 0 && n.outputs.size() == 1;
}

std::optional<std::vector<mx::array>> fold_on_host(const graph::Node& n,
                                                   const std::vector<std::optional<mx::array>>& inputs) {
  if (!host_foldable_op(n)) return std::nullopt;
  const auto& [fold, required] = table().at(n.op_type);
  if (inputs.size() < required) return std::nullopt;
  In in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) {
      if (i < required) return std::nullopt;
      in.emplace_back();
      continue;
    }
    auto h = read(*inputs[i]);
    if (!h) return std::nullopt;
    in.push_back(std::move(h));
  }
  auto out = fold(n, in);
  if (!out || out->v.size() > kHostFoldMaxElements) return std::nullopt;
  return std::vector<mx::array>{to_array(std::move(*out))};
}

}  // namespace ortmlx::ops
