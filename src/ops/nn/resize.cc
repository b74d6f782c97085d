// Resize (opset 10+) and Upsample (opset 7/9).
//
// Interpolation is separable, so every resized axis is done on its own: the host computes, per
// output position, which input positions ("taps") it reads and with what weights (1 tap for
// nearest, 2 for linear, 4 for cubic), and the graph gathers the taps with take() and sums
// them. Coordinates are computed in float32 with ORT's formulas, so nearest-mode ties and
// sizes agree with ORT's CPU kernel; axes whose scale is exactly 1 are left alone, as there.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "kernels/cpu/kernels.h"
#include "ops/nn/nn_internal.h"

namespace ortmlx::ops::nn {

namespace {

enum class Mode { Nearest, Linear, Cubic };
enum class Coord {
  HalfPixel,
  HalfPixelSymmetric,
  PytorchHalfPixel,
  AlignCorners,
  Asymmetric,
  TfHalfPixelForNN,
  TfCropAndResize
};
// Simple: Resize-10 / Upsample (no nearest_mode): truncate, or ceil when downsampling.
enum class Nearest { Simple, RoundPreferFloor, RoundPreferCeil, Floor, Ceil };

std::optional<Mode> parse_mode(const std::string& s) {
  if (s == "nearest") return Mode::Nearest;
  if (s == "linear" || s == "bilinear") return Mode::Linear;
  if (s == "cubic") return Mode::Cubic;
  return std::nullopt;
}

std::optional<Coord> parse_coord(const std::string& s) {
  if (s == "half_pixel") return Coord::HalfPixel;
  if (s == "half_pixel_symmetric") return Coord::HalfPixelSymmetric;
  if (s == "pytorch_half_pixel") return Coord::PytorchHalfPixel;
  if (s == "align_corners") return Coord::AlignCorners;
  if (s == "asymmetric") return Coord::Asymmetric;
  if (s == "tf_half_pixel_for_nn") return Coord::TfHalfPixelForNN;
  if (s == "tf_crop_and_resize") return Coord::TfCropAndResize;
  return std::nullopt;
}

std::optional<Nearest> parse_nearest(const std::string& s) {
  if (s == "round_prefer_floor") return Nearest::RoundPreferFloor;
  if (s == "round_prefer_ceil") return Nearest::RoundPreferCeil;
  if (s == "floor") return Nearest::Floor;
  if (s == "ceil") return Nearest::Ceil;
  return std::nullopt;
}

struct Params {
  Mode mode = Mode::Nearest;
  Coord coord = Coord::Asymmetric;
  Nearest nearest = Nearest::Simple;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  bool antialias = false;
  float extrapolation = 0.f;
};

// Output coordinate -> input coordinate (ORT's GetOriginalCoordinateFromResizedCoordinate).
float original_coord(Coord m, float y, float scale, float out_len, float in_len, float roi_lo,
                     float roi_hi) {
  switch (m) {
    case Coord::Asymmetric:
      return y / scale;
    case Coord::PytorchHalfPixel:
      return out_len > 1 ? (y + 0.5f) / scale - 0.5f : 0.0f;
    case Coord::TfHalfPixelForNN:
      return (y + 0.5f) / scale;
    case Coord::AlignCorners:
      return out_len == 1 ? 0.f : y * (in_len - 1) / (out_len - 1);
    case Coord::TfCropAndResize:
      return static_cast<float>(out_len > 1
                                    ? roi_lo * (in_len - 1) +
                                          (y * (roi_hi - roi_lo) * (in_len - 1)) / (out_len - 1)
                                    : 0.5 * (roi_lo + roi_hi) * (in_len - 1));
    case Coord::HalfPixelSymmetric: {
      float adjustment = out_len / (scale * in_len);
      float offset = in_len / 2 * (1 - adjustment);
      return static_cast<float>(offset + (y + 0.5) / scale - 0.5);
    }
    case Coord::HalfPixel:
      break;
  }
  return (y + 0.5f) / scale - 0.5f;
}

int64_t nearest_pixel(Nearest m, float x, bool downsampling) {
  switch (m) {
    case Nearest::Simple:
      return downsampling ? static_cast<int64_t>(std::ceil(x)) : static_cast<int64_t>(x);
    case Nearest::RoundPreferCeil:
      return static_cast<int64_t>(std::round(x));
    case Nearest::Floor:
      return static_cast<int64_t>(std::floor(x));
    case Nearest::Ceil:
      return static_cast<int64_t>(std::ceil(x));
    case Nearest::RoundPreferFloor:
      break;
  }
  if (x == static_cast<float>(static_cast<int64_t>(x)) + 0.5f)
    return static_cast<int64_t>(std::floor(x));
  return static_cast<int64_t>(std::round(x));
}

// Keys' cubic convolution weights for the taps at floor(x)-1 .. floor(x)+2, s = x - floor(x).
void cubic_coeffs(float s, float a, float* c) {
  auto near = [a](float t) { return ((a + 2) * t - (a + 3)) * t * t + 1; };       // |t| <= 1
  auto far = [a](float t) { return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a; };  // 1 < |t| < 2
  c[0] = far(s + 1);
  c[1] = near(s);
  c[2] = near(1 - s);
  c[3] = far(2 - s);
}

// The taps of one resized axis: for output position o, tap t reads input idx[o*n + t] with
// weight w[o*n + t]; extrap[o] marks tf_crop_and_resize positions outside the input.
struct Taps {
  int n = 1;
  std::vector<int32_t> idx;
  std::vector<float> w;
  std::vector<uint8_t> extrap;
  bool any_extrap = false;
};

// Antialiased linear/cubic (Resize-18 antialias=1), following ORT's Pillow-style filter: when
// downscaling the filter is stretched by 1/scale, so each output reads a variable window
// (padded here to a fixed tap count with zero weights). Without exclude_outside, the weight of
// taps outside the input is folded onto the edge taps.
Taps antialias_taps(const Params& p, int64_t in, int64_t out, float scale, float roi_lo,
                    float roi_hi) {
  const bool cubic = p.mode == Mode::Cubic;
  const float a = p.cubic_a;
  auto filter = [cubic, a](float x) {
    x = std::fabs(x);
    if (!cubic) return x < 1.f ? 1.f - x : 0.f;
    if (x < 1.f) return ((a + 2.f) * x - (a + 3.f)) * x * x + 1;
    if (x < 2.f) return (((x - 5.f) * x + 8.f) * x - 4.f) * a;
    return 0.f;
  };
  const float inv_scale = 1.0f / scale;  // > 1 when downscaling
  const float support = (cubic ? 4.f : 2.f) * 0.5f * (inv_scale >= 1.f ? inv_scale : 1.f);
  const int64_t window = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const float filter_scale = inv_scale >= 1.f ? 1.f / inv_scale : 1.f;
  Taps t;
  t.n = static_cast<int>(window);
  t.extrap.assign(out, 0);
  std::vector<float> buf(window);
  for (int64_t i = 0; i < out; ++i) {
    float center =
        0.5f + (inv_scale == 1.f
                    ? static_cast<float>(i)
                    : original_coord(p.coord, static_cast<float>(i), scale, static_cast<float>(out),
                                     static_cast<float>(in), roi_lo, roi_hi));
    if (p.coord == Coord::TfCropAndResize &&
        (center - 0.5f < 0 || center - 0.5f > static_cast<float>(in - 1))) {
      t.extrap[i] = 1;
      t.any_extrap = true;
    }
    auto xmin_real = static_cast<int64_t>(std::floor(center - support + 0.5f));
    auto xmax_real = static_cast<int64_t>(std::floor(center + support + 0.5f));
    xmax_real = xmin_real + std::clamp<int64_t>(xmax_real - xmin_real, 0, window);
    int64_t xmin_cut = std::clamp<int64_t>(xmin_real, 0, in);
    int64_t xmax_cut = std::clamp<int64_t>(xmax_real, 0, in);
    int64_t xmin = p.exclude_outside ? xmin_cut : xmin_real;
    int64_t len = (p.exclude_outside ? xmax_cut : xmax_real) - xmin;
    std::fill(buf.begin(), buf.end(), 0.f);
    float total = 0.f;
    for (int64_t x = 0; x < len; ++x) {
      buf[x] = filter((static_cast<float>(x + xmin) - center + 0.5f) * filter_scale);
      total += buf[x];
    }
    if (!p.exclude_outside && xmin_cut < xmax_cut) {
      int64_t neg = std::clamp<int64_t>(-xmin, 0, len - 1);
      for (int64_t x = 0; x < neg; ++x) buf[neg] += buf[x];
      int64_t beyond = std::clamp<int64_t>(len + xmin - in, 0, len - 1);
      for (int64_t x = len - beyond; x < len; ++x) buf[len - beyond - 1] += buf[x];
      if (neg | beyond)
        for (int64_t x = 0; x < xmax_cut - xmin_cut; ++x) buf[x] = buf[x + neg];
    }
    float norm = total == 0.f ? 1.f : 1.f / total;
    for (int64_t x = 0; x < window; ++x) {
      bool used = x < xmax_cut - xmin_cut;
      t.idx.push_back(static_cast<int32_t>(used ? xmin_cut + x : 0));
      t.w.push_back(used ? buf[x] * norm : 0.f);
    }
  }
  return t;
}

Taps axis_taps(const Params& p, int64_t in, int64_t out, float scale, float roi_lo, float roi_hi) {
  if (p.antialias && p.mode != Mode::Nearest)
    return antialias_taps(p, in, out, scale, roi_lo, roi_hi);
  Taps t;
  t.n = p.mode == Mode::Nearest ? 1 : p.mode == Mode::Linear ? 2 : 4;
  t.idx.reserve(out * t.n);
  t.w.reserve(out * t.n);
  t.extrap.assign(out, 0);
  auto clamp = [in](int64_t i) {
    return static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(i, 0), in - 1));
  };
  for (int64_t o = 0; o < out; ++o) {
    float x = original_coord(p.coord, static_cast<float>(o), scale, static_cast<float>(out),
                             static_cast<float>(in), roi_lo, roi_hi);
    if (p.coord == Coord::TfCropAndResize && (x < 0 || x > static_cast<float>(in - 1))) {
      t.extrap[o] = 1;
      t.any_extrap = true;
    }
    if (p.mode == Mode::Nearest) {
      t.idx.push_back(clamp(nearest_pixel(p.nearest, x, scale < 1)));
      t.w.push_back(1.f);
    } else if (p.mode == Mode::Linear) {
      float xc = std::max(0.f, std::min(x, static_cast<float>(in - 1)));
      int64_t i1 = std::min<int64_t>(static_cast<int64_t>(xc), in - 1);
      int64_t i2 = std::min<int64_t>(i1 + 1, in - 1);
      float d1 = std::fabs(xc - i1), d2 = std::fabs(xc - i2);
      if (i1 == i2) d1 = d2 = 0.5f;
      t.idx.insert(t.idx.end(), {static_cast<int32_t>(i1), static_cast<int32_t>(i2)});
      t.w.insert(t.w.end(), {d2, d1});
    } else {
      auto xi = static_cast<int64_t>(std::floor(x));
      float c[4];
      cubic_coeffs(x - static_cast<float>(xi), p.cubic_a, c);
      float sum = 0;
      for (int k = 0; k < 4; ++k) {
        int64_t j = xi - 1 + k;
        if (p.exclude_outside && (j < 0 || j >= in)) c[k] = 0;
        sum += c[k];
      }
      for (int k = 0; k < 4; ++k) {
        t.idx.push_back(clamp(xi - 1 + k));
        t.w.push_back(p.exclude_outside && sum != 0 ? c[k] / sum : c[k]);
      }
    }
  }
  return t;
}

