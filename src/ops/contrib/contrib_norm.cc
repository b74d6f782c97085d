// Transformer normalizations and activations from com.microsoft: SkipLayerNormalization,
// SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization (also in the default domain,
// where ORT registers it and exporters stamp it), EmbedLayerNormalization, FastGelu, BiasGelu,
// Gelu, QuickGelu, BiasAdd and BiasSplitGelu.
//
// ORT's CPU kernels accumulate fp16/bf16 in float32; so do we on the CPU backend
// (compute_dtype). The normalizations run through mx::fast::layer_norm / rms_norm over the last
// axis; the statistics outputs (mean, inv_std_var) are composed and only evaluated when used.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/skip_rms_norm.h"
#include "ops/contrib/contrib_internal.h"
#include "ops/switches.h"

namespace ortmlx::ops::contrib {

namespace {

const std::initializer_list<DType> kHalfFloat = {DType::Float32, DType::Float16, DType::BFloat16};

mx::array in_as(OpContext& c, size_t i, mx::Dtype t) { return mx::astype(c.in(i), t, c.s); }

// inv_std_var = 1 / sqrt(E[(x - mean)^2] + eps) (or E[x^2] when simplified), keepdims.
mx::array inv_std(const mx::array& x, const mx::array& mean, bool simplified, float eps, mx::Stream s) {
  auto d = simplified ? x : mx::subtract(x, mean, s);
  auto var = mx::mean(mx::square(d, s), -1, true, s);
  return mx::rsqrt(mx::add(var, mx::array(eps, var.dtype()), s), s);
}

// Shared by SkipLayerNormalization (beta at 3, bias at 4) and the simplified form (bias at 3).
Outputs skip_norm(OpContext& c, bool simplified) {
  const auto& x = c.in(0);
  const float eps = c.node.attr_float("epsilon", 1e-12f);
  const mx::Dtype ct = compute_dtype(x, c.s);
  const int D = x.shape(-1);
  const size_t bias_i = simplified ? 3 : 4;
  // On a CUDA GPU the add and the RMS normalization are one kernel of the EP's (its sum rounded
  // to x's dtype as the add below rounds it).
  std::optional<std::pair<mx::array, mx::array>> fused;
  if (simplified && translation_switches().skip_norm_kernel) {
    // Rows taken flat where the kernel reads them so (see as_rows), the outputs shaped back last.
    const auto& skip = c.in(1);
    const bool flat = translation_switches().flat_products && x.ndim() > 2 && skip.shape() == x.shape();
    fused = kernels::cuda::skip_rms_norm(flat ? as_rows(x, c.s) : x, flat ? as_rows(skip, c.s) : skip, c.in(2),
                                         c.has(bias_i) ? std::optional(c.in(bias_i)) : std::nullopt, eps, c.s);
    if (fused && flat) fused = std::pair{rows_to(fused->first, x, c.s), rows_to(fused->second, x, c.s)};
  }
  auto gamma = mx::reshape(in_as(c, 2, ct), {D}, c.s);
  std::optional<mx::array> beta;
  if (!simplified && c.has(3)) beta = mx::reshape(in_as(c, 3, ct), {D}, c.s);
  // On the CPU, the add and the normalization are one kernel of the EP's; the sum is made as
  // its second output only where an output of the node other than the first is read.
  const bool stats = c.node.has_output(1) || c.node.has_output(2) || c.node.has_output(3);
  if (!fused && translation_switches().cpu_skip_norm)
    if (auto row = cpu_skip_norm(x, c.in(1), c.has(bias_i) ? std::optional(c.in(bias_i)) : std::nullopt, gamma, beta,
                                 eps, simplified, stats, c.s)) {
      if (!stats) return {(*row)[0]};
      fused = std::pair{(*row)[0], (*row)[1]};
    }
  auto sum = fused ? fused->second : mx::add(in_as(c, 0, ct), in_as(c, 1, ct), c.s);
  if (!fused && c.has(bias_i)) sum = mx::add(sum, in_as(c, bias_i, ct), c.s);
  mx::array y = sum;
  if (fused) {
    y = fused->first;
  } else if (auto row = cpu_layer_norm(sum, gamma, beta, eps, c.s, simplified)) {
    y = *row;  // one primitive on the CPU (kernels/cpu/layer_norm.cc)
  } else if (simplified) {
    y = mx::fast::rms_norm(sum, gamma, eps, c.s);
  } else {
    y = mx::fast::layer_norm(sum, gamma, beta, eps, c.s);
  }
  auto sum32 = mx::astype(sum, mx::float32, c.s);
  // The simplified kernel has no mean; ORT's CPU EP writes zeros to that output.
  auto mean = simplified ? mx::zeros_like(mx::mean(sum32, -1, true, c.s), c.s)
                         : mx::mean(sum32, -1, true, c.s);
  auto isv = inv_std(sum32, mean, simplified, eps, c.s);
  return {mx::astype(y, x.dtype(), c.s), mean, isv, mx::astype(sum, x.dtype(), c.s)};
}

}  // namespace

// ---- SkipLayerNormalization / SkipSimplifiedLayerNormalization ------------------------------------

Support check_skip_layer_norm(const NodeQuery& q) {
  for (size_t i = 0; i < 5; ++i)
    if (auto s = input_dtype_in(q, i, kHalfFloat); !s) return s;
  return Support::yes();
}

Outputs translate_skip_layer_norm(OpContext& c) { return skip_norm(c, false); }
Outputs translate_skip_simplified_layer_norm(OpContext& c) { return skip_norm(c, true); }

// ---- SimplifiedLayerNormalization (RMS norm over axis..rank-1) ------------------------------------

Support check_simplified_layer_norm(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  if (auto s = float_input(q, 1); !s) return s;
  if (q.gpu && (q.input_dtype(0) == DType::Float64 || q.input_dtype(1) == DType::Float64))
    return Support::no("float64 on the GPU");
  return Support::yes();
}

Outputs translate_simplified_layer_norm(OpContext& c) {
  const auto& x = c.in(0);
  const int r = static_cast<int>(x.ndim());
  const int axis = norm_axis(c.node.attr_int("axis", -1), r);
  const float eps = c.node.attr_float("epsilon", 1e-5f);
  // float64 stays float64; everything else is computed in float32 like ORT's kernel.
  const mx::Dtype ct = x.dtype() == mx::float64 ? mx::float64 : mx::float32;
  const auto out_t = c.in(1).dtype();  // Y has the scale's type (V)
  auto xc = mx::astype(x, ct, c.s);
  auto scale = in_as(c, 1, ct);
  std::vector<int> axes;
  for (int a = axis; a < r; ++a) axes.push_back(a);
  auto ms = mx::mean(mx::square(xc, c.s), axes, true, c.s);
  auto isv = mx::rsqrt(mx::add(ms, mx::array(eps, ct), c.s), c.s);
  mx::array y = xc;
  if (axis == r - 1 && scale.size() == static_cast<size_t>(x.shape(-1)) && ct == mx::float32) {
    auto gamma = mx::reshape(scale, {x.shape(-1)}, c.s);
    auto row = cpu_layer_norm(xc, gamma, std::nullopt, eps, c.s, /*rms=*/true);  // one primitive on the CPU
    y = row ? *row : mx::fast::rms_norm(xc, gamma, eps, c.s);
  } else
    y = mx::multiply(mx::multiply(xc, isv, c.s), scale, c.s);
  auto isv_t = c.out_dtype(1) != DType::Undefined ? mlx_dtype(c.out_dtype(1)) : mx::float32;
  return {mx::astype(y, out_t, c.s), mx::astype(isv, isv_t, c.s)};
}

// ---- EmbedLayerNormalization ----------------------------------------------------------------------
// inputs: input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?, gamma,
//         beta, mask?, position_ids?; outputs: output, mask_index, embedding_sum.

Support check_embed_layer_norm(const NodeQuery& q) {
  for (size_t i : {2, 3, 4, 5, 6})
    if (auto s = input_dtype_in(q, i, {DType::Float32, DType::Float16}); !s) return s;
  if (q.has_input(1) != q.has_input(4))
    return Support::no("EmbedLayerNormalization needs segment_ids and segment_embedding together");
  return Support::yes();
}

Outputs translate_embed_layer_norm(OpContext& c) {
  const auto& ids = c.in(0);
  if (ids.ndim() != 2) c.fail("input_ids must be [batch, sequence]");
  const int B = ids.shape(0), S = ids.shape(1);
  const auto t = c.in(2).dtype();
  const mx::Dtype ct = compute_dtype(c.in(2), c.s);
  const float eps = c.node.attr_float("epsilon", 1e-12f);
  auto rows = [&](size_t i) { return std::vector<int64_t>{c.in(i).shape(0)}; };
  auto emb = mx::take(in_as(c, 2, ct), mx::astype(c.checked_indices(ids, rows(2), false, "input_ids", 0), mx::int32, c.s),
                      0, c.s);
  if (!c.has(8) && S > c.in(3).shape(0)) c.fail("the sequence is longer than position_embedding");
  mx::array pos = c.has(8) ? mx::astype(c.checked_indices(c.in(8), rows(3), false, "position_ids", 8), mx::int32, c.s)
                           : mx::expand_dims(mx::arange(S, mx::int32, c.s), 0, c.s);
  emb = mx::add(emb, mx::take(in_as(c, 3, ct), pos, 0, c.s), c.s);
  if (c.has(1))
    emb = mx::add(emb, mx::take(in_as(c, 4, ct),
                                mx::astype(c.checked_indices(c.in(1), rows(4), false, "segment_ids", 1), mx::int32, c.s),
                                0, c.s), c.s);
  const int D = emb.shape(-1);
  auto y = mx::fast::layer_norm(emb, mx::reshape(in_as(c, 5, ct), {D}, c.s),
                                mx::reshape(in_as(c, 6, ct), {D}, c.s), eps, c.s);
  // mask_index: the number of ones per row (what ORT's CPU kernel returns), zeros without a mask.
  auto mask_index = c.has(7) ? mx::astype(mx::sum(mx::astype(c.in(7), mx::int32, c.s), 1, false, c.s), mx::int32, c.s)
                             : mx::zeros({B}, mx::int32, c.s);
  return {mx::astype(y, t, c.s), mask_index, mx::astype(emb, t, c.s)};
}

// ---- activations -----------------------------------------------------------------------------------

Support check_float_activation(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  if (q.gpu && q.input_dtype(0) == DType::Float64) return Support::no("float64 on the GPU");
  return Support::yes();
}

// Gelu/BiasGelu need erf, which MLX evaluates at float32 accuracy even for float64.
Support check_erf_activation(const NodeQuery& q) {
  if (q.input_dtype(0) == DType::Float64)
    return Support::no("MLX computes float64 erf at float32 accuracy");
  return check_float_activation(q);
}

namespace {
// x (+ optional bias input i) in the compute dtype.
mx::array with_bias(OpContext& c, size_t bias_i, mx::Dtype ct) {
  auto x = in_as(c, 0, ct);
  return c.has(bias_i) ? mx::add(x, in_as(c, bias_i, ct), c.s) : x;
}
}  // namespace


// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with an optional bias added first.
Outputs translate_fast_gelu(OpContext& c) {
  const auto t = c.in(0).dtype();
  const auto ct = compute_dtype(c.in(0), c.s);
  auto x = with_bias(c, 1, ct);
  auto x3 = mx::multiply(mx::multiply(x, x, c.s), x, c.s);
  auto inner = mx::multiply(mx::add(x, mx::multiply(x3, mx::array(0.044715, ct), c.s), c.s),
                            mx::array(0.7978845608028654, ct), c.s);
  auto y = mx::multiply(mx::multiply(x, mx::array(0.5, ct), c.s),
                        mx::add(tanh_precise(inner, c.s), mx::array(1.0, ct), c.s), c.s);
  return {mx::astype(y, t, c.s)};
}

Outputs translate_bias_gelu(OpContext& c) {
  const auto ct = compute_dtype(c.in(0), c.s);
  return {mx::astype(gelu_erf(with_bias(c, 1, ct), c.s), c.in(0).dtype(), c.s)};
}

Outputs translate_gelu_ms(OpContext& c) {
  const auto ct = compute_dtype(c.in(0), c.s);
  return {mx::astype(gelu_erf(in_as(c, 0, ct), c.s), c.in(0).dtype(), c.s)};
}

// x * sigmoid(alpha x)
Outputs translate_quick_gelu(OpContext& c) {
  const auto ct = compute_dtype(c.in(0), c.s);
  auto x = in_as(c, 0, ct);
  const float alpha = c.node.attr_float("alpha", 1.702f);
  // x / (1 + exp(-alpha x)): exp_precise keeps float64 exact (MLX's sigmoid is float32-accurate)
  auto e = exp_precise(mx::multiply(x, mx::array(-alpha, ct), c.s), c.s);
  auto y = mx::divide(x, mx::add(e, mx::array(1.0, ct), c.s), c.s);
  return {mx::astype(y, c.in(0).dtype(), c.s)};
}

Support check_bias_add(const NodeQuery& q) {
  for (size_t i = 0; i < 3; ++i)
    if (auto s = input_dtype_in(q, i, {DType::Float32, DType::Float16}); !s) return s;
  return Support::yes();
}

// X + bias + skip
Outputs translate_bias_add(OpContext& c) {
  const auto ct = compute_dtype(c.in(0), c.s);
  auto y = mx::add(with_bias(c, 1, ct), in_as(c, 2, ct), c.s);
  return {mx::astype(y, c.in(0).dtype(), c.s)};
}

Support check_bias_split_gelu(const NodeQuery& q) {
  for (size_t i = 0; i < 2; ++i)
    if (auto s = input_dtype_in(q, i, {DType::Float32, DType::Float16}); !s) return s;
  return Support::yes();
}

// (X + bias) split in halves along the last axis: left * gelu(right).
Outputs translate_bias_split_gelu(OpContext& c) {
  const auto ct = compute_dtype(c.in(0), c.s);
  auto x = with_bias(c, 1, ct);
  const int D = x.shape(-1);
  if (D % 2 != 0) c.fail("the last dimension must be even");
  auto halves = mx::split(x, 2, -1, c.s);
  auto y = mx::multiply(halves[0], gelu_erf(halves[1], c.s), c.s);
  return {mx::astype(y, c.in(0).dtype(), c.s)};
}

}  // namespace ortmlx::ops::contrib
