// Elementwise binary/unary math, comparisons and logic. MLX broadcasts multidirectionally like
// numpy, which is exactly ONNX's rule, so binary ops need no shape handling of their own.
#include <cmath>

#include "graph/fuse_swiglu.h"
#include "kernels/cpu/kernels.h"
#include "ops/common.h"

namespace ortmlx::ops {

namespace {

using BinaryFn = mx::array (*)(const mx::array&, const mx::array&, mx::StreamOrDevice);
using UnaryFn = mx::array (*)(const mx::array&, mx::StreamOrDevice);

template <BinaryFn F>
Outputs binary(OpContext& c) {
  if (auto r = same_rows({c.in(0), c.in(1)})) return {rows_to(F((*r)[0], (*r)[1], c.s), c.in(0), c.s)};
  return {F(c.in(0), c.in(1), c.s)};
}

// A convolution's blocked output times or plus a per-channel parameter stays blocked on the CPU
// (kernels.h, cpu_dnnl_blocked_channel_map), either operand order.
template <BinaryFn F>
std::optional<mx::array> blocked_by_channel(OpContext& c, CpuBlockedStep::Kind kind) {
  for (int x : {0, 1})
    if (auto y = blocked_steps(c.in(x), {{kind, c.in(1 - x)}}, c.s)) return y;
  // (a large NCHW activation by a per-channel parameter: a ConvTranspose's bias, a BN's affine)
  for (int x : {0, 1})
    if (c.in(x).ndim() == 4 && c.in(1 - x).size() < c.in(x).size())
      if (auto y = channel_steps(c.in(x), {{kind, c.in(1 - x)}}, c.s)) return y;
  for (int x : {0, 1}) {
    auto f = [&](const std::vector<mx::array>& a) { return F(x == 0 ? a[0] : a[1], x == 0 ? a[1] : a[0], c.s); };
    if (auto y = cpu_dnnl_blocked_channel_map(c.in(x), {c.in(1 - x)}, f, c.s)) return y;
  }
  return std::nullopt;
}

// Add of two convolutions' blocked outputs (a residual) stays blocked on the CPU (kernels.h,
// cpu_dnnl_blocked_map), as does a per-channel shift of one; anything else as binary<mx::add>.
Outputs translate_add(OpContext& c) {
  if (auto y = blocked_steps(c.in(0), {{CpuBlockedStep::Kind::AddBuffer, c.in(1)}}, c.s)) return {*y};
  auto f = [&](const std::vector<mx::array>& b) { return mx::add(b[0], b[1], c.s); };
  if (auto y = cpu_dnnl_blocked_map({c.in(0), c.in(1)}, f, c.s)) return {*y};
  if (auto y = blocked_by_channel<mx::add>(c, CpuBlockedStep::Kind::AddChannel)) return {*y};
  return binary<mx::add>(c);
}

Outputs translate_mul(OpContext& c) {
  if (c.node.has_attr(graph::kMulSwiGlu)) {  // g * sigmoid(g) * up (graph/fuse_swiglu.h)
    const auto& g = c.in(0);
    if (auto y = cpu_swiglu(g, c.in(1), c.s)) return {*y};
    return {mx::multiply(mx::multiply(g, sigmoid_precise(g, c.s), c.s), c.in(1), c.s)};
  }
  if (auto y = blocked_by_channel<mx::multiply>(c, CpuBlockedStep::Kind::MulChannel)) return {*y};
  return binary<mx::multiply>(c);
}

template <UnaryFn F>
Outputs unary(OpContext& c) {
  if (auto r = same_rows({c.in(0)})) return {rows_to(F((*r)[0], c.s), c.in(0), c.s)};
  return {F(c.in(0), c.s)};
}

// Variadic Sum/Max/Min/Mean (numpy broadcasting across all inputs).
template <BinaryFn F>
Outputs variadic(OpContext& c) {
  mx::array acc = c.in(0);
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.has(i)) acc = F(acc, c.in(i), c.s);
  return {acc};
}

// Variadic Sum the same way (the ResNets exported from Caffe2 add their residuals with Sum).
Outputs translate_sum(OpContext& c) {
  std::vector<mx::array> xs;
  for (size_t i = 0; i < c.num_inputs(); ++i)
    if (c.has(i)) xs.push_back(c.in(i));
  auto f = [&](const std::vector<mx::array>& b) {
    mx::array acc = b[0];
    for (size_t i = 1; i < b.size(); ++i) acc = mx::add(acc, b[i], c.s);
    return acc;
  };
  std::vector<CpuBlockedStep> rest;
  for (size_t i = 1; i < xs.size(); ++i) rest.push_back({CpuBlockedStep::Kind::AddBuffer, xs[i]});
  if (xs.size() > 1)
    if (auto y = blocked_steps(xs[0], rest, c.s)) return {*y};
  if (xs.size() > 1)
    if (auto y = cpu_dnnl_blocked_map(xs, f, c.s)) return {*y};
  return variadic<mx::add>(c);
}

Outputs translate_mean(OpContext& c) {
  auto sum = variadic<mx::add>(c)[0];
  return {mx::divide(sum, mx::array(static_cast<float>(c.num_inputs()), sum.dtype()), c.s)};
}

// ONNX Div on integers truncates toward zero (C semantics); MLX's divide on ints returns float
// (true division), and floor_divide floors. Truncate explicitly for signed ints.
Outputs translate_div(OpContext& c) {
  const auto& a = c.in(0);
  const auto& b = c.in(1);
  if (mx::issubdtype(a.dtype(), mx::integer)) {
    auto q = mx::floor_divide(a, b, c.s);
    if (mx::issubdtype(a.dtype(), mx::signedinteger)) {
      // floor -> trunc: add one where the signs differ and the division is inexact
      auto r = mx::remainder(a, b, c.s);
      auto zero = mx::array(0, a.dtype());
      auto fix = mx::logical_and(mx::not_equal(r, zero, c.s),
                                 mx::not_equal(mx::less(a, zero, c.s), mx::less(b, zero, c.s), c.s), c.s);
      q = mx::where(fix, mx::add(q, mx::array(1, a.dtype()), c.s), q, c.s);
    }
    return {q};
  }
  return {mx::divide(a, b, c.s)};
}

// Mod: fmod=0 is Python-style (sign of divisor) for integers; fmod=1 is C fmod (sign of dividend).
Outputs translate_mod(OpContext& c) {
  const auto& a = c.in(0);
  const auto& b = c.in(1);
  if (c.node.attr_int("fmod", 0) == 0) return {mx::remainder(a, b, c.s)};
  // fmod(a, b) = a - trunc(a / b) * b: MLX's remainder has the divisor's sign (Python style),
  // so move results whose sign differs from the dividend's back by one divisor.
  auto r = mx::remainder(a, b, c.s);
  auto zero = mx::array(0, a.dtype());
  auto fix = mx::logical_and(mx::not_equal(r, zero, c.s),
                             mx::not_equal(mx::less(a, zero, c.s), mx::less(b, zero, c.s), c.s), c.s);
  return {mx::where(fix, mx::subtract(r, b, c.s), r, c.s)};
}

Outputs translate_pow(OpContext& c) {
  const auto& base = c.in(0);
  auto expo = c.in(1);
  // ONNX: output dtype = base dtype; the exponent may have another numeric type.
  // Integer base: ORT's CPU kernel computes std::pow in double and casts the result back, which
  // truncates toward zero (3^-0.13 -> 0, 7^0.5 -> 2, 2^-1 -> 0). On the CPU stream this does the
  // same in float64 (astype truncates like static_cast). The GPU has no float64: there only integer
  // exponents reach here (check_pow declines float ones), whose exact results float32 can miss
  // by an ulp, so they are rounded instead of truncated.
  if (mx::issubdtype(base.dtype(), mx::integer)) {
    if (c.s.device == mx::Device::cpu) {
      auto r = mx::power(mx::astype(base, mx::float64, c.s), mx::astype(expo, mx::float64, c.s), c.s);
      return {mx::astype(r, base.dtype(), c.s)};
    }
    auto r = mx::power(mx::astype(base, mx::float32, c.s), mx::astype(expo, mx::float32, c.s), c.s);
    return {mx::astype(mx::round(r, 0, c.s), base.dtype(), c.s)};
  }
  // A constant exponent of 2 (a magnitude's squares) as x * x, as ORT's CPU kernel computes it
  // (for a base of more than one element): exact, where powf is not always, and a product MLX's
  // CPU backend vectorizes.
  if (c.is_constant(1) && expo.size() == 1 && base.size() != 1 && c.host_float(1) == 2.0) {
    auto y = mx::square(base, c.s);
    if (expo.ndim() <= base.ndim()) return {y};
    mx::Shape shape(expo.ndim() - base.ndim(), 1);  // a higher-rank exponent adds leading 1s
    shape.insert(shape.end(), base.shape().begin(), base.shape().end());
    return {mx::reshape(y, shape, c.s)};
  }
  return {mx::power(base, mx::astype(expo, base.dtype(), c.s), c.s)};
}

// Min/Max propagate NaN in ONNX (like numpy); MLX's minimum/maximum do too.
Outputs translate_where(OpContext& c) {
  return {mx::where(mx::astype(c.in(0), mx::bool_, c.s), c.in(1), c.in(2), c.s)};
}

Outputs translate_not(OpContext& c) { return {mx::logical_not(c.in(0), c.s)}; }
Outputs translate_xor(OpContext& c) { return {mx::not_equal(c.in(0), c.in(1), c.s)}; }

Outputs translate_sign(OpContext& c) { return {mx::sign(c.in(0), c.s)}; }
Outputs translate_reciprocal(OpContext& c) { return {mx::reciprocal(c.in(0), c.s)}; }
Outputs translate_round(OpContext& c) { return {mx::round(c.in(0), 0, c.s)}; }  // half to even

Outputs translate_isnan(OpContext& c) { return {mx::isnan(c.in(0), c.s)}; }
Outputs translate_isinf(OpContext& c) {
  const auto& x = c.in(0);
  bool pos = c.node.attr_int("detect_positive", 1), neg = c.node.attr_int("detect_negative", 1);
  if (pos && neg) return {mx::isinf(x, c.s)};
  if (pos) return {mx::isposinf(x, c.s)};
  if (neg) return {mx::isneginf(x, c.s)};
  return {mx::zeros(x.shape(), mx::bool_, c.s)};
}

// Clip: min/max as inputs (opset 11+) or attributes (< 11); absent bound = no bound.
Outputs translate_clip(OpContext& c) {
  mx::array x = c.in(0);
  if (c.node.since_version < 11) {
    float lo = c.node.attr_float("min", -INFINITY), hi = c.node.attr_float("max", INFINITY);
    if (std::isfinite(lo)) x = mx::maximum(x, mx::array(lo, x.dtype()), c.s);
    if (std::isfinite(hi)) x = mx::minimum(x, mx::array(hi, x.dtype()), c.s);
    return {x};
  }
  if (c.has(1)) x = mx::maximum(x, mx::astype(c.in(1), x.dtype(), c.s), c.s);
  if (c.has(2)) x = mx::minimum(x, mx::astype(c.in(2), x.dtype(), c.s), c.s);
  return {x};
}

Outputs translate_bitshift(OpContext& c) {
  bool left = c.node.attr_string("direction", "") == "LEFT";
  return {left ? mx::left_shift(c.in(0), c.in(1), c.s) : mx::right_shift(c.in(0), c.in(1), c.s)};
}

Support check_numeric(const NodeQuery& q) { return numeric_input(q, 0); }
// MLX's float64 sin/cos/tan/erf are only float32-accurate on the CPU backend (measured: cos 7e-4,
// erf 9e-4 relative error), so float64 stays on ORT's CPU EP for these.
Support check_float_not_f64(const NodeQuery& q) {
  if (q.input_dtype(0) == DType::Float64)
    return Support::no("MLX computes float64 " + q.node.op_type + " at float32 accuracy");
  return float_input(q, 0);
}
Outputs translate_exp(OpContext& c) { return {exp_precise(c.in(0), c.s)}; }
Outputs translate_erf(OpContext& c) { return {erf_of(c.in(0), c.s)}; }
Support check_float(const NodeQuery& q) { return float_input(q, 0); }
Support check_signed(const NodeQuery& q) {
  return input_dtype_in(q, 0, kFloat, kSignedInt);
}
Support check_bool(const NodeQuery& q) { return input_dtype_in(q, 0, {DType::Bool}); }
Support check_integer(const NodeQuery& q) { return input_dtype_in(q, 0, kSignedInt, kUnsignedInt); }
Support check_compare(const NodeQuery& q) {
  return input_dtype_in(q, 0, kFloat, kSignedInt, kUnsignedInt, {DType::Bool});
}
Support check_mod(const NodeQuery& q) {
  if (auto s = numeric_input(q, 0); !s) return s;
  // Python-style modulo on floats is undefined by ONNX (fmod must be 1 for floats).
  if (graph::is_float(q.input_dtype(0)) && q.node.attr_int("fmod", 0) == 0)
    return Support::no("Mod with fmod=0 on floats is invalid ONNX");
  return Support::yes();
}
Support check_pow(const NodeQuery& q) {
  if (auto s = input_dtype_in(q, 0, kFloat, {DType::Int32, DType::Int64}); !s) return s;
  if (auto s = numeric_input(q, 1); !s) return s;
  if (q.gpu && graph::is_integer(q.input_dtype(0)) && graph::is_float(q.input_dtype(1)))
    return Support::no("integer Pow with a float exponent truncates a float64 result (CPU only)");
  return Support::yes();
}
Support check_isinf(const NodeQuery& q) { return float_input(q, 0); }
Support check_bitshift(const NodeQuery& q) { return input_dtype_in(q, 0, kUnsignedInt); }
Support check_where(const NodeQuery& q) { return input_dtype_in(q, 0, {DType::Bool}); }

const OpEntry kOps[] = {
    // arithmetic (numpy broadcasting)
    {"", "Add", 1, kAnyOpset, check_numeric, translate_add},
    {"", "Sub", 1, kAnyOpset, check_numeric, binary<mx::subtract>},
    {"", "Mul", 1, kAnyOpset, check_numeric, translate_mul},
    {"", "Div", 1, kAnyOpset, check_numeric, translate_div},
    {"", "Pow", 1, kAnyOpset, check_pow, translate_pow},
    {"", "Mod", 10, kAnyOpset, check_mod, translate_mod},
    {"", "Max", 1, kAnyOpset, check_numeric, variadic<mx::maximum>},
    {"", "Min", 1, kAnyOpset, check_numeric, variadic<mx::minimum>},
    {"", "Sum", 1, kAnyOpset, check_numeric, translate_sum},
    {"", "Mean", 1, kAnyOpset, check_float, translate_mean},
    // unary math
    {"", "Neg", 1, kAnyOpset, check_signed, unary<mx::negative>},
    {"", "Abs", 1, kAnyOpset, check_numeric, unary<mx::abs>},
    {"", "Sqrt", 1, kAnyOpset, check_float, unary<mx::sqrt>},
    {"", "Exp", 1, kAnyOpset, check_float, translate_exp},
    {"", "Log", 1, kAnyOpset, check_float, unary<mx::log>},
    {"", "Reciprocal", 1, kAnyOpset, check_float, translate_reciprocal},
    {"", "Floor", 1, kAnyOpset, check_float, unary<mx::floor>},
    {"", "Ceil", 1, kAnyOpset, check_float, unary<mx::ceil>},
    {"", "Round", 11, kAnyOpset, check_float, translate_round},
    {"", "Sign", 9, kAnyOpset, check_numeric, translate_sign},
    // float64 Erf stays claimed: ORT's CPU EP has no float64 Erf kernel to fall back to.
    {"", "Erf", 9, kAnyOpset, check_float, translate_erf,
     "float64 is computed at MLX's float32 erf accuracy (~1e-3 relative)"},
    {"", "Sin", 7, kAnyOpset, check_float_not_f64, unary<mx::sin>,
     "float64 declined: MLX computes it at float32 accuracy"},
    {"", "Cos", 7, kAnyOpset, check_float_not_f64, unary<mx::cos>,
     "float64 declined: MLX computes it at float32 accuracy"},
    {"", "Tan", 7, kAnyOpset, check_float_not_f64, unary<mx::tan>,
     "float64 declined: MLX computes it at float32 accuracy"},
    {"", "Asin", 7, kAnyOpset, check_float, unary<mx::arcsin>},
    {"", "Acos", 7, kAnyOpset, check_float, unary<mx::arccos>},
    {"", "Atan", 7, kAnyOpset, check_float, unary<mx::arctan>},
    {"", "Sinh", 9, kAnyOpset, check_float, unary<mx::sinh>},
    {"", "Cosh", 9, kAnyOpset, check_float, unary<mx::cosh>},
    {"", "Asinh", 9, kAnyOpset, check_float, unary<mx::arcsinh>},
    {"", "Acosh", 9, kAnyOpset, check_float, unary<mx::arccosh>},
    {"", "Atanh", 9, kAnyOpset, check_float, unary<mx::arctanh>},
    {"", "IsNaN", 9, kAnyOpset, check_float, translate_isnan},
    {"", "IsInf", 10, kAnyOpset, check_isinf, translate_isinf},
    {"", "Clip", 6, kAnyOpset, check_numeric, translate_clip},
    // comparison and logic
    {"", "Equal", 1, kAnyOpset, check_compare, binary<mx::equal>},
    {"", "Less", 1, kAnyOpset, check_numeric, binary<mx::less>},
    {"", "LessOrEqual", 12, kAnyOpset, check_numeric, binary<mx::less_equal>},
    {"", "Greater", 1, kAnyOpset, check_numeric, binary<mx::greater>},
    {"", "GreaterOrEqual", 12, kAnyOpset, check_numeric, binary<mx::greater_equal>},
    {"", "And", 1, kAnyOpset, check_bool, binary<mx::logical_and>},
    {"", "Or", 1, kAnyOpset, check_bool, binary<mx::logical_or>},
    {"", "Xor", 1, kAnyOpset, check_bool, translate_xor},
    {"", "Not", 1, kAnyOpset, check_bool, translate_not},
    {"", "Where", 9, kAnyOpset, check_where, translate_where},
    {"", "BitwiseAnd", 18, kAnyOpset, check_integer, binary<mx::bitwise_and>},
    {"", "BitwiseOr", 18, kAnyOpset, check_integer, binary<mx::bitwise_or>},
    {"", "BitwiseXor", 18, kAnyOpset, check_integer, binary<mx::bitwise_xor>},
    {"", "BitwiseNot", 18, kAnyOpset, check_integer, unary<mx::bitwise_invert>},
    {"", "BitShift", 11, kAnyOpset, check_bitshift, translate_bitshift},
};

}  // namespace

std::span<const OpEntry> elementwise_ops() { return kOps; }

}  // namespace ortmlx::ops
