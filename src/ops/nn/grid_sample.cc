// GridSample (opset 16+): samples x (N, C, D1..Dn) at the normalized locations of grid
// (N, O1..On, n), whose last axis lists the coordinates innermost dim first (x, y, z).
//
// The grid is run-time data, so everything is graph ops: per spatial dim the sample position
// is denormalized and split into taps (1 for nearest, 2 for linear, 4 for cubic) with weights;
// every combination of taps is gathered from x flattened to (N, C, prod(D)) and accumulated.
// Padding is applied per tap exactly as ORT's CPU kernel does: zeros drops taps outside the
// input, border clamps them, reflection mirrors the tap position at the borders.
#include <optional>
#include <string>
#include <utility>

#include "ops/nn/nn_internal.h"

namespace ortmlx::ops::nn {

namespace {

enum class GsMode { Nearest, Linear, Cubic };
enum class GsPad { Zeros, Border, Reflection };

std::optional<GsMode> gs_mode(const std::string& m) {
  if (m == "nearest") return GsMode::Nearest;
  if (m == "bilinear" || m == "linear") return GsMode::Linear;  // opset 16 / 20 names
  if (m == "bicubic" || m == "cubic") return GsMode::Cubic;
  return std::nullopt;
}

std::optional<GsPad> gs_pad(const std::string& p) {
  if (p == "zeros") return GsPad::Zeros;
  if (p == "border") return GsPad::Border;
  if (p == "reflection") return GsPad::Reflection;
  return std::nullopt;
}

struct Tap {
  mx::array pos;               // integral sample position (float)
  std::optional<mx::array> w;  // weight; none for nearest
};

// Mirrors positions outside [lo, hi] back inside (ORT's GsReflect, elementwise).
mx::array reflect(const mx::array& f, double lo, double hi, mx::Stream s) {
  const auto t = f.dtype();
  const double range = hi - lo;
  if (range <= 0) return mx::full(f.shape(), mx::array(lo, t), s);
  auto k = [&](double v) { return mx::array(v, t); };
  // Distance past a border -> (reflection count is even, remainder).
  auto fold = [&](const mx::array& dx) {
    auto n = mx::floor(mx::divide(dx, k(range), s), s);
    auto r = mx::subtract(dx, mx::multiply(n, k(range), s), s);
    return std::make_pair(mx::equal(mx::remainder(n, k(2), s), k(0), s), r);
  };
  auto below = mx::less(f, k(lo), s), above = mx::greater(f, k(hi), s);
  auto [e1, r1] = fold(mx::subtract(k(lo), f, s));
  auto from_below = mx::where(e1, mx::add(k(lo), r1, s), mx::subtract(k(hi), r1, s), s);
  auto [e2, r2] = fold(mx::subtract(f, k(hi), s));
  auto from_above = mx::where(e2, mx::subtract(k(hi), r2, s), mx::add(k(lo), r2, s), s);
  return mx::where(below, from_below, mx::where(above, from_above, f, s), s);
}

// Keys' cubic weights (a = -0.75) for taps floor-1 .. floor+2 at fraction t.
std::vector<mx::array> cubic_weights(const mx::array& t, mx::Stream s) {
  const auto d = t.dtype();
  const double a = -0.75;
  auto k = [d](double v) { return mx::array(v, d); };
  auto near = [&](const mx::array& x) {  // |x| <= 1
    return mx::add(
        mx::multiply(mx::subtract(mx::multiply(k(a + 2), x, s), k(a + 3), s), mx::square(x, s), s),
        k(1), s);
  };
  auto far = [&](const mx::array& x) {  // 1 < |x| < 2
    auto p = mx::add(mx::multiply(mx::subtract(mx::multiply(k(a), x, s), k(5 * a), s), x, s),
                     k(8 * a), s);
    return mx::subtract(mx::multiply(p, x, s), k(4 * a), s);
  };
  auto one_minus = mx::subtract(k(1), t, s);
  return {far(mx::add(t, k(1), s)), near(t), near(one_minus), far(mx::add(one_minus, k(1), s))};
}

}  // namespace

Support check_grid_sample(const NodeQuery& q) {
  const auto& n = q.node;
  auto mode = gs_mode(n.attr_string("mode", n.since_version >= 20 ? "linear" : "bilinear"));
  if (!mode) return Support::no("unknown mode");
  if (!gs_pad(n.attr_string("padding_mode", "zeros"))) return Support::no("unknown padding_mode");
  if (auto s = float_input(q, 1); !s) return s;
  if (*mode == GsMode::Nearest) {
    if (auto s = numeric_input(q, 0); !s) return s;
  } else if (auto s = float_input(q, 0); !s) {
    return Support::no("linear/cubic sampling needs a float input");
  }
  return check_rank(q, 0, 3, 5);
}

Outputs translate_grid_sample(OpContext& c) {
  const auto& n = c.node;
  const mx::array& x = c.in(0);
  const mx::array& grid = c.in(1);
  const int rank = x.ndim(), nd = rank - 2;
  if (nd < 1 || nd > 3) c.fail("only 1 to 3 spatial dims are supported");
  if (static_cast<int>(grid.ndim()) != rank || grid.shape(-1) != nd || grid.shape(0) != x.shape(0))
    c.fail("grid must be (N, O1..On, n) for an input with n spatial dims");
  const GsMode mode =
      *gs_mode(n.attr_string("mode", n.since_version >= 20 ? "linear" : "bilinear"));
  const GsPad pad = *gs_pad(n.attr_string("padding_mode", "zeros"));
  const bool align = n.attr_int("align_corners", 0) != 0;
  const int N = x.shape(0), C = x.shape(1);
  mx::Shape out_shape{N, C};
  int64_t P = 1, S = 1;
  for (int d = 0; d < nd; ++d) {
    out_shape.push_back(grid.shape(1 + d));
    P *= grid.shape(1 + d);
    S *= x.shape(2 + d);
  }
  if (P == 0 || x.size() == 0) return {mx::zeros(out_shape, x.dtype(), c.s)};

  const mx::Dtype t =
      x.dtype() == mx::float64 || grid.dtype() == mx::float64 ? mx::float64 : mx::float32;
  auto k = [t](double v) { return mx::array(v, t); };
  const int Pi = static_cast<int>(P);
  mx::array g = mx::reshape(mx::astype(grid, t, c.s), {N, Pi, nd}, c.s);

  // Per spatial dim d (input dim 2+d; grid component nd-1-d): its taps.
  std::vector<std::vector<Tap>> taps(nd);
  for (int d = 0; d < nd; ++d) {
    const double L = x.shape(2 + d);
    mx::array gn = mx::squeeze(mx::slice(g, {0, 0, nd - 1 - d}, {N, Pi, nd - d}, c.s), -1, c.s);
    // [-1, 1] -> [0, L-1] (align_corners) or [-0.5, L-0.5]
    mx::array pos =
        align ? mx::multiply(mx::divide(mx::add(gn, k(1), c.s), k(2), c.s), k(L - 1), c.s)
              : mx::divide(mx::subtract(mx::multiply(mx::add(gn, k(1), c.s), k(L), c.s), k(1), c.s),
                           k(2), c.s);
    if (mode == GsMode::Nearest) {
      taps[d].push_back({mx::round(pos, 0, c.s), std::nullopt});  // half to even, like nearbyint
      continue;
    }
    mx::array f = mx::floor(pos, c.s);
    mx::array frac = mx::subtract(pos, f, c.s);
    if (mode == GsMode::Linear) {
      taps[d].push_back({f, mx::subtract(k(1), frac, c.s)});
      taps[d].push_back({mx::add(f, k(1), c.s), frac});
    } else {
      auto w = cubic_weights(frac, c.s);
      for (int j = 0; j < 4; ++j) taps[d].push_back({mx::add(f, k(j - 1), c.s), w[j]});
    }
  }

  const mx::Dtype acc_t = mode == GsMode::Nearest ? x.dtype() : t;
  mx::array xf = mx::reshape(mx::astype(x, acc_t, c.s), {N, C, static_cast<int>(S)}, c.s);
  std::optional<mx::array> y;
  std::vector<size_t> pick(nd, 0);
  for (;;) {
    std::optional<mx::array> flat, valid, weight;
    for (int d = 0; d < nd; ++d) {
      const Tap& tap = taps[d][pick[d]];
      const double L = x.shape(2 + d);
      mx::array p = tap.pos;
      if (pad == GsPad::Zeros) {
        auto in =
            mx::logical_and(mx::greater_equal(p, k(0), c.s), mx::less_equal(p, k(L - 1), c.s), c.s);
        valid = valid ? mx::logical_and(*valid, in, c.s) : in;
      } else if (pad == GsPad::Reflection) {
        p = align ? reflect(p, 0, L - 1, c.s) : reflect(p, -0.5, L - 0.5, c.s);
      }
      p = mx::astype(mx::clip(p, k(0), k(L - 1), c.s), mx::int32, c.s);  // truncation, as ORT
      flat = flat ? mx::add(mx::multiply(*flat, mx::array(static_cast<int>(L), mx::int32), c.s), p,
                            c.s)
                  : p;
      if (tap.w) weight = weight ? mx::multiply(*weight, *tap.w, c.s) : *tap.w;
    }
    auto idx = mx::broadcast_to(mx::reshape(*flat, {N, 1, Pi}, c.s), {N, C, Pi}, c.s);
    mx::array v = mx::take_along_axis(xf, idx, 2, c.s);
    if (valid) v = mx::where(mx::reshape(*valid, {N, 1, Pi}, c.s), v, mx::array(0, acc_t), c.s);
    if (weight) v = mx::multiply(v, mx::reshape(*weight, {N, 1, Pi}, c.s), c.s);
    y = y ? mx::add(*y, v, c.s) : v;
    int d = nd - 1;  // next combination of taps
    while (d >= 0 && ++pick[d] == taps[d].size()) pick[d--] = 0;
    if (d < 0) break;
  }
  return {mx::astype(mx::reshape(*y, out_shape, c.s), x.dtype(), c.s)};
}

}  // namespace ortmlx::ops::nn
