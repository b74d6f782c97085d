// Normalization: BatchNormalization (inference), LayerNormalization, RMSNormalization,
// InstanceNormalization, GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN.
//
// Whenever the normalized dims are contiguous and trailing (possibly after a reshape, as for
// Instance/GroupNormalization), the statistics come from mx::fast::layer_norm / rms_norm over
// the last axis: fused kernels on the GPU, float32 accumulation everywhere. float64 and the
// optional Mean/InvStdDev outputs take the composed path. fp16/bf16 statistics are always
// computed in float32.
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/cpu/kernels.h"
#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// The dtype statistics are computed in: float32 for halves, float64 stays float64.
mx::Dtype stat_dtype(const mx::array& x) {
  return x.dtype() == mx::float64 ? mx::float64 : mx::float32;
}

bool fast_ok(const mx::array& x) { return x.dtype() != mx::float64; }

// Reshapes x so that dims [axis, rank) form one trailing axis: (prod(lead), prod(trail)).
mx::array fold_trailing(const mx::array& x, int axis, mx::Stream s) {
  int64_t lead = 1, trail = 1;
  for (int i = 0; i < static_cast<int>(x.ndim()); ++i) (i < axis ? lead : trail) *= x.shape(i);
  return mx::reshape(x, {static_cast<int>(lead), static_cast<int>(trail)}, s);
}

// (x - mean) / sqrt(var + eps) over the last axis of a float32/float64 x (callers widen halves
// first, so statistics are float32 on every backend). fast::layer_norm is fused on the GPU; its
// CPU fallback would compute float64 in float32, so float64 is composed here.
mx::array standardize_last(const mx::array& x, float eps, mx::Stream s) {
  if (fast_ok(x)) return mx::fast::layer_norm(x, std::nullopt, std::nullopt, eps, s);
  auto mean = mx::mean(x, -1, true, s);
  auto d = mx::subtract(x, mean, s);
  auto var = mx::mean(mx::square(d, s), -1, true, s);
  return mx::multiply(d, mx::rsqrt(mx::add(var, mx::array(eps, x.dtype()), s), s), s);
}

// x / sqrt(mean(x^2) + eps) over the last axis; same dtype contract as standardize_last.
mx::array rms_last(const mx::array& x, float eps, mx::Stream s) {
  if (fast_ok(x)) return mx::fast::rms_norm(x, std::nullopt, eps, s);
  auto ms = mx::mean(mx::square(x, s), -1, true, s);
  return mx::multiply(x, mx::rsqrt(mx::add(ms, mx::array(eps, x.dtype()), s), s), s);
}

// A per-channel parameter (C,) reshaped to broadcast against (N, C, D1..Dn).
mx::array per_channel(const mx::array& p, int rank, mx::Dtype t, mx::Stream s) {
  mx::Shape sh(rank - 1, 1);
  sh[0] = -1;
  return mx::reshape(mx::astype(p, t, s), sh, s);
}

Support check_float(const NodeQuery& q) { return float_input(q, 0); }

// --- BatchNormalization ------------------------------------------------------------------

Support check_batch_norm(const NodeQuery& q) {
  for (size_t i = 0; i < 5; ++i)
    if (auto s = float_input(q, i); !s) return s;
  if (auto s = flag_attr_0_or_1(q, "training_mode"); !s) return s;
  // Opset 14+ (training_mode attribute): outputs running_mean/var exist only in training mode.
  // Older opsets' training outputs (mean, var, saved_mean, saved_var) are not supported.
  const bool training = q.node.attr_int("training_mode", 0) != 0;
  if (training && q.node.since_version < 14)
    return Support::no("training_mode before opset 14");
  for (size_t i = 1; i < q.node.outputs.size(); ++i)
    if (q.node.has_output(i) && !(training && i <= 2))
      return Support::no(training ? "training outputs beyond running mean/var"
                                  : "training outputs (mean/var) without training_mode=1");
  return Support::yes();
}

