// The host folder's values (folds.h): reading an evaluated array, wrapping to a dtype,
// broadcasting elementwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>

#include "engine/host_fold/folds.h"
#include "ops/op_context.h"

namespace ortmlx::ops::host_fold {

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

}  // namespace ortmlx::ops::host_fold
