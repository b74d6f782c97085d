// The optimizer update rules of ai.onnx.preview.training (opset 1): Adagrad, Adam and Momentum
// (standard and Nesterov). Each takes a learning rate R and an update count T (scalars) and
// updates n tensors at once: inputs R, T, X_1..X_n, G_1..G_n, then the optimizer's state tensors
// (H, or V and H), and outputs X_new_1..n followed by the new states, in the same order.
// Plain element-wise arithmetic in X's dtype; T stays an MLX value (no host read), so one
// compiled program serves every step.
#include <string>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// Inputs: R, T, then `groups` runs of n tensors; outputs: `out_groups` runs of n tensors.
Support check_optimizer(const NodeQuery& q, size_t groups, size_t out_groups) {
  const size_t nin = q.num_inputs();
  if (nin < 2 + groups || (nin - 2) % groups != 0)
    return Support::no("inputs must be R, T and " + std::to_string(groups) +
                       " groups of the same number of tensors");
  const size_t n = (nin - 2) / groups;
  if (q.node.outputs.size() != out_groups * n)
    return Support::no("expected " + std::to_string(out_groups * n) + " outputs");
  for (size_t i = 0; i < nin; ++i)
    if (!q.has_input(i)) return Support::no("every input is required");
  if (auto r = input_dtype_in(q, 0, {DType::Float32, DType::Float64}); !r) return r;
  if (auto r = input_dtype_in(q, 1, {DType::Int64}); !r) return r;
  for (size_t i = 2; i < nin; ++i)
    if (auto r = input_dtype_in(q, i, {DType::Float32, DType::Float64}); !r) return r;
  return Support::yes();
}

// R and T as scalars of dtype t (T > 0 as a bool scalar too).
struct Step {
  mx::array r, t, started;
};

Step step_of(OpContext& c, mx::Dtype t) {
  if (c.in(0).size() != 1) c.fail("R must be a scalar");
  if (c.in(1).size() != 1) c.fail("T must be a scalar");
  auto r = mx::astype(mx::reshape(c.in(0), {}, c.s), t, c.s);
  auto count = mx::reshape(c.in(1), {}, c.s);
  return {r, mx::astype(count, t, c.s), mx::greater(count, mx::array(int64_t{0}), c.s)};
}

mx::array num(double v, mx::Dtype t) { return mx::array(v, t); }

// The regularized gradient norm_coefficient * X + G.
mx::array regularized(const mx::array& x, const mx::array& g, double norm, mx::Stream s) {
  return mx::add(mx::multiply(num(norm, x.dtype()), x, s), g, s);
}

void same_shape(OpContext& c, const mx::array& a, const mx::array& b, const char* what) {
  if (a.shape() != b.shape()) c.fail(std::string(what) + " must have the shape of its X");
}

Support check_adagrad(const NodeQuery& q) { return check_optimizer(q, 3, 2); }