// training_mode=1 (opset 14+): normalize with the batch statistics over every axis but the
// channel axis 1, and blend them into the running statistics:
//   running_mean = mean_in * momentum + batch_mean * (1 - momentum)   (same for var)
// The batch variance is the biased (population) one, as in ONNX's reference and ORT's kernel.
Outputs batch_norm_training(OpContext& c, float eps, mx::Dtype t) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  std::vector<int> axes{0};
  for (int i = 2; i < rank; ++i) axes.push_back(i);
  for (size_t i = 1; i < 5; ++i)
    if (c.in(i).ndim() != 1) c.fail("training mode needs (C,) scale, B, mean and var");
  auto xf = mx::astype(x, t, c.s);
  auto mean = mx::mean(xf, axes, true, c.s);
  auto d = mx::subtract(xf, mean, c.s);
  auto var = mx::mean(mx::square(d, c.s), axes, true, c.s);
  auto inv = mx::multiply(mx::rsqrt(mx::add(var, mx::array(eps, t), c.s), c.s),
                          per_channel(c.in(1), rank, t, c.s), c.s);
  auto y = mx::add(mx::multiply(d, inv, c.s), per_channel(c.in(2), rank, t, c.s), c.s);
  Outputs out{mx::astype(y, x.dtype(), c.s)};
  const auto m = mx::array(c.node.attr_float("momentum", 0.9f), t);
  const auto one_m = mx::subtract(mx::array(1.0f, t), m, c.s);
  auto blend = [&](size_t i, const mx::array& batch) {
    auto run = mx::astype(c.in(i), t, c.s);
    auto v = mx::add(mx::multiply(run, m, c.s), mx::multiply(mx::flatten(batch, c.s), one_m, c.s), c.s);
    return mx::astype(v, c.in(i).dtype(), c.s);
  };
  if (c.node.has_output(1) || c.node.has_output(2)) {
    out.push_back(blend(3, mean));
    out.push_back(blend(4, var));
  }
  return out;
}

