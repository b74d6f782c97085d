#include "ops/common.h"
#include "ops/switches.h"
#include "kernels/cpu/kernels.h"

#include <mlx/primitives.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace ortmlx::ops {

bool in_set(DType t, std::initializer_list<DType> set) {
  return std::find(set.begin(), set.end(), t) != set.end();
}
bool is_numeric(DType t) { return graph::is_float(t) || graph::is_integer(t); }

Support input_dtype_in(const NodeQuery& q, size_t i, std::initializer_list<DType> a,
                       std::initializer_list<DType> b, std::initializer_list<DType> c,
                       std::initializer_list<DType> d) {
  if (!q.has_input(i)) return Support::yes();
  DType t = q.input_dtype(i);
  if (t == DType::Undefined || in_set(t, a) || in_set(t, b) || in_set(t, c) || in_set(t, d))
    return Support::yes();
  return Support::no("input " + std::to_string(i) + " dtype " + graph::dtype_name(t) +
                     " is not supported");
}
Support float_input(const NodeQuery& q, size_t i) { return input_dtype_in(q, i, kFloat); }
Support numeric_input(const NodeQuery& q, size_t i) {
  return input_dtype_in(q, i, kFloat, kSignedInt, kUnsignedInt);
}
Support constant_input(const NodeQuery& q, size_t i, const char* what) {
  if (!q.has_input(i)) return Support::no(std::string(what) + " input is missing");
  if (!q.constant(i)) return Support::no(std::string(what) + " must be a constant initializer");
  return Support::yes();
}

Support flag_attr_0_or_1(const NodeQuery& q, const char* name) {
  if (!q.node.has_attr(name)) return Support::yes();
  if (auto v = q.node.attr_int(name, 0); v != 0 && v != 1)
    return Support::no(std::string(name) + " must be 0 or 1 (got " + std::to_string(v) + ")");
  return Support::yes();
}

mx::array cast_to(const mx::array& a, DType t, mx::StreamOrDevice s) {
  auto d = mlx_dtype(t);
  return a.dtype() == d ? a : mx::astype(a, d, s);
}

namespace {
thread_local TranslationSwitches current_switches;
}  // namespace

const TranslationSwitches& translation_switches() { return current_switches; }

SwitchesScope::SwitchesScope(const TranslationSwitches& s)
    : prev_(current_switches), kernels_(s.cpu_kernels, s.cpu_avx512) {
  current_switches = s;
}
SwitchesScope::~SwitchesScope() { current_switches = prev_; }

namespace {
thread_local double work_flops = 0;
thread_local bool work_split = false;
thread_local bool work_one_thread = false;
}  // namespace

std::optional<mx::array> blocked_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, mx::Stream s) {
  // (the chain kernel's loop is AVX-512's; elsewhere MLX's generated kernel, vectorized for the
  // machine, stays)
  if (s.device != mx::Device::cpu || x.dtype() != mx::float32 || x.ndim() != 4 || !cpu_avx512_kernels())
    return std::nullopt;
  const bool split = parallel_work(static_cast<double>(x.size()) * static_cast<double>(steps.size()));
  return cpu_dnnl_blocked_steps(x, steps, split, s);
}

std::optional<mx::array> channel_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, mx::Stream s,
                                       bool continuing) {
  // Smaller activations stay MLX's (fused into their neighbours' generated kernels).
  constexpr size_t kMinElements = size_t{1} << 16;
  if (s.device != mx::Device::cpu || x.dtype() != mx::float32 || x.ndim() != 4 || x.size() < kMinElements ||
      (continuing && !cpu_is_channel_steps(x)) || !cpu_avx512_kernels())
    return std::nullopt;
  const bool split = parallel_work(static_cast<double>(x.size()) * static_cast<double>(steps.size()));
  return cpu_channel_steps(x, steps, split, s);
}

bool parallel_work(double flops) {
  work_flops += flops;
  const bool split = !work_one_thread && flops >= static_cast<double>(current_switches.cpu_conv_parallel_min_flops);
  work_split = work_split || split;
  return split;
}

WorkScope::WorkScope(bool one_thread)
    : prev_flops_(work_flops), prev_split_(work_split), prev_one_thread_(work_one_thread) {
  work_flops = 0;
  work_split = false;
  work_one_thread = one_thread;
}
WorkScope::~WorkScope() {  // the enclosing scope counts this one's work too
  work_flops += prev_flops_;
  work_split = work_split || prev_split_;
  work_one_thread = prev_one_thread_;
}
double WorkScope::flops() const { return work_flops; }
bool WorkScope::split() const { return work_split; }