// One nearest tap per output that reads the input in a regular pattern, without a gather:
// every input repeated k times in order (integer upsampling, idx = o / k) is a broadcast and a
// reshape (one copy), and every k-th input from some start (integer downsampling) a strided
// slice. MLX's take() computes each element's source on its own (several times slower on the
// CPU device); the values are the same elements either way. std::nullopt for other patterns.
// k when every one of `in` inputs is repeated k times in order (idx[o] == o / k), else 0.
int64_t repeat_factor(const std::vector<int32_t>& idx, int64_t in) {
  const int64_t out = static_cast<int64_t>(idx.size());
  if (in <= 0 || out <= 0 || out % in) return 0;
  const int64_t k = out / in;
  for (int64_t o = 0; o < out; ++o)
    if (idx[static_cast<size_t>(o)] != o / k) return 0;
  return k;
}

std::optional<mx::array> regular_nearest(const mx::array& x, int axis, const std::vector<int32_t>& idx,
                                         mx::Stream s) {
  const int64_t in = x.shape(axis), out = static_cast<int64_t>(idx.size());
  if (in <= 0 || out <= 0) return std::nullopt;
  if (const int64_t k = repeat_factor(idx, in)) {
    if (k == 1) return x;
    mx::Shape one = x.shape(), wide = x.shape(), merged = x.shape();
    one.insert(one.begin() + axis + 1, 1);
    wide.insert(wide.begin() + axis + 1, static_cast<int>(k));
    merged[axis] = static_cast<int>(out);
    return mx::reshape(mx::broadcast_to(mx::reshape(x, one, s), wide, s), merged, s);
  }
  const int64_t start = idx[0], step = out > 1 ? idx[1] - idx[0] : 1;
  if (step < 1) return std::nullopt;
  for (int64_t o = 0; o < out; ++o)
    if (idx[o] != start + o * step) return std::nullopt;
  mx::Shape lo(x.ndim(), 0), hi = x.shape(), stride(x.ndim(), 1);
  lo[axis] = static_cast<int>(start);
  hi[axis] = static_cast<int>(start + (out - 1) * step + 1);
  stride[axis] = static_cast<int>(step);
  return mx::slice(x, lo, hi, stride, s);
}