// y = (x - mean) / sqrt(var + eps) * scale + B. Parameters are (C,) or, for the old
// spatial=0 form (opsets < 9), (C, D1..Dn): both broadcast after the batch dim.
Outputs translate_batch_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  if (rank < 2) c.fail("input must have rank >= 2");
  mx::Dtype t = stat_dtype(x);
  auto param = [&](size_t i) {
    const mx::array& p = c.in(i);
    if (p.ndim() == 1) return per_channel(p, rank, t, c.s);
    mx::Shape sh = p.shape();
    sh.insert(sh.begin(), 1);
    return mx::reshape(mx::astype(p, t, c.s), sh, c.s);
  };
  float eps = c.node.attr_float("epsilon", 1e-5f);
  if (c.node.attr_int("training_mode", 0) != 0) return batch_norm_training(c, eps, t);
  auto inv = [&] { return mx::multiply(mx::rsqrt(mx::add(param(4), mx::array(eps, t), c.s), c.s), param(1), c.s); };
  if (c.is_constant(1) && c.is_constant(2) && c.is_constant(3) && c.is_constant(4)) {
    // Constant statistics (an inference graph): y = x * scale + shift with the per-channel scale
    // and shift computed once per program, as ORT's CPU EP computes them. Left to MLX, the
    // compiled kernel evaluates the rsqrt and four broadcast operands at every element.
    auto scale = c.prepared("batch_norm_scale", {1, 4}, inv);
    auto shift = c.prepared("batch_norm_shift", {1, 2, 3, 4},
                            [&] { return mx::subtract(param(2), mx::multiply(param(3), inv(), c.s), c.s); });
    using Step = CpuBlockedStep::Kind;
    if (x.dtype() == mx::float32 && t == mx::float32)  // a convolution's blocked output stays blocked
      if (auto y = blocked_steps(x, {{Step::MulChannel, scale}, {Step::AddChannel, shift}}, c.s)) return {*y};
    if (x.dtype() == mx::float32 && t == mx::float32)
      if (auto y = cpu_dnnl_blocked_channel_map(x, {scale, shift}, [&](const std::vector<mx::array>& a) {
            return mx::add(mx::multiply(a[0], a[1], c.s), a[2], c.s);
          }, c.s))
        return {*y};
    if (x.dtype() == mx::float32 && t == mx::float32)  // a large NCHW activation: the same kernel
      if (auto y = channel_steps(x, {{Step::MulChannel, scale}, {Step::AddChannel, shift}}, c.s)) return {*y};
    auto y = mx::add(mx::multiply(mx::astype(x, t, c.s), scale, c.s), shift, c.s);
    return {mx::astype(y, x.dtype(), c.s)};
  }
  auto y = mx::add(mx::multiply(mx::subtract(mx::astype(x, t, c.s), param(3), c.s), inv(), c.s),
                   param(2), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

// --- LayerNormalization / RMSNormalization ------------------------------------------------

Support check_stash(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  auto st = static_cast<DType>(q.node.attr_int("stash_type", 1));
  if (!graph::is_float(st)) return Support::no("stash_type must be a float type");
  return Support::yes();
}

Outputs translate_layer_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  const int axis = norm_axis(c.node.attr_int("axis", -1), rank);
  const float eps = c.node.attr_float("epsilon", 1e-5f);
  const bool want_stats = c.node.has_output(1) || c.node.has_output(2);
  const mx::array& scale = c.in(1);
  std::optional<mx::array> bias;
  if (c.has(2)) bias = c.in(2);

  // One fused call when the parameters are plain vectors over the last axis.
  bool vec_params = axis == rank - 1 && scale.ndim() == 1 && scale.shape(0) == x.shape(-1) &&
                    (!bias || (bias->ndim() == 1 && bias->shape(0) == x.shape(-1)));
  if (!want_stats && vec_params)
    if (auto y = cpu_layer_norm(x, scale, bias, eps, c.s)) return {*y};  // one primitive on the CPU
  if (!want_stats && fast_ok(x) && vec_params && !compute_half_in_f32(x, c.s))
    return {mx::fast::layer_norm(x, scale, bias, eps, c.s)};

  mx::Dtype t = stat_dtype(x);
  mx::array xf = mx::astype(x, t, c.s);
  mx::array y = x;
  std::optional<mx::array> mean, inv;
  if (!want_stats) {
    y = mx::reshape(standardize_last(fold_trailing(xf, axis, c.s), eps, c.s), x.shape(), c.s);
  } else {
    std::vector<int> axes(rank - axis);
    std::iota(axes.begin(), axes.end(), axis);
    mean = mx::mean(xf, axes, true, c.s);
    auto d = mx::subtract(xf, *mean, c.s);
    inv = mx::rsqrt(mx::add(mx::mean(mx::square(d, c.s), axes, true, c.s), mx::array(eps, t), c.s),
                    c.s);
    y = mx::multiply(d, *inv, c.s);
  }
  y = mx::multiply(y, mx::astype(scale, t, c.s), c.s);
  if (bias) y = mx::add(y, mx::astype(*bias, t, c.s), c.s);
  Outputs out{mx::astype(y, x.dtype(), c.s)};
  if (want_stats) {
    // Mean / InvStdDev are of the stash type (the engine casts to the declared output type).
    mx::Dtype u = mlx_dtype(static_cast<DType>(c.node.attr_int("stash_type", 1)));
    out.push_back(mx::astype(*mean, u, c.s));
    out.push_back(mx::astype(*inv, u, c.s));
  }
  return out;
}