bool compute_half_in_f32(const mx::array& a, mx::Stream s) {
  return s.device == mx::Device::cpu && (a.dtype() == mx::float16 || a.dtype() == mx::bfloat16);
}

namespace {
constexpr size_t kKnownZeroMaxElements = size_t{1} << 16;

bool evaluated_all_zero(const mx::array& a) {
  if (a.size() > kKnownZeroMaxElements || !a.flags().row_contiguous) return false;
  auto all = [&](auto* p) { return std::all_of(p, p + a.size(), [](auto x) { return x == decltype(x)(0); }); };
  switch (a.dtype().val()) {
    case mx::Dtype::Val::float16: return all(a.data<mx::float16_t>());
    case mx::Dtype::Val::bfloat16: return all(a.data<mx::bfloat16_t>());
    case mx::Dtype::Val::float32: return all(a.data<float>());
    case mx::Dtype::Val::bool_: return all(a.data<bool>());
    default: return false;
  }
}
}  // namespace

bool known_all_zero(const mx::array& a) {
  if (a.is_available()) return evaluated_all_zero(a);
  if (!a.has_primitive() || a.inputs().empty()) return false;
  static const char* const kPreserving[] = {"Reshape", "Broadcast", "BroadcastAxes", "ExpandDims",
                                            "Squeeze", "Transpose", "AsType", "Contiguous", "Copy",
                                            "Flatten", "Unflatten", "Slice", "Concatenate", "Pad"};
  const std::string name = a.primitive().name();
  if (std::none_of(std::begin(kPreserving), std::end(kPreserving), [&](const char* p) { return name == p; }))
    return false;
  // Pad's inputs are the array and the pad value: both zero. Every other op here maps zeros to
  // zeros (a cast of 0 is 0 in any dtype).
  return std::all_of(a.inputs().begin(), a.inputs().end(), [](const mx::array& in) { return known_all_zero(in); });
}

mx::array concat_nonempty(std::vector<mx::array> xs, int axis, mx::Stream s) {
  if (xs.empty()) throw std::invalid_argument("concatenation of no arrays");
  // Only inputs empty *along the axis*: one empty in another dimension does not fit the others
  // (an invalid Concat) and must still fail in mx::concatenate, not vanish.
  const int rank = static_cast<int>(xs[0].ndim()), ax = axis < 0 ? axis + rank : axis;
  const auto empty_along_axis = [ax](const mx::array& x) {
    return ax >= 0 && ax < static_cast<int>(x.ndim()) && x.shape(ax) == 0;
  };
  const size_t given = xs.size();
  if (std::any_of(xs.begin(), xs.end(), [](const mx::array& x) { return x.size() > 0; }))
    std::erase_if(xs, empty_along_axis);
  // One input left of several (a first prompt's new keys after its empty past): made
  // row-contiguous as a concatenation would make it, since it is usually a transposed view and
  // its consumers (present output, repeat_kv reshapes) would each copy it otherwise.
  if (xs.size() == 1) return given == 1 ? xs[0] : mx::contiguous(xs[0], false, s);
  if (auto y = cpu_dnnl_blocked_concat(xs, axis, s)) return *y;
  if (auto y = cpu_concat(xs, axis, s)) return *y;
  return mx::concatenate(std::move(xs), axis, s);
}

mx::array scalar_like(double v, const mx::array& like) { return mx::array(v, like.dtype()); }

std::vector<int> to_axes(const std::vector<int64_t>& axes, int rank) {
  std::vector<int> out;
  out.reserve(axes.size());
  for (auto a : axes) out.push_back(norm_axis(a, rank));
  return out;
}

namespace {
mx::Shape rows_shape(const mx::array& a) {
  if (a.ndim() == 0) throw std::invalid_argument("rows of a scalar");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < a.ndim(); ++i) rows *= a.shape(static_cast<int>(i));
  if (rows > INT32_MAX) throw std::invalid_argument("more rows than MLX's int32 shapes hold");
  return {static_cast<int>(rows), a.shape(-1)};
}
}  // namespace

std::optional<mx::array> rows_source(const mx::array& a) {
  const mx::Shape want = rows_shape(a);
  if (a.shape() == want) return a;
  if (!translation_switches().flat_products) return std::nullopt;
  static const char* const kReshapes[] = {"Reshape", "Flatten", "Unflatten", "ExpandDims", "Squeeze"};
  const mx::array* x = &a;
  for (int depth = 0; depth < 8; ++depth) {
    if (x->is_available() || !x->has_primitive() || x->inputs().size() != 1) break;
    const std::string name = x->primitive().name();
    if (std::none_of(std::begin(kReshapes), std::end(kReshapes), [&](const char* n) { return name == n; })) break;
    const auto& in = x->inputs()[0];
    if (in.size() != a.size() || in.dtype() != a.dtype()) break;
    if (in.shape() == want) return in;
    x = &in;
  }
  return std::nullopt;
}