// Applies one axis' taps: y = sum_t take(x, idx_t, axis) * w_t (broadcast along `axis`).
mx::array apply_taps(const mx::array& x, int axis, const Taps& t, const Params& p, mx::Stream s) {
  const int rank = x.ndim();
  const int out = static_cast<int>(t.extrap.size());
  mx::Shape bshape(rank, 1);
  bshape[axis] = out;
  mx::array y = x;
  if (t.n == 1) {
    if (auto regular = regular_nearest(x, axis, t.idx, s))
      y = *regular;
    else
      y = mx::take(x, mx::array(t.idx.begin(), {out}, mx::int32), axis, s);
  } else {
    std::vector<int32_t> idx(out);
    std::vector<float> w(out);
    for (int k = 0; k < t.n; ++k) {
      for (int o = 0; o < out; ++o) {
        idx[o] = t.idx[o * t.n + k];
        w[o] = t.w[o * t.n + k];
      }
      auto g = mx::take(x, mx::array(idx.begin(), {out}, mx::int32), axis, s);
      auto wk = mx::astype(mx::array(w.begin(), bshape, mx::float32), x.dtype(), s);
      auto term = mx::multiply(g, wk, s);
      y = k == 0 ? term : mx::add(y, term, s);
    }
  }
  if (t.any_extrap) {
    mx::array mask(reinterpret_cast<const bool*>(t.extrap.data()), bshape, mx::bool_);
    y = mx::where(mask, mx::astype(mx::array(p.extrapolation), y.dtype(), s), y, s);
  }
  return y;
}

