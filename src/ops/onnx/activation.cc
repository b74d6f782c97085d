// Activation functions. All are elementwise compositions of MLX ops; scalar parameters are
// made in the input's dtype so MLX's type promotion never widens the result. Half inputs on the
// CPU backend are computed in float32 and cast back (compute_half_in_f32); float64 avoids MLX's
// float32-accurate exp (exp_precise in common.h).
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "ops/common.h"

namespace ortmlx::ops {

namespace {

using ActFn = mx::array (*)(const OpContext&, const mx::array&);

template <ActFn F>
Outputs act(OpContext& c) {
  const mx::array& x = c.in(0);
  if (compute_half_in_f32(x, c.s))
    return {mx::astype(F(c, mx::astype(x, mx::float32, c.s)), x.dtype(), c.s)};
  if (auto r = same_rows({x})) return {rows_to(F(c, (*r)[0]), x, c.s)};
  return {F(c, x)};
}

mx::array sc(double v, const mx::array& like) { return scalar_like(v, like); }
float attr(const OpContext& c, const char* name, float def) { return c.node.attr_float(name, def); }

mx::array relu(const OpContext& c, const mx::array& x) {
  // a convolution's blocked output stays blocked through it (kernels.h, cpu_dnnl_blocked_map)
  if (auto y = blocked_steps(x, {{CpuBlockedStep::Kind::Relu, std::nullopt}}, c.s)) return *y;
  if (auto y = channel_steps(x, {{CpuBlockedStep::Kind::Relu, std::nullopt}}, c.s, /*continuing=*/true)) return *y;
  auto f = [&](const std::vector<mx::array>& b) { return mx::maximum(b[0], sc(0, b[0]), c.s); };
  if (auto y = cpu_dnnl_blocked_map({x}, f, c.s)) return *y;
  return mx::maximum(x, sc(0, x), c.s);
}

mx::array leaky_relu(const OpContext& c, const mx::array& x) {
  auto alpha = sc(attr(c, "alpha", 0.01f), x);
  return mx::where(mx::less(x, sc(0, x), c.s), mx::multiply(alpha, x, c.s), x, c.s);
}

mx::array sigmoid(const OpContext& c, const mx::array& x) { return sigmoid_precise(x, c.s); }
mx::array tanh_(const OpContext& c, const mx::array& x) { return tanh_precise(x, c.s); }

// clamp(alpha * x + beta, 0, 1)
mx::array hard_sigmoid_core(const OpContext& c, const mx::array& x, double alpha, double beta) {
  auto y = mx::add(mx::multiply(sc(alpha, x), x, c.s), sc(beta, x), c.s);
  return mx::minimum(mx::maximum(y, sc(0, x), c.s), sc(1, x), c.s);
}
mx::array hard_sigmoid(const OpContext& c, const mx::array& x) {
  return hard_sigmoid_core(c, x, attr(c, "alpha", 0.2f), attr(c, "beta", 0.5f));
}
mx::array hard_swish(const OpContext& c, const mx::array& x) {
  return mx::multiply(x, hard_sigmoid_core(c, x, 1.0 / 6.0, 0.5), c.s);
}

// log(1 + exp(x)) without overflow
mx::array softplus(const OpContext& c, const mx::array& x) {
  if (x.dtype() != mx::float64) return mx::logaddexp(x, sc(0, x), c.s);
  // max(x, 0) + log1p(exp(-|x|))
  auto t = mx::log1p(exp_precise(mx::negative(mx::abs(x, c.s), c.s), c.s), c.s);
  return mx::add(mx::maximum(x, sc(0, x), c.s), t, c.s);
}
mx::array softsign(const OpContext& c, const mx::array& x) {
  return mx::divide(x, mx::add(sc(1, x), mx::abs(x, c.s), c.s), c.s);
}

// x > 0 ? x : alpha * (exp(x) - 1)
mx::array elu_core(const OpContext& c, const mx::array& x, float alpha) {
  auto neg = mx::multiply(sc(alpha, x), mx::expm1(x, c.s), c.s);
  return mx::where(mx::greater(x, sc(0, x), c.s), x, neg, c.s);
}
mx::array elu(const OpContext& c, const mx::array& x) { return elu_core(c, x, attr(c, "alpha", 1.f)); }
mx::array selu(const OpContext& c, const mx::array& x) {
  // Opset 1 had less precise defaults than opset 6.
  bool v1 = c.node.since_version < 6;
  float alpha = attr(c, "alpha", v1 ? 1.673200011253357f : 1.6732631921768188f);
  float gamma = attr(c, "gamma", v1 ? 1.0506999492645264f : 1.0507010221481323f);
  return mx::multiply(sc(gamma, x), elu_core(c, x, alpha), c.s);
}
// max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
mx::array celu(const OpContext& c, const mx::array& x) {
  float alpha = attr(c, "alpha", 1.f);
  auto e = mx::multiply(sc(alpha, x), mx::expm1(mx::divide(x, sc(alpha, x), c.s), c.s), c.s);
  return mx::add(mx::maximum(x, sc(0, x), c.s), mx::minimum(e, sc(0, x), c.s), c.s);
}
mx::array thresholded_relu(const OpContext& c, const mx::array& x) {
  auto alpha = sc(attr(c, "alpha", 1.f), x);
  return mx::where(mx::greater(x, alpha, c.s), x, sc(0, x), c.s);
}
mx::array mish(const OpContext& c, const mx::array& x) {
  return mx::multiply(x, tanh_precise(softplus(c, x), c.s), c.s);
}

mx::array gelu(const OpContext& c, const mx::array& x) {
  if (c.node.attr_string("approximate", "none") == "tanh") {
    auto half_x = mx::multiply(sc(0.5, x), x, c.s);
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    auto x3 = mx::multiply(mx::multiply(x, x, c.s), x, c.s);
    auto inner = mx::multiply(sc(std::sqrt(2.0 / M_PI), x),
                              mx::add(x, mx::multiply(sc(0.044715, x), x3, c.s), c.s), c.s);
    return mx::multiply(half_x, mx::add(sc(1, x), tanh_precise(inner, c.s), c.s), c.s);
  }
  return gelu_erf(x, c.s);  // 0.5 x (1 + erf(x / sqrt(2)))
}

mx::array swish(const OpContext& c, const mx::array& x) {
  auto alpha = sc(attr(c, "alpha", 1.f), x);
  return mx::multiply(x, sigmoid_precise(mx::multiply(alpha, x, c.s), c.s), c.s);
}

Support check_gelu(const NodeQuery& q) {
  auto approx = q.node.attr_string("approximate", "none");
  if (approx != "none" && approx != "tanh") return Support::no("unknown approximate '" + approx + "'");
  if (approx == "none" && q.input_dtype(0) == DType::Float64)
    return Support::no("MLX's float64 erf is only float32-accurate");
  return float_input(q, 0);
}

// PRelu: slope broadcasts unidirectionally to X (the output has X's shape).
Outputs translate_prelu(OpContext& c) {
  const mx::array& x = c.in(0);
  mx::array slope = mx::astype(c.in(1), x.dtype(), c.s);
  if (mx::broadcast_shapes(x.shape(), slope.shape()) != x.shape())
    c.fail("slope does not broadcast to the input's shape");
  bool up = compute_half_in_f32(x, c.s);
  mx::array xx = up ? mx::astype(x, mx::float32, c.s) : x;
  if (up) slope = mx::astype(slope, mx::float32, c.s);
  auto y = mx::where(mx::less(xx, sc(0, xx), c.s), mx::multiply(slope, xx, c.s), xx, c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

// Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0. Like ORT, integers are compared and
// shifted in float (C++'s int + float) and truncated back to T.
Outputs translate_shrink(OpContext& c) {
  const mx::array& x = c.in(0);
  float bias = attr(c, "bias", 0.f), lambd = attr(c, "lambd", 0.5f);
  auto ft = x.dtype() == mx::float64 ? mx::float64 : mx::float32;
  auto xf = mx::astype(x, ft, c.s);
  auto b = mx::array(bias, ft), l = mx::array(lambd, ft), zero = mx::array(0, ft);
  auto y = mx::where(mx::less(xf, mx::negative(l, c.s), c.s), mx::add(xf, b, c.s),
                     mx::where(mx::greater(xf, l, c.s), mx::subtract(xf, b, c.s), zero, c.s), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

Support check_float(const NodeQuery& q) { return float_input(q, 0); }
Support check_relu(const NodeQuery& q) { return input_dtype_in(q, 0, kFloat, kSignedInt); }
Support check_prelu(const NodeQuery& q) {
  if (auto s = numeric_input(q, 0); !s) return s;
  return numeric_input(q, 1);
}
Support check_numeric(const NodeQuery& q) { return numeric_input(q, 0); }

const OpEntry kOps[] = {
    {"", "Relu", 1, kAnyOpset, check_relu, act<relu>},
    {"", "LeakyRelu", 1, kAnyOpset, check_float, act<leaky_relu>},
    {"", "PRelu", 7, kAnyOpset, check_prelu, translate_prelu,
     "opset >= 7 (unidirectional slope broadcast)"},
    {"", "Sigmoid", 1, kAnyOpset, check_float, act<sigmoid>},
    {"", "HardSigmoid", 1, kAnyOpset, check_float, act<hard_sigmoid>},
    {"", "HardSwish", 14, kAnyOpset, check_float, act<hard_swish>},
    {"", "Tanh", 1, kAnyOpset, check_float, act<tanh_>},
    {"", "Softplus", 1, kAnyOpset, check_float, act<softplus>},
    {"", "Softsign", 1, kAnyOpset, check_float, act<softsign>},
    {"", "Elu", 1, kAnyOpset, check_float, act<elu>},
    {"", "Selu", 1, kAnyOpset, check_float, act<selu>},
    {"", "Celu", 12, kAnyOpset, check_float, act<celu>},
    {"", "ThresholdedRelu", 10, kAnyOpset, check_float, act<thresholded_relu>},
    {"", "Mish", 18, kAnyOpset, check_float, act<mish>},
    {"", "Gelu", 20, kAnyOpset, check_gelu, act<gelu>,
     "float64 only with approximate=tanh (MLX's float64 erf is float32-accurate)"},
    {"", "Shrink", 9, kAnyOpset, check_numeric, translate_shrink},
    {"", "Swish", 24, kAnyOpset, check_float, act<swish>},
};

}  // namespace

std::span<const OpEntry> activation_ops() { return kOps; }

}  // namespace ortmlx::ops