//   r = R / (1 + T * decay_factor);  G' = norm_coefficient * X + G;  H_new = H + G' * G'
//   X_new = X - r * G' / (sqrt(H_new) + epsilon)
Outputs translate_adagrad(OpContext& c) {
  const size_t n = (c.num_inputs() - 2) / 3;
  const double decay = c.node.attr_float("decay_factor", 0.f);
  const double eps = c.node.attr_float("epsilon", 1e-6f);
  const double norm = c.node.attr_float("norm_coefficient", 0.f);
  Outputs xs, hs;
  for (size_t i = 0; i < n; ++i) {
    const auto& x = c.in(2 + i);
    const auto& g = c.in(2 + n + i);
    const auto& h = c.in(2 + 2 * n + i);
    same_shape(c, x, g, "G");
    same_shape(c, x, h, "H");
    const auto t = x.dtype();
    auto st = step_of(c, t);
    auto r = mx::divide(st.r, mx::add(num(1, t), mx::multiply(st.t, num(decay, t), c.s), c.s), c.s);
    auto gr = regularized(x, g, norm, c.s);
    auto h_new = mx::add(h, mx::multiply(gr, gr, c.s), c.s);
    auto denom = mx::add(mx::sqrt(h_new, c.s), num(eps, t), c.s);
    xs.push_back(mx::subtract(x, mx::divide(mx::multiply(r, gr, c.s), denom, c.s), c.s));
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

Support check_adam(const NodeQuery& q) { return check_optimizer(q, 4, 3); }

//   G' = norm_coefficient * X + G;  V_new = alpha V + (1 - alpha) G';  H_new = beta H + (1 - beta)
//   G'^2 r = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R   (bias correction from the second
//   step) X_new = (1 - norm_coefficient_post) (X - r V_new / (sqrt(H_new) + epsilon))
Outputs translate_adam(OpContext& c) {
  const size_t n = (c.num_inputs() - 2) / 4;
  const double alpha = c.node.attr_float("alpha", 0.9f);
  const double beta = c.node.attr_float("beta", 0.999f);
  const double eps = c.node.attr_float("epsilon", 1e-6f);
  const double norm = c.node.attr_float("norm_coefficient", 0.f);
  const double norm_post = c.node.attr_float("norm_coefficient_post", 0.f);
  Outputs xs, vs, hs;
  for (size_t i = 0; i < n; ++i) {
    const auto& x = c.in(2 + i);
    const auto& g = c.in(2 + n + i);
    const auto& v = c.in(2 + 2 * n + i);
    const auto& h = c.in(2 + 3 * n + i);
    same_shape(c, x, g, "G");
    same_shape(c, x, v, "V");
    same_shape(c, x, h, "H");
    const auto t = x.dtype();
    auto st = step_of(c, t);
    auto gr = regularized(x, g, norm, c.s);
    auto v_new =
        mx::add(mx::multiply(num(alpha, t), v, c.s), mx::multiply(num(1 - alpha, t), gr, c.s), c.s);
    auto h_new = mx::add(mx::multiply(num(beta, t), h, c.s),
                         mx::multiply(num(1 - beta, t), mx::multiply(gr, gr, c.s), c.s), c.s);
    auto corrected = mx::divide(
        mx::multiply(
            st.r, mx::sqrt(mx::subtract(num(1, t), mx::power(num(beta, t), st.t, c.s), c.s), c.s),
            c.s),
        mx::subtract(num(1, t), mx::power(num(alpha, t), st.t, c.s), c.s), c.s);
    auto r = mx::where(st.started, corrected, st.r, c.s);
    auto denom = mx::add(mx::sqrt(h_new, c.s), num(eps, t), c.s);
    auto x_new = mx::subtract(x, mx::multiply(r, mx::divide(v_new, denom, c.s), c.s), c.s);
    xs.push_back(mx::multiply(num(1 - norm_post, t), x_new, c.s));
    vs.push_back(v_new);
    hs.push_back(h_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

Support check_momentum(const NodeQuery& q) {
  for (const char* a : {"alpha", "beta", "norm_coefficient", "mode"})
    if (!q.node.has_attr(a)) return Support::no(std::string("attribute ") + a + " is required");
  const auto mode = q.node.attr_string("mode", "");
  if (mode != "standard" && mode != "nesterov")
    return Support::no("mode must be 'standard' or 'nesterov', not '" + mode + "'");
  return check_optimizer(q, 3, 2);
}

//   G' = norm_coefficient * X + G;  V_new = alpha V + (T > 0 ? beta : 1) G'
//   standard: X_new = X - R V_new;  nesterov: X_new = X - R (G' + alpha V_new)
Outputs translate_momentum(OpContext& c) {
  const size_t n = (c.num_inputs() - 2) / 3;
  const double alpha = c.node.attr_float("alpha", 0.f);
  const double beta = c.node.attr_float("beta", 0.f);
  const double norm = c.node.attr_float("norm_coefficient", 0.f);
  const bool nesterov = c.node.attr_string("mode", "standard") == "nesterov";
  Outputs xs, vs;
  for (size_t i = 0; i < n; ++i) {
    const auto& x = c.in(2 + i);
    const auto& g = c.in(2 + n + i);
    const auto& v = c.in(2 + 2 * n + i);
    same_shape(c, x, g, "G");
    same_shape(c, x, v, "V");
    const auto t = x.dtype();
    auto st = step_of(c, t);
    auto gr = regularized(x, g, norm, c.s);
    auto b = mx::where(st.started, num(beta, t), num(1, t), c.s);
    auto v_new = mx::add(mx::multiply(num(alpha, t), v, c.s), mx::multiply(b, gr, c.s), c.s);
    auto step = nesterov ? mx::add(gr, mx::multiply(num(alpha, t), v_new, c.s), c.s) : v_new;
    xs.push_back(mx::subtract(x, mx::multiply(st.r, step, c.s), c.s));
    vs.push_back(v_new);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

constexpr std::string_view kTraining = "ai.onnx.preview.training";

const OpEntry kTrainingOps[] = {
    {kTraining, "Adagrad", 1, kAnyOpset, check_adagrad, translate_adagrad,
     "the domain's schemas come from the EP (ORT's build has none)"},
    {kTraining, "Adam", 1, kAnyOpset, check_adam, translate_adam,
     "test_adam_multiple's expected output was made with epsilon 1e-2, which its node does not "
     "set (the default 1e-6 applies)"},
    {kTraining, "Momentum", 1, kAnyOpset, check_momentum, translate_momentum},
};

}  // namespace

std::span<const OpEntry> training_ops() { return kTrainingOps; }

}  // namespace ortmlx::ops