Outputs translate_rms_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  const mx::array& scale = c.in(1);
  const int rank = x.ndim();
  const int axis = norm_axis(c.node.attr_int("axis", -1), rank);
  const float eps = c.node.attr_float("epsilon", 1e-5f);
  // Y has the scale's type (V), which may differ from X's.
  const mx::Dtype out_t = scale.dtype();
  bool vec_scale = axis == rank - 1 && scale.ndim() == 1 && scale.shape(0) == x.shape(-1);
  if (fast_ok(x) && vec_scale && !compute_half_in_f32(x, c.s) && scale.dtype() == x.dtype())
    return {mx::fast::rms_norm(x, scale, eps, c.s)};

  mx::Dtype t = stat_dtype(x);
  mx::array xf = fold_trailing(mx::astype(x, t, c.s), axis, c.s);
  mx::array y = rms_last(xf, eps, c.s);
  y = mx::multiply(mx::reshape(y, x.shape(), c.s), mx::astype(scale, t, c.s), c.s);
  return {mx::astype(y, out_t, c.s)};
}

// --- Instance / Group normalization -------------------------------------------------------

Outputs translate_instance_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  if (rank < 3) c.fail("input must have rank >= 3");
  mx::Dtype t = stat_dtype(x);
  float eps = c.node.attr_float("epsilon", 1e-5f);
  // (N, C, D..) -> (N*C, prod(D)): each row is one instance-channel.
  auto y = mx::reshape(standardize_last(fold_trailing(mx::astype(x, t, c.s), 2, c.s), eps, c.s),
                       x.shape(), c.s);
  y = mx::add(mx::multiply(y, per_channel(c.in(1), rank, t, c.s), c.s),
              per_channel(c.in(2), rank, t, c.s), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

Support check_group_norm(const NodeQuery& q) {
  if (auto s = check_stash(q); !s) return s;
  if (q.node.attr_int("num_groups", 0) < 1) return Support::no("num_groups must be >= 1");
  return Support::yes();
}

// GroupNormalization-18 has one scale/bias per group, -21 one per channel.
Outputs translate_group_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = x.ndim();
  if (rank < 2) c.fail("input must have rank >= 2");
  const int groups = static_cast<int>(c.node.attr_int("num_groups", 1));
  const int N = x.shape(0), C = x.shape(1);
  if (C % groups) c.fail("channels are not divisible by num_groups");
  float eps = c.node.attr_float("epsilon", 1e-5f);
  mx::Dtype t = stat_dtype(x);
  mx::array xg = mx::reshape(mx::astype(x, t, c.s), {N, groups, -1}, c.s);
  mx::array y = standardize_last(xg, eps, c.s);
  if (c.node.since_version < 21) {
    // (N, G, C/G * prod(D)) * scale[g]
    auto sc = mx::reshape(mx::astype(c.in(1), t, c.s), {groups, 1}, c.s);
    auto b = mx::reshape(mx::astype(c.in(2), t, c.s), {groups, 1}, c.s);
    y = mx::reshape(mx::add(mx::multiply(y, sc, c.s), b, c.s), x.shape(), c.s);
  } else {
    y = mx::reshape(y, x.shape(), c.s);
    y = mx::add(mx::multiply(y, per_channel(c.in(1), rank, t, c.s), c.s),
                per_channel(c.in(2), rank, t, c.s), c.s);
  }
  return {mx::astype(y, x.dtype(), c.s)};
}

// --- LpNormalization, MeanVarianceNormalization, LRN --------------------------------------

Support check_lp_norm(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  auto p = q.node.attr_int("p", 2);
  if (p != 1 && p != 2) return Support::no("p must be 1 or 2");
  return Support::yes();
}

