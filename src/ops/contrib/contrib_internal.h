// Declarations shared by the transformer-op files (attention.cc, rotary.cc, quantized_matmul.cc,
// contrib_norm.cc); contrib.cc assembles their table. Internal to these files.
#pragma once

#include <optional>

#include "ops/common.h"

namespace ortmlx::ops::contrib {

// ---- quantized_matmul.cc -----------------------------------------------------------------------
Support check_matmul_nbits(const NodeQuery& q);
Outputs translate_matmul_nbits(OpContext& c);
Support check_gather_block_quantized(const NodeQuery& q);
Outputs translate_gather_block_quantized(OpContext& c);

// ---- rotary.cc ---------------------------------------------------------------------------------
// a[..., lo:hi, ...] along `axis` (a non-negative axis).
mx::array slice_axis(const mx::array& a, int axis, int lo, int hi, mx::Stream s);
// Rotates the first `rotary_dim` features of x's last axis with per-position cos/sin, which the
// caller lays out to broadcast against x with a last axis of rotary_dim / 2. interleaved: pairs
// (2i, 2i+1) rotate together; otherwise halves (i, i + dim/2). Computed in compute_dtype(x) and
// returned in x's dtype; features past rotary_dim pass through.
mx::array apply_rotary(const mx::array& x, const mx::array& cos, const mx::array& sin,
                       int rotary_dim, bool interleaved, mx::Stream s);
// The halves form (not interleaved) from tables of the full rotary width: cos2 = [cos, cos],
// sin2 = [-sin, sin] (rotary_half_tables, in dtype t; a caller with constant caches prepares
// them once). Same results as apply_rotary, in fewer kernels.
std::pair<mx::array, mx::array> rotary_half_tables(const mx::array& cos, const mx::array& sin,
                                                   mx::Dtype t, mx::Stream s);
mx::array apply_rotary_halves(const mx::array& x, const mx::array& cos2, const mx::array& sin2,
                              int rotary_dim, mx::Stream s);
// The full-width tables of node inputs cos_i/sin_i in dtype t, prepared once when both are
// constant initializers and shared by every node of the graph reading the same caches (all
// layers, Q and K: one copy per model); made at each call otherwise (OpContext::prepared).
std::pair<mx::array, mx::array> prepared_half_tables(OpContext& c, mx::Dtype t, size_t cos_i,
                                                     size_t sin_i);
Support check_rotary_ms(const NodeQuery& q);
Outputs translate_rotary_ms(OpContext& c);
Support check_rotary_onnx(const NodeQuery& q);
Outputs translate_rotary_onnx(OpContext& c);

// ---- attention.cc ------------------------------------------------------------------------------
Support check_gqa(const NodeQuery& q);
Outputs translate_gqa(OpContext& c);
Support check_mha(const NodeQuery& q);
Outputs translate_mha(OpContext& c);
Support check_attention_ms(const NodeQuery& q);
Outputs translate_attention_ms(OpContext& c);
Support check_attention_onnx(const NodeQuery& q);
Outputs translate_attention_onnx(OpContext& c);

// ---- contrib_norm.cc (normalizations and activations) ------------------------------------------
Support check_skip_layer_norm(const NodeQuery& q);
Outputs translate_skip_layer_norm(OpContext& c);
Outputs translate_skip_simplified_layer_norm(OpContext& c);
Support check_simplified_layer_norm(const NodeQuery& q);
Outputs translate_simplified_layer_norm(OpContext& c);
Support check_embed_layer_norm(const NodeQuery& q);
Outputs translate_embed_layer_norm(OpContext& c);
Support check_float_activation(const NodeQuery& q);
Support check_erf_activation(const NodeQuery& q);
Outputs translate_fast_gelu(OpContext& c);
Outputs translate_bias_gelu(OpContext& c);
Outputs translate_gelu_ms(OpContext& c);
Outputs translate_quick_gelu(OpContext& c);
Support check_bias_add(const NodeQuery& q);
Outputs translate_bias_add(OpContext& c);
Support check_bias_split_gelu(const NodeQuery& q);
Outputs translate_bias_split_gelu(OpContext& c);

// ---- small shared idioms -----------------------------------------------------------------------
// The dtype to compute in: float32 for fp16/bf16 on the CPU backend (reference-loop kernels
// there, and ORT's CPU EP accumulates these ops in float32 too), else x's own dtype.
inline mx::Dtype compute_dtype(const mx::array& x, mx::Stream s) {
  return compute_half_in_f32(x, s) ? mx::float32 : x.dtype();
}

}  // namespace ortmlx::ops::contrib