// Resizes x to `out` with per-axis `scales` (and roi, 2*rank values, for tf_crop_and_resize).
mx::array resize(OpContext& c, const mx::array& x, const Params& p,
                 const std::vector<float>& scales, const std::vector<int64_t>& out,
                 const std::vector<float>& roi) {
  const int rank = x.ndim();
  bool same = true;
  int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    same = same && out[i] == x.shape(i);
    numel *= out[i];
  }
  if (same) return x;  // ORT copies the input when no dim changes
  if (numel == 0 || x.size() == 0) {
    if (numel != 0) c.fail("cannot resize an empty input to a non-empty output");
    return mx::zeros(to_shape(out), x.dtype(), c.s);
  }
  auto taps_of = [&](int i) {
    return axis_taps(p, x.shape(i), out[i], scales[i], roi.empty() ? 0.f : roi[i], roi.empty() ? 1.f : roi[rank + i]);
  };
  if (p.mode == Mode::Nearest && rank == 4 && c.s.device == mx::Device::cpu && out[0] == x.shape(0) &&
      out[1] == x.shape(1)) {
    // Whole-factor upsampling of H and W (every input repeated k times): the EP's kernel.
    int64_t k[2] = {0, 0};
    for (int i = 2; i < 4; ++i) {
      const auto t = taps_of(i);
      if (t.n == 1 && !t.any_extrap) k[i - 2] = repeat_factor(t.idx, x.shape(i));
    }
    if (k[0] && k[1])
      if (auto y = cpu_nearest_upsample(x, static_cast<int>(k[0]), static_cast<int>(k[1]), c.s)) return *y;
  }
  // Nearest only copies elements (exact for every dtype); the weighted modes run in float.
  mx::array y = x;
  if (p.mode != Mode::Nearest && y.dtype() != mx::float64) y = mx::astype(y, mx::float32, c.s);
  for (int i = 0; i < rank; ++i) {
    // ORT leaves scale-1 axes alone (its antialias path: same-size axes).
    if (p.antialias ? out[i] == x.shape(i) : scales[i] == 1.0f) continue;
    if (x.shape(i) == 0) continue;
    y = apply_taps(y, i, taps_of(i), p, c.s);
  }
  return mx::astype(y, x.dtype(), c.s);
}

