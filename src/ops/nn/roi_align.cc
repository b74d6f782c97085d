// RoiAlign (opsets 10, 16, 22): for each region of interest (x1, y1, x2, y2) of image
// batch_indices[r], an output_height x output_width grid of bins, each the average (or max) of
// a sampling grid of bilinear samples, as ONNX's reference and ORT's CPU kernel compute it:
// a sample outside [-1, size] in either axis contributes zero (it still counts in the average),
// one inside is clamped to the image; in max mode a sample's value is the largest of its four
// weighted corner terms w_i * x_i (not the interpolated value), as in those kernels.
//
// With sampling_ratio 0 the grid of each region is ceil(region size / bins), which depends on
// the rois' values: they are read on the host and the largest grid is used for all, the samples
// past a region's own grid masked out.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ops/nn/nn_internal.h"

namespace ortmlx::ops::nn {

namespace {

bool half_pixel_mode(const graph::Node& n) {
  // coordinate_transformation_mode came with opset 16 (default half_pixel); opset 10 behaves as
  // output_half_pixel.
  const auto m = n.attr_string("coordinate_transformation_mode",
                               n.since_version >= 16 ? "half_pixel" : "output_half_pixel");
  return m == "half_pixel";
}

// One axis of the samples: positions (R, bins, G) -> the low/high pixel, their weights, and
// whether the sample lies outside [-1, size] (weights zeroed there).
struct AxisSamples {
  mx::array low, high, w_low, w_high;
};

AxisSamples axis_samples(const mx::array& pos, int size, mx::Stream s) {
  const auto t = pos.dtype();
  // Written so that a NaN position (from NaN rois) is outside too: its index must stay in range.
  auto outside = mx::logical_not(
      mx::logical_and(mx::greater_equal(pos, mx::array(-1.0, t), s),
                      mx::less_equal(pos, mx::array(static_cast<double>(size), t), s), s),
      s);
  auto p = mx::maximum(pos, mx::array(0.0, t), s);
  auto low = mx::floor(p, s);
  auto at_edge = mx::greater_equal(low, mx::array(static_cast<double>(size - 1), t), s);
  auto last = mx::array(static_cast<double>(size - 1), t);
  low = mx::where(at_edge, last, low, s);
  p = mx::where(at_edge, last, p, s);
  auto high = mx::where(at_edge, last, mx::add(low, mx::array(1.0, t), s), s);
  auto frac = mx::subtract(p, low, s);
  auto zero = mx::array(0.0, t);
  auto w_high = mx::where(outside, zero, frac, s);
  auto w_low = mx::where(outside, zero, mx::subtract(mx::array(1.0, t), frac, s), s);
  // Outside samples read pixel 0 with weight 0.
  low = mx::where(outside, zero, low, s);
  high = mx::where(outside, zero, high, s);
  return {mx::astype(low, mx::int32, s), mx::astype(high, mx::int32, s), w_low, w_high};
}

}  // namespace

Support check_roi_align(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  if (auto r = float_input(q, 1); !r) return r;
  if (auto r = input_dtype_in(q, 2, {DType::Int64}); !r) return r;
  if (auto r = check_rank(q, 0, 4, 4); !r) return r;
  const auto mode = q.node.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") return Support::no("mode must be avg or max, not " + mode);
  const auto ctm = q.node.attr_string("coordinate_transformation_mode", "half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    return Support::no("coordinate_transformation_mode must be half_pixel or output_half_pixel");
  if (q.node.attr_int("output_height", 1) < 1 || q.node.attr_int("output_width", 1) < 1)
    return Support::no("output_height and output_width must be positive");
  if (q.node.attr_int("sampling_ratio", 0) < 0) return Support::no("negative sampling_ratio");
  return Support::yes();
}

// Long because the sampling grid (its size per roi, the coordinate transformation, the bilinear
// weights, samples outside the map) is built in one pass over shared intermediates.
Outputs translate_roi_align(OpContext& c) {
  const auto s = c.s;
  const auto& n = c.node;
  const auto& x = c.in(0);
  const auto& rois_in = c.in(1);
  if (x.ndim() != 4) c.fail("X must be (N, C, H, W)");
  if (rois_in.ndim() != 2 || rois_in.shape(1) != 4) c.fail("rois must be (num_rois, 4)");
  const auto& bi = c.in(2);
  if (bi.ndim() != 1 || bi.shape(0) != rois_in.shape(0))
    c.fail("batch_indices must be (num_rois,), one per row of rois");
  const int B = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  const int R = rois_in.shape(0);
  const int PH = static_cast<int>(n.attr_int("output_height", 1));
  const int PW = static_cast<int>(n.attr_int("output_width", 1));
  const int ratio = static_cast<int>(n.attr_int("sampling_ratio", 0));
  const double scale = n.attr_float("spatial_scale", 1.f);
  const bool half_pixel = half_pixel_mode(n);
  const bool max_mode = n.attr_string("mode", "avg") == "max";
  const mx::Dtype t = x.dtype() == mx::float64 ? mx::float64 : mx::float32;
  mx::Shape out_shape{R, C, PH, PW};
  if (R == 0 || C == 0) return {mx::zeros(out_shape, x.dtype(), s)};
  if (static_cast<int64_t>(B) * C * H * W > INT32_MAX) c.fail("X is too large to index");
  if (H == 0 || W == 0) c.fail("X has an empty spatial dimension");

  // Region geometry, (R,) each; arithmetic in t as the reference kernels do it in T.
  auto rois = mx::astype(rois_in, t, s);
  auto col = [&](int j) { return mx::squeeze(mx::slice(rois, {0, j}, {R, j + 1}, s), 1, s); };
  auto sc = mx::array(scale, t), off = mx::array(half_pixel ? 0.5 : 0.0, t);
  auto start_w = mx::subtract(mx::multiply(col(0), sc, s), off, s);
  auto start_h = mx::subtract(mx::multiply(col(1), sc, s), off, s);
  auto roi_w = mx::subtract(mx::subtract(mx::multiply(col(2), sc, s), off, s), start_w, s);
  auto roi_h = mx::subtract(mx::subtract(mx::multiply(col(3), sc, s), off, s), start_h, s);
  if (!half_pixel) {
    roi_w = mx::maximum(roi_w, mx::array(1.0, t), s);
    roi_h = mx::maximum(roi_h, mx::array(1.0, t), s);
  }
  auto bin_h = mx::divide(roi_h, mx::array(static_cast<double>(PH), t), s);
  auto bin_w = mx::divide(roi_w, mx::array(static_cast<double>(PW), t), s);

  // The sampling grid per region: fixed, or ceil(size / bins) from the rois read on the host
  // (computed in the rois' precision, as the position arithmetic above).
  int Gh = ratio, Gw = ratio;
  std::optional<mx::array> grid_h, grid_w;
  if (ratio == 0) {
    const auto v = c.host_floats(1);
    std::vector<int32_t> gh(R), gw(R);
    auto grid = [&](double lo, double hi, int bins) {
      double size;
      if (t == mx::float64) {
        size = (hi * scale - (half_pixel ? 0.5 : 0.0)) - (lo * scale - (half_pixel ? 0.5 : 0.0));
        if (!half_pixel) size = std::max(size, 1.0);
        return static_cast<int32_t>(std::ceil(size / bins));
      }
      const float fs = static_cast<float>(scale), fo = half_pixel ? 0.5f : 0.f;
      float f = (static_cast<float>(hi) * fs - fo) - (static_cast<float>(lo) * fs - fo);
      if (!half_pixel) f = std::max(f, 1.f);
      return static_cast<int32_t>(std::ceil(f / static_cast<float>(bins)));
    };
    Gh = Gw = 1;
    for (int r = 0; r < R; ++r) {
      gh[r] = std::max(grid(v[r * 4 + 1], v[r * 4 + 3], PH), 0);
      gw[r] = std::max(grid(v[r * 4 + 0], v[r * 4 + 2], PW), 0);
      Gh = std::max(Gh, gh[r]);
      Gw = std::max(Gw, gw[r]);
    }
    if (static_cast<int64_t>(Gh) * Gw * PH * PW * R * C > INT32_MAX)
      c.fail("the sampling grid is too large");
    grid_h = mx::array(gh.begin(), {R}, mx::int32);
    grid_w = mx::array(gw.begin(), {R}, mx::int32);
  }

  // Sample positions: start + bin * (p + (i + 0.5) / grid), as start + p * bin + (i + 0.5) * bin /
  // grid.
  auto positions = [&](const mx::array& start, const mx::array& bin, int bins, int G,
                       const std::optional<mx::array>& grid) {
    auto p = mx::reshape(mx::astype(mx::arange(bins, mx::int32, s), t, s), {1, bins, 1}, s);
    auto i = mx::reshape(mx::astype(mx::arange(G, mx::int32, s), t, s), {1, 1, G}, s);
    auto st = mx::reshape(start, {R, 1, 1}, s), b = mx::reshape(bin, {R, 1, 1}, s);
    // A region's zero-size grid (an empty region) has no samples; dividing by 1 there keeps
    // the masked-out positions finite.
    auto g = grid ? mx::reshape(mx::astype(mx::maximum(*grid, mx::array(1), s), t, s), {R, 1, 1}, s)
                  : mx::array(static_cast<double>(G), t);
    auto within = mx::multiply(mx::add(i, mx::array(0.5, t), s), b, s);
    return mx::add(mx::add(st, mx::multiply(p, b, s), s), mx::divide(within, g, s), s);
  };
  auto ys = axis_samples(positions(start_h, bin_h, PH, Gh, grid_h), H, s);  // (R, PH, Gh)
  auto xs = axis_samples(positions(start_w, bin_w, PW, Gw, grid_w), W, s);  // (R, PW, Gw)

  // (R, PH, Gh, 1, 1) x (R, 1, 1, PW, Gw) -> (R, PH, Gh, PW, Gw), then (R, 1, S) over channels.
  const int S = PH * Gh * PW * Gw;
  auto yv = [&](const mx::array& a) { return mx::reshape(a, {R, PH, Gh, 1, 1}, s); };
  auto xv = [&](const mx::array& a) { return mx::reshape(a, {R, 1, 1, PW, Gw}, s); };
  auto flat = [&](const mx::array& a) { return mx::reshape(a, {R, 1, S}, s); };
  auto batch = c.checked_indices(bi, {B}, false, "batch_indices", 2);
  auto base = mx::multiply(mx::reshape(mx::astype(batch, mx::int32, s), {R, 1, 1}, s),
                           mx::array(C * H * W), s);
  base = mx::add(
      base,
      mx::reshape(mx::multiply(mx::arange(C, mx::int32, s), mx::array(H * W), s), {1, C, 1}, s),
      s);  // (R, C, 1)
  auto xflat = mx::reshape(mx::astype(x, t, s), {-1}, s);
  auto term = [&](const mx::array& yi, const mx::array& wy, const mx::array& xi,
                  const mx::array& wx) {
    auto pos = flat(mx::add(mx::multiply(yv(yi), mx::array(W), s), xv(xi), s));
    auto w = flat(mx::multiply(yv(wy), xv(wx), s));
    return mx::multiply(w, mx::take(xflat, mx::add(base, pos, s), s), s);  // (R, C, S)
  };
  auto t1 = term(ys.low, ys.w_low, xs.low, xs.w_low);
  auto t2 = term(ys.low, ys.w_low, xs.high, xs.w_high);
  auto t3 = term(ys.high, ys.w_high, xs.low, xs.w_low);
  auto t4 = term(ys.high, ys.w_high, xs.high, xs.w_high);

  // Samples past a region's own grid (sampling_ratio 0), (R, 1, S).
  std::optional<mx::array> in_grid;
  std::optional<mx::array> count;
  if (grid_h) {
    auto iy = mx::reshape(mx::arange(Gh, mx::int32, s), {1, 1, Gh, 1, 1}, s);
    auto ix = mx::reshape(mx::arange(Gw, mx::int32, s), {1, 1, 1, 1, Gw}, s);
    auto gh = mx::reshape(*grid_h, {R, 1, 1, 1, 1}, s),
         gw = mx::reshape(*grid_w, {R, 1, 1, 1, 1}, s);
    auto m = mx::logical_and(mx::less(iy, gh, s), mx::less(ix, gw, s), s);
    in_grid = flat(mx::broadcast_to(m, {R, PH, Gh, PW, Gw}, s));
    count = mx::reshape(mx::maximum(mx::multiply(*grid_h, *grid_w, s), mx::array(1), s),
                        {R, 1, 1, 1}, s);
  }
  mx::array y = t1;
  if (max_mode) {
    y = mx::maximum(mx::maximum(t1, t2, s), mx::maximum(t3, t4, s), s);
    if (in_grid)
      y = mx::where(*in_grid, y, mx::array(-std::numeric_limits<double>::infinity(), t), s);
    y = mx::max(mx::reshape(y, {R, C, PH, Gh, PW, Gw}, s), {3, 5}, false, s);
    // A region without samples (a zero-size grid) gives 0, the kernels' initial value.
    if (count) {
      auto none = mx::reshape(mx::equal(mx::multiply(*grid_h, *grid_w, s), mx::array(0), s),
                              {R, 1, 1, 1}, s);
      y = mx::where(none, mx::array(0.0, t), y, s);
    }
  } else {
    y = mx::add(mx::add(t1, t2, s), mx::add(t3, t4, s), s);
    if (in_grid) y = mx::where(*in_grid, y, mx::array(0.0, t), s);
    y = mx::sum(mx::reshape(y, {R, C, PH, Gh, PW, Gw}, s), {3, 5}, false, s);
    y = mx::divide(
        y,
        count ? mx::astype(*count, t, s) : mx::array(static_cast<double>(std::max(Gh * Gw, 1)), t),
        s);
  }
  return {mx::astype(y, x.dtype(), s)};
}

}  // namespace ortmlx::ops::nn