Outputs translate_lp_norm(OpContext& c) {
  const mx::array& x = c.in(0);
  int axis = norm_axis(c.node.attr_int("axis", -1), x.ndim());
  mx::Dtype t = stat_dtype(x);
  mx::array xf = mx::astype(x, t, c.s);
  mx::array norm = c.node.attr_int("p", 2) == 1
                       ? mx::sum(mx::abs(xf, c.s), axis, true, c.s)
                       : mx::sqrt(mx::sum(mx::square(xf, c.s), axis, true, c.s), c.s);
  // A zero norm leaves the (all-zero) slice as zeros instead of 0/0 = NaN, as ORT does.
  auto zero = mx::array(0, t);
  auto y = mx::where(mx::equal(norm, zero, c.s), zero, mx::divide(xf, norm, c.s), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

// (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (ONNX's function body).
Outputs translate_mvn(OpContext& c) {
  const mx::array& x = c.in(0);
  auto axes = to_axes(c.node.attr_ints("axes", {0, 2, 3}), x.ndim());
  mx::Dtype t = stat_dtype(x);
  mx::array xf = mx::astype(x, t, c.s);
  auto mean = mx::mean(xf, axes, true, c.s);
  auto var =
      mx::subtract(mx::mean(mx::square(xf, c.s), axes, true, c.s), mx::square(mean, c.s), c.s);
  auto denom =
      mx::add(mx::sqrt(mx::maximum(var, mx::array(0, t), c.s), c.s), mx::array(1e-9, t), c.s);
  auto y = mx::divide(mx::subtract(xf, mean, c.s), denom, c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

Support check_lrn(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  if (q.node.attr_int("size", 0) < 1) return Support::no("size must be >= 1");
  if (int r = q.input_rank(0); r >= 0 && r < 3) return Support::no("input rank must be >= 3");
  return Support::yes();
}

// y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta, the window being
// [c - floor((size-1)/2), c + ceil((size-1)/2)].
Outputs translate_lrn(OpContext& c) {
  const mx::array& x = c.in(0);
  const int size = static_cast<int>(c.node.attr_int("size", 1));
  const float alpha = c.node.attr_float("alpha", 1e-4f), beta = c.node.attr_float("beta", 0.75f),
              bias = c.node.attr_float("bias", 1.0f);
  mx::Dtype t = stat_dtype(x);
  mx::array xf = mx::astype(x, t, c.s);
  const int C = x.shape(1), lo = (size - 1) / 2, hi = size - 1 - lo;
  auto sq = mx::pad(mx::square(xf, c.s), {1}, {lo}, {hi}, mx::array(0, t), "constant", c.s);
  mx::Shape start(x.ndim(), 0), stop = sq.shape();
  std::optional<mx::array> sum;
  for (int k = 0; k < size; ++k) {
    start[1] = k;
    stop[1] = k + C;
    auto part = mx::slice(sq, start, stop, c.s);
    sum = sum ? mx::add(*sum, part, c.s) : part;
  }
  auto base = mx::add(mx::multiply(*sum, mx::array(alpha / size, t), c.s), mx::array(bias, t), c.s);
  auto y = mx::divide(xf, mx::power(base, mx::array(beta, t), c.s), c.s);
  return {mx::astype(y, x.dtype(), c.s)};
}

const OpEntry kOps[] = {
    {"", "BatchNormalization", 1, kAnyOpset, check_batch_norm, translate_batch_norm,
     "inference only: training_mode=1 and the running-statistics outputs are declined"},
    {"", "LayerNormalization", 17, kAnyOpset, check_stash, translate_layer_norm},
    {"", "RMSNormalization", 23, kAnyOpset, check_stash, translate_rms_norm},
    {"", "InstanceNormalization", 1, kAnyOpset, check_float, translate_instance_norm},
    {"", "GroupNormalization", 18, kAnyOpset, check_group_norm, translate_group_norm},
    {"", "LpNormalization", 1, kAnyOpset, check_lp_norm, translate_lp_norm, "p = 1 or 2"},
    {"", "MeanVarianceNormalization", 9, kAnyOpset, check_float, translate_mvn},
    {"", "LRN", 1, kAnyOpset, check_lrn, translate_lrn},
};

}  // namespace

std::span<const OpEntry> normalization_ops() { return kOps; }

}  // namespace ortmlx::ops