// Places per-axis values given for `axes` into a rank-long vector filled with `fill`.
template <typename T>
std::vector<T> expand_axes(OpContext& c, const std::vector<T>& v, const std::vector<int>& axes,
                           int rank, T fill, const char* what) {
  if (axes.empty()) {
    if (static_cast<int>(v.size()) != rank)
      c.fail(std::string(what) + " has " + std::to_string(v.size()) + " values for rank " +
             std::to_string(rank));
    return v;
  }
  if (v.size() != axes.size()) c.fail(std::string(what) + " must have one value per axis");
  std::vector<T> full(rank, fill);
  for (size_t i = 0; i < axes.size(); ++i) full[axes[i]] = v[i];
  return full;
}

Params common_params(const graph::Node& n) {
  Params p;
  p.mode = parse_mode(n.attr_string("mode", "nearest")).value_or(Mode::Nearest);
  return p;
}

Support check_dtype_for_mode(const NodeQuery& q, Mode m) {
  if (m == Mode::Nearest)
    return input_dtype_in(q, 0, kFloat, kSignedInt, kUnsignedInt, {DType::Bool});
  if (auto s = float_input(q, 0); !s)
    return Support::no(
        "linear/cubic resizing of integer inputs is not supported (ORT rounds "
        "them in fixed point)");
  return Support::yes();
}

}  // namespace

