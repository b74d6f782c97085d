// Pooling: MaxPool (with its Indices output), AveragePool, LpPool and the Global* forms.
//
// MLX has no pooling primitive. The input is padded (with the value that cannot win: -inf /
// the dtype's lowest for max, 0 for sums), then viewed with as_strided as
// (N, C, out_1..out_n, k_1..k_n) windows and reduced over the window axes. Window geometry
// follows ORT's CPU kernels (auto_pad SAME sizes use the undilated kernel; with ceil_mode a
// last window that would start in the end padding is dropped, as in PyTorch).
#include <cmath>
#include <numeric>
#include <optional>
#include <string>

#include "kernels/cpu/kernels.h"
#include "ops/nn/nn_internal.h"

namespace ortmlx::ops::nn {

namespace {

Window make_window(OpContext& c, const mx::array& x) {
  const auto& n = c.node;
  if (x.ndim() < 3 || x.ndim() > 5) c.fail("only 1-D, 2-D and 3-D pooling is supported");
  Window w;
  w.nd = x.ndim() - 2;
  w.kernel = n.attr_ints("kernel_shape");
  if (w.kernel.size() != w.nd) c.fail("kernel_shape must have one value per spatial dim");
  w.stride = spatial_attr(n, "strides", w.nd, 1);
  w.dil = spatial_attr(n, "dilations", w.nd, 1);
  auto pads = pads_attr(n, w.nd);
  bool ceil_mode = n.attr_int("ceil_mode", 0) != 0;
  auto auto_pad = n.attr_string("auto_pad", "NOTSET");
  for (size_t d = 0; d < w.nd; ++d) {
    int64_t in = x.shape(2 + d), k = w.kernel[d], s = w.stride[d];
    int64_t lo = pads[d], hi = pads[w.nd + d];
    if (auto_pad == "VALID") {
      lo = hi = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t target = (in + s - 1) / s;
      int64_t need = (target - 1) * s + k - in;
      lo = auto_pad == "SAME_LOWER" ? (need + 1) / 2 : need / 2;
      hi = need - lo;
    }
    int64_t span = in + lo + hi - w.dil[d] * (k - 1) - 1;
    int64_t out;
    if (ceil_mode) {
      out = static_cast<int64_t>(std::ceil(static_cast<double>(span) / s)) + 1;
      if (out > 0 && (out - 1) * s >= in + lo) --out;  // window would start in the end padding
    } else {
      out = static_cast<int64_t>(std::floor(static_cast<double>(span) / s)) + 1;
    }
    w.in.push_back(in);
    w.lo.push_back(lo);
    w.hi.push_back(hi);
    w.out.push_back(std::max<int64_t>(out, 0));
  }
  return w;
}

mx::Shape pooled_shape(const mx::array& x, const Window& w) {
  mx::Shape s{x.shape(0), x.shape(1)};
  for (auto o : w.out) s.push_back(static_cast<int>(o));
  return s;
}

}  // namespace

bool Window::empty() const {
  for (auto o : out)
    if (o <= 0) return true;
  return false;
}

namespace {

// The input cropped/padded so that every window lies inside it, row-contiguous, with its
// row-major element strides.
struct Padded {
  mx::array xp;
  mx::Strides st;
};

Padded padded_input(const mx::array& x, const Window& w, int first, const mx::array& pad_value,
                    mx::Stream s) {
  const int rank = x.ndim();
  mx::array xp = x;
  mx::Shape start(rank, 0), stop = x.shape();
  std::vector<int> axes;
  mx::Shape lo, hi;
  bool crop = false;
  for (size_t d = 0; d < w.nd; ++d) {
    const int a = first + static_cast<int>(d);
    int64_t extent = (w.out[d] - 1) * w.stride[d] + (w.kernel[d] - 1) * w.dil[d] + 1;
    int64_t b = w.lo[d], e = extent - w.in[d] - w.lo[d];  // e: what the last window needs
    if (b < 0) {
      start[a] = static_cast<int>(-b);
      b = 0;
      crop = true;
    }
    if (e < 0) {
      stop[a] = static_cast<int>(w.in[d] + e);
      e = 0;
      crop = true;
    }
    axes.push_back(a);
    lo.push_back(static_cast<int>(b));
    hi.push_back(static_cast<int>(e));
  }
  if (crop) xp = mx::slice(xp, start, stop, s);
  xp = mx::contiguous(mx::pad(xp, axes, lo, hi, pad_value, "constant", s), false, s);
  mx::Strides st(rank);
  int64_t acc = 1;
  for (int i = rank - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= xp.shape(i);
  }
  return {xp, st};
}

// (dims before `first`, out_1..out_n) with the spatial strides of the windows' origins.
void origin_view(const Padded& p, const Window& w, int first, mx::Shape& shape, mx::Strides& strides) {
  for (int i = 0; i < static_cast<int>(p.xp.ndim()); ++i) {
    int d = i - first;
    bool spatial = d >= 0 && d < static_cast<int>(w.nd);
    shape.push_back(spatial ? static_cast<int>(w.out[d]) : p.xp.shape(i));
    strides.push_back(spatial ? p.st[i] * w.stride[d] : p.st[i]);
  }
}

}  // namespace

mx::array windows(const mx::array& x, const Window& w, int first, const mx::array& pad_value,
                  mx::Stream s) {
  Padded p = padded_input(x, w, first, pad_value, s);
  mx::Shape shape;
  mx::Strides strides;
  origin_view(p, w, first, shape, strides);
  for (size_t d = 0; d < w.nd; ++d) {
    shape.push_back(static_cast<int>(w.kernel[d]));
    strides.push_back(p.st[first + d] * w.dil[d]);
  }
  return mx::as_strided(p.xp, shape, strides, 0, s);
}

void for_each_tap(const mx::array& x, const Window& w, int first, const mx::array& pad_value,
                  mx::Stream s, const std::function<void(const mx::array&, int64_t)>& visit) {
  Padded p = padded_input(x, w, first, pad_value, s);
  mx::Shape shape;
  mx::Strides strides;
  origin_view(p, w, first, shape, strides);
  int64_t n = 1;
  for (auto k : w.kernel) n *= k;
  std::vector<int64_t> tap(w.nd, 0);
  for (int64_t t = 0; t < n; ++t) {
    int64_t offset = 0;
    for (size_t d = 0; d < w.nd; ++d) offset += tap[d] * w.dil[d] * p.st[first + d];
    visit(mx::as_strided(p.xp, shape, strides, static_cast<size_t>(offset), s), t);
    for (int d = static_cast<int>(w.nd) - 1; d >= 0; --d) {  // next tap, last dim fastest
      if (++tap[d] < w.kernel[d]) break;
      tap[d] = 0;
    }
  }
}

namespace {

// Max or sum over small windows as a fold of one strided view per kernel tap: elementwise
// maximum/add, which MLX fuses into one kernel when compiled. MLX's reduction over the
// as_strided window axes takes its generic path (a std::function call per element) on the CPU:
// measured 7-9% of squeezenet's samples in its max pools alone.
constexpr int64_t kMaxTaps = 27;

int64_t tap_count(const Window& w) {
  int64_t n = 1;
  for (auto k : w.kernel) n *= k;
  return n;
}

mx::array fold_taps(const mx::array& x, const Window& w, const mx::array& pad_value, bool max,
                    mx::Stream s) {
  std::optional<mx::array> acc;
  for_each_tap(x, w, 2, pad_value, s, [&](const mx::array& v, int64_t) {
    acc = !acc ? v : max ? mx::maximum(*acc, v, s) : mx::add(*acc, v, s);
  });
  return *acc;
}

std::vector<int> window_axes(const Window& w) {
  std::vector<int> a;
  for (size_t d = 0; d < w.nd; ++d) a.push_back(static_cast<int>(2 + w.nd + d));
  return a;
}

// How many window taps of each output position along axis d fall in [first, last) of the padded
// axis: AveragePool's divisor along that axis.
std::vector<float> axis_tap_counts(const Window& w, size_t d, bool include_pad) {
  const int64_t first = include_pad ? -w.lo[d] : 0, last = include_pad ? w.in[d] + w.hi[d] : w.in[d];
  std::vector<float> counts;
  counts.reserve(w.out[d]);
  for (int64_t o = 0; o < w.out[d]; ++o) {
    int64_t n = 0;
    for (int64_t j = 0; j < w.kernel[d]; ++j) {
      const int64_t p = o * w.stride[d] - w.lo[d] + j * w.dil[d];
      n += (p >= first && p < last);
    }
    counts.push_back(static_cast<float>(n));
  }
  return counts;
}

// The EP's CPU kernel for 2-D float32 pooling (kernels/cpu/kernels.h), or std::nullopt where it
// does not apply (then MLX's ops below).
std::optional<mx::array> cpu_pool(const mx::array& x, const Window& w, bool max, bool include_pad, mx::Stream s) {
  if (w.nd != 2 || x.dtype() != mx::float32) return std::nullopt;
  CpuPool2d g;
  g.max = max;
  if (!max) {
    g.count_h = axis_tap_counts(w, 0, include_pad);
    g.count_w = axis_tap_counts(w, 1, include_pad);
  }
  g.kernel_h = static_cast<int>(w.kernel[0]);
  g.kernel_w = static_cast<int>(w.kernel[1]);
  g.stride_h = static_cast<int>(w.stride[0]);
  g.stride_w = static_cast<int>(w.stride[1]);
  g.dil_h = static_cast<int>(w.dil[0]);
  g.dil_w = static_cast<int>(w.dil[1]);
  g.pad_top = static_cast<int>(w.lo[0]);
  g.pad_left = static_cast<int>(w.lo[1]);
  g.out_h = static_cast<int>(w.out[0]);
  g.out_w = static_cast<int>(w.out[1]);
  if (auto y = cpu_dnnl_blocked_pool(x, g, s)) return y;  // a convolution's blocked output stays blocked
  return cpu_pool_2d(x, g, s);
}

// The value that never wins a max: -inf for floats, the lowest integer otherwise.
mx::array lowest(mx::Dtype t) {
  if (mx::issubdtype(t, mx::floating)) return mx::array(-INFINITY, t);
  return mx::array(mx::iinfo(t).min, t);
}

// AveragePool's divisor: separable over axes, so built as an outer product on the host.
mx::array tap_counts(const Window& w, bool include_pad, mx::Dtype t) {
  std::vector<float> counts{1.f};
  mx::Shape shape;
  for (size_t d = 0; d < w.nd; ++d) {
    std::vector<float> next;
    next.reserve(counts.size() * w.out[d]);
    for (float prev : counts)
      for (float n : axis_tap_counts(w, d, include_pad)) next.push_back(prev * n);
    counts.swap(next);
    shape.push_back(static_cast<int>(w.out[d]));
  }
  return mx::astype(mx::array(counts.begin(), shape, mx::float32), t);
}

// A (dilated) window larger than its padded input: ONNX's formula gives <= 0 outputs, ORT's
// kernel (integer division truncating toward zero) gives 1 for a small overhang, whose window
// then reaches past the declared padding. Declined where the input's spatial sizes are static
// (SAME padding always fits one window); dynamic ones keep ONNX's formula.
Support check_window_fits(const NodeQuery& q) {
  const auto* x = q.input_info(0);
  if (!x || !x->has_shape || x->dims.size() < 3) return Support::yes();
  const size_t nd = x->dims.size() - 2;
  auto auto_pad = q.node.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") return Support::yes();
  auto kernel = q.node.attr_ints("kernel_shape");
  auto dil = q.node.attr_ints("dilations");
  auto pads = q.node.attr_ints("pads");
  for (size_t d = 0; d < nd && d < kernel.size(); ++d) {
    int64_t in = x->dims[2 + d];
    if (in < 0) continue;
    if (auto_pad != "VALID" && pads.size() == 2 * nd) in += pads[d] + pads[nd + d];
    if ((kernel[d] - 1) * (d < dil.size() ? dil[d] : 1) + 1 > in)
      return Support::no("pooling window larger than its padded input (ORT's output size differs "
                         "from ONNX's there)");
  }
  return Support::yes();
}

Support check_pool_common(const NodeQuery& q, bool has_kernel) {
  if (auto s = check_rank(q, 0, 3, 5); !s) return s;
  if (!has_kernel) return Support::yes();
  if (auto s = check_auto_pad(q); !s) return s;
  if (auto s = flag_attr_0_or_1(q, "ceil_mode"); !s) return s;
  if (q.node.attr_ints("kernel_shape").empty()) return Support::no("kernel_shape is required");
  if (auto s = check_spatial_attrs(q); !s) return s;
  return check_window_fits(q);
}

// The flat input index of every element of x (N, C, D..), as ORT's MaxPool reports it:
// (n*C + c) * prod(D) + the spatial offset, row-major (storage_order 0) or column-major (1).
mx::array flat_indices(const mx::array& x, bool column_major, mx::Stream s) {
  const int rank = x.ndim();
  int64_t spatial = 1;
  for (int i = 2; i < rank; ++i) spatial *= x.shape(i);
  mx::Shape bshape(rank, 1);
  bshape[0] = x.shape(0);
  bshape[1] = x.shape(1);
  mx::array idx =
      mx::multiply(mx::reshape(mx::arange(0, x.shape(0) * x.shape(1), mx::int64, s), bshape, s),
                   mx::array(spatial, mx::int64), s);
  int64_t step = 1;
  for (int k = 0; k < rank - 2; ++k) {
    int i = column_major ? 2 + k : rank - 1 - k;  // fastest-varying spatial axis first
    mx::Shape sh(rank, 1);
    sh[i] = x.shape(i);
    auto a = mx::multiply(mx::arange(0, x.shape(i), mx::int64, s), mx::array(step, mx::int64), s);
    idx = mx::add(idx, mx::reshape(a, sh, s), s);
    step *= x.shape(i);
  }
  return mx::broadcast_to(idx, x.shape(), s);
}

}  // namespace

Support check_max_pool(const NodeQuery& q) {
  if (auto s = input_dtype_in(q, 0, kFloat, {DType::Int8, DType::UInt8}); !s) return s;
  if (auto so = q.node.attr_int("storage_order", 0); so != 0 && so != 1)
    return Support::no("storage_order must be 0 or 1");
  return check_pool_common(q, true);
}

Support check_avg_pool(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  return check_pool_common(q, true);
}

Support check_lp_pool(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  return check_pool_common(q, true);
}

Support check_global_pool(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  if (int r = q.input_rank(0); r >= 0 && r < 2) return Support::no("input rank must be >= 2");
  return Support::yes();
}

Outputs translate_max_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  Window w = make_window(c, x);
  bool want_indices = c.node.has_output(1);
  if (w.empty() || x.size() == 0) {
    Outputs out{mx::zeros(pooled_shape(x, w), x.dtype(), c.s)};
    if (want_indices) out.push_back(mx::zeros(pooled_shape(x, w), mx::int64, c.s));
    return out;
  }
  if (!want_indices)
    if (auto y = cpu_pool(x, w, true, false, c.s)) return {*y};
  if (!want_indices && tap_count(w) <= kMaxTaps) return {fold_taps(x, w, lowest(x.dtype()), true, c.s)};
  mx::array v = windows(x, w, 2, lowest(x.dtype()), c.s);
  if (!want_indices) return {mx::max(v, window_axes(w), false, c.s)};
  // Indices: argmax over the flattened window (first maximum, like ORT), then read the flat
  // input index stored at that window position (padding carries -1 and never wins).
  bool column_major = c.node.attr_int("storage_order", 0) == 1;
  mx::array iv = windows(flat_indices(x, column_major, c.s), w, 2, mx::array(-1, mx::int64), c.s);
  mx::Shape flat = pooled_shape(x, w);
  flat.push_back(-1);
  mx::array vf = mx::reshape(v, flat, c.s);
  mx::array am = mx::argmax(vf, -1, true, c.s);
  mx::array idx = mx::take_along_axis(mx::reshape(iv, flat, c.s), am, -1, c.s);
  mx::array y = mx::take_along_axis(vf, am, -1, c.s);
  return {mx::squeeze(y, -1, c.s), mx::squeeze(idx, -1, c.s)};
}