mx::array as_rows(const mx::array& a, mx::Stream s) {
  if (auto r = rows_source(a)) return *r;
  return mx::reshape(a, rows_shape(a), s);
}

std::optional<std::vector<mx::array>> same_rows(std::initializer_list<mx::array> xs) {
  if (xs.size() == 0 || xs.begin()->ndim() <= 2) return std::nullopt;
  std::vector<mx::array> rows;
  for (const auto& x : xs) {
    if (x.shape() != xs.begin()->shape()) return std::nullopt;
    auto r = rows_source(x);
    if (!r) return std::nullopt;
    rows.push_back(std::move(*r));
  }
  return rows;
}

mx::array rows_to(const mx::array& y, const mx::array& like, mx::Stream s) {
  mx::Shape shape = like.shape();
  shape.back() = y.shape(-1);
  return y.shape() == shape ? y : mx::reshape(y, std::move(shape), s);
}

mx::array erf_of(const mx::array& x, mx::Stream s) {
  if (auto y = cpu_unary(CpuUnary::Erf, x, s)) return *y;
  return mx::erf(x, s);
}

// float64: tanh(x) = 1 - 2 / (exp(2x) + 1) through exp_precise (MLX's float64 tanh is only
// float32-accurate).
mx::array tanh_precise(const mx::array& x, mx::Stream s) {
  if (auto y = cpu_unary(CpuUnary::Tanh, x, s)) return *y;
  if (x.dtype() != mx::float64) return mx::tanh(x, s);
  auto e = exp_precise(mx::multiply(x, mx::array(2.0, x.dtype()), s), s);
  auto one = mx::array(1.0, x.dtype());
  return mx::subtract(one, mx::divide(mx::array(2.0, x.dtype()), mx::add(e, one, s), s), s);
}

mx::array gelu_erf(const mx::array& x, mx::Stream s) {
  if (auto y = cpu_unary(CpuUnary::Gelu, x, s)) return *y;
  auto t = x.dtype();
  auto inner = mx::erf(mx::multiply(x, mx::array(M_SQRT1_2, t), s), s);
  return mx::multiply(mx::multiply(x, mx::array(0.5, t), s), mx::add(inner, mx::array(1.0, t), s), s);
}

mx::array exp_precise(const mx::array& x, mx::Stream s) {
  if (auto y = cpu_unary(CpuUnary::Exp, x, s)) return *y;
  if (x.dtype() != mx::float64) return mx::exp(x, s);
  return mx::power(mx::array(M_E, mx::float64), x, s);
}

mx::array sigmoid_precise(const mx::array& x, mx::Stream s) {
  if (auto y = cpu_unary(CpuUnary::Sigmoid, x, s)) return *y;
  if (x.dtype() != mx::float64) return mx::sigmoid(x, s);
  return mx::reciprocal(mx::add(mx::array(1.0, mx::float64), exp_precise(mx::negative(x, s), s), s), s);
}

// max-shifted; a row whose max is infinite shifts by 0 so -inf rows give -inf, +inf gives +inf
mx::array logsumexp_precise(const mx::array& x, const std::vector<int>& axes, bool keepdims,
                            mx::Stream s) {
  if (x.dtype() != mx::float64) return mx::logsumexp(x, axes, keepdims, s);
  auto m = mx::max(x, axes, true, s);
  m = mx::where(mx::isfinite(m, s), m, mx::array(0.0, mx::float64), s);
  auto r = mx::add(mx::log(mx::sum(exp_precise(mx::subtract(x, m, s), s), axes, true, s), s), m, s);
  return keepdims ? r : mx::squeeze(r, axes, s);
}

mx::array softmax_precise(const mx::array& x, int axis, mx::Stream s) {
  if (axis == -1 || axis == static_cast<int>(x.ndim()) - 1)
    if (auto y = cpu_softmax_last_axis(x, s)) return *y;  // AVX2 rows on the CPU (kernels/cpu/kernels.h)
  if (x.dtype() != mx::float64) return mx::softmax(x, axis, /*precise=*/true, s);
  auto e = exp_precise(mx::subtract(x, mx::max(x, axis, true, s), s), s);
  return mx::divide(e, mx::sum(e, axis, true, s), s);
}

}  // namespace ortmlx::ops