Support check_resize(const NodeQuery& q) {
  const auto& n = q.node;
  auto mode = parse_mode(n.attr_string("mode", "nearest"));
  if (!mode || n.attr_string("mode", "nearest") == "bilinear")
    return Support::no("unknown mode '" + n.attr_string("mode", "nearest") + "'");
  if (n.attr_int("antialias", 0) != 0 && *mode == Mode::Nearest)
    return Support::no("antialias applies to linear/cubic only");
  if (n.since_version >= 11) {
    if (!parse_coord(n.attr_string("coordinate_transformation_mode", "half_pixel")))
      return Support::no("unknown coordinate_transformation_mode");
    if (!parse_nearest(n.attr_string("nearest_mode", "round_prefer_floor")))
      return Support::no("unknown nearest_mode");
  }
  auto policy = n.attr_string("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    return Support::no("unknown keep_aspect_ratio_policy '" + policy + "'");
  if (int r = q.input_rank(0); r == 0) return Support::no("rank-0 input");
  return check_dtype_for_mode(q, *mode);
}

Outputs translate_resize(OpContext& c) {
  const auto& n = c.node;
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  Params p = common_params(n);
  size_t scales_in = 1, sizes_in = 0;  // Resize-10: (X, scales)
  if (n.since_version >= 11) {
    p.coord = *parse_coord(n.attr_string("coordinate_transformation_mode", "half_pixel"));
    if (p.mode == Mode::Nearest)
      p.nearest = *parse_nearest(n.attr_string("nearest_mode", "round_prefer_floor"));
    p.cubic_a = n.attr_float("cubic_coeff_a", -0.75f);
    p.exclude_outside = n.attr_int("exclude_outside", 0) != 0;
    p.extrapolation = n.attr_float("extrapolation_value", 0.f);
    p.antialias = n.since_version >= 18 && n.attr_int("antialias", 0) != 0;
    scales_in = 2;
    sizes_in = 3;
  }
  std::vector<int> axes;
  if (n.since_version >= 18) axes = to_axes(n.attr_ints("axes"), rank);

  std::vector<double> scales_v =
      c.has(scales_in) ? c.host_floats(scales_in) : std::vector<double>{};
  std::vector<int64_t> sizes_v;
  if (sizes_in && c.has(sizes_in)) sizes_v = c.host_ints(sizes_in);
  std::vector<float> scales(rank, 1.f);
  std::vector<int64_t> out(x.shape().begin(), x.shape().end());
  if (!sizes_v.empty()) {
    if (!scales_v.empty()) c.fail("only one of scales and sizes may be given");
    out = expand_axes<int64_t>(c, sizes_v, axes, rank, 0, "sizes");
    for (int i = 0; i < rank; ++i) {
      if (axes.empty() || std::find(axes.begin(), axes.end(), i) != axes.end()) continue;
      out[i] = x.shape(i);
    }
    for (int i = 0; i < rank; ++i)
      scales[i] =
          x.shape(i) == 0 ? 1.f : static_cast<float>(out[i]) / static_cast<float>(x.shape(i));
    auto policy = n.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch") {
      auto in_axes = [&](int i) {
        return axes.empty() || std::find(axes.begin(), axes.end(), i) != axes.end();
      };
      float s = policy == "not_larger" ? INFINITY : 0.f;
      for (int i = 0; i < rank; ++i)
        if (in_axes(i))
          s = policy == "not_larger" ? std::min(s, scales[i]) : std::max(s, scales[i]);
      for (int i = 0; i < rank; ++i) {
        scales[i] = in_axes(i) ? s : 1.f;
        out[i] = in_axes(i) ? static_cast<int64_t>(std::round(s * x.shape(i))) : x.shape(i);
      }
    }
  } else {
    if (scales_v.empty()) c.fail("one of scales and sizes must be given");
    std::vector<float> sv(scales_v.begin(), scales_v.end());
    scales = expand_axes<float>(c, sv, axes, rank, 1.f, "scales");
    for (int i = 0; i < rank; ++i) {
      if (!(scales[i] > 0)) c.fail("scales must be positive");
      out[i] = static_cast<int64_t>(scales[i] * static_cast<float>(x.shape(i)));
    }
  }
  std::vector<float> roi;
  if (p.coord == Coord::TfCropAndResize) {
    if (!c.has(1)) c.fail("tf_crop_and_resize needs the roi input");
    auto r = c.host_floats(1);
    std::vector<float> rv(r.begin(), r.end());
    if (axes.empty()) {
      if (static_cast<int>(rv.size()) != 2 * rank) c.fail("roi must have 2 * rank values");
      roi = rv;
    } else {
      if (rv.size() != 2 * axes.size()) c.fail("roi must have 2 values per axis");
      roi.assign(rank, 0.f);
      roi.resize(2 * rank, 1.f);
      for (size_t i = 0; i < axes.size(); ++i) {
        roi[axes[i]] = rv[i];
        roi[rank + axes[i]] = rv[axes.size() + i];
      }
    }
  }
  return {resize(c, x, p, scales, out, roi)};
}

Support check_upsample(const NodeQuery& q) {
  auto m = q.node.attr_string("mode", "nearest");
  auto mode = parse_mode(m);
  if (!mode || *mode == Mode::Cubic || m == "bilinear")
    return Support::no("unknown mode '" + m + "'");
  if (int r = q.input_rank(0); r == 0) return Support::no("rank-0 input");
  return check_dtype_for_mode(q, *mode);
}

// Upsample-7 (scales attribute) / -9 (scales input): asymmetric coordinates, nearest truncates.
Outputs translate_upsample(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  Params p = common_params(c.node);
  std::vector<float> scales;
  if (c.node.since_version >= 9) {
    auto v = c.host_floats(1);
    scales.assign(v.begin(), v.end());
  } else {
    scales = c.node.attr_floats("scales");
  }
  if (static_cast<int>(scales.size()) != rank) c.fail("scales must have one value per dim");
  std::vector<int64_t> out(rank);
  for (int i = 0; i < rank; ++i) {
    if (scales[i] < 1) c.fail("Upsample scales must be >= 1");
    out[i] = static_cast<int64_t>(scales[i] * static_cast<float>(x.shape(i)));
  }
  return {resize(c, x, p, scales, out, {})};
}

}  // namespace ortmlx::ops::nn