Outputs translate_avg_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  Window w = make_window(c, x);
  if (w.empty() || x.size() == 0) return {mx::zeros(pooled_shape(x, w), x.dtype(), c.s)};
  bool include_pad = c.node.attr_int("count_include_pad", 0) != 0;
  if (auto y = cpu_pool(x, w, false, include_pad, c.s)) return {*y};
  mx::Dtype cd = compute_dtype(x, c.s);
  mx::array xc = mx::astype(x, cd, c.s);
  mx::array sum = tap_count(w) <= kMaxTaps
                      ? fold_taps(xc, w, mx::array(0, cd), false, c.s)
                      : mx::sum(windows(xc, w, 2, mx::array(0, cd), c.s), window_axes(w), false, c.s);
  mx::array y = mx::divide(sum, tap_counts(w, include_pad, cd), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

namespace {
double lp_p(const graph::Node& n) {
  // LpPool-1 / GlobalLpPool-1 had a float p; later versions an int.
  const auto* a = n.attr("p");
  if (!a) return 2.0;
  return a->type == graph::AttrType::Float ? a->f : static_cast<double>(a->i);
}

// (sum |x|^p)^(1/p) over `axes`.
mx::array lp_reduce(const mx::array& x, const std::vector<int>& axes, double p, bool keepdims,
                    mx::Stream s) {
  mx::array a = mx::abs(x, s);
  mx::array sum = p == 2.0 ? mx::sum(mx::square(a, s), axes, keepdims, s)
                           : mx::sum(mx::power(a, mx::array(p, x.dtype()), s), axes, keepdims, s);
  if (p == 2.0) return mx::sqrt(sum, s);
  return mx::power(sum, mx::array(1.0 / p, x.dtype()), s);
}
}  // namespace

Outputs translate_lp_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  Window w = make_window(c, x);
  if (w.empty() || x.size() == 0) return {mx::zeros(pooled_shape(x, w), x.dtype(), c.s)};
  mx::Dtype cd = compute_dtype(x, c.s);
  mx::array v = windows(mx::astype(x, cd, c.s), w, 2, mx::array(0, cd), c.s);
  return {mx::astype(lp_reduce(v, window_axes(w), lp_p(c.node), false, c.s), x.dtype(), c.s)};
}

namespace {
std::vector<int> spatial_axes(const mx::array& x) {
  std::vector<int> a(x.ndim() - 2);
  std::iota(a.begin(), a.end(), 2);
  return a;
}
}  // namespace

Outputs translate_global_avg_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  if (x.ndim() == 2) return {x};
  if (auto y = cpu_dnnl_blocked_global_mean(x, c.s)) return {*y};
  mx::Dtype cd = compute_dtype(x, c.s);
  auto y = mx::mean(mx::astype(x, cd, c.s), spatial_axes(x), true, c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

Outputs translate_global_max_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  if (x.ndim() == 2) return {x};
  return {mx::max(x, spatial_axes(x), true, c.s)};
}

Outputs translate_global_lp_pool(OpContext& c) {
  const mx::array& x = c.in(0);
  if (x.ndim() == 2) return {mx::abs(x, c.s)};
  mx::Dtype cd = compute_dtype(x, c.s);
  auto y = lp_reduce(mx::astype(x, cd, c.s), spatial_axes(x), lp_p(c.node), true, c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

}  // namespace ortmlx::ops::nn
