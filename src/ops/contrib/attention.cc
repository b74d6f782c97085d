// Attention ops: GroupQueryAttention (the onnxruntime-genai decoder form), MultiHeadAttention and
// Attention (com.microsoft), Attention (ai.onnx 23/24).
//
// All of them reduce to one core, `attend`: softmax(scale * Q K^T [softcap] + bias, masked) V with
// grouped heads. It runs through mx::fast::scaled_dot_product_attention (boolean or additive mask,
// per-head sinks for smooth softmax) unless softcap is set, which has to act between the product
// and the bias and so needs the explicit math. Masks are built with MLX ops from the data (per
// batch lengths, causal offsets); only GroupQueryAttention with one sequence reads its length on
// the host, to drop the mask where it selects every key (see translate_gqa).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include <mlx/primitives.h>

#include "ops/contrib/contrib_internal.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/decode_attention.h"

namespace ortmlx::ops::contrib {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// q [B, N, S, H]; k [B, Nkv, T, H]; v [B, Nkv, T, Hv] with N a multiple of Nkv. mask: bool,
// true = attend, broadcastable to [B, N, S, T]; bias: additive, same broadcasting; sinks: [N]
// extra softmax logits (a smooth softmax). All in one float dtype. Returns out [B, N, S, Hv] and,
// when qk_mode >= 0, ONNX Attention's qk_matmul_output: 0 = scale * Q K^T, 1 = after softcap,
// 2 = after the mask/bias, 3 = after softmax.
struct Attn {
  mx::array out;
  std::optional<mx::array> qk;
};

Attn attend(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
            const std::optional<mx::array>& mask, const std::optional<mx::array>& bias,
            float softcap, const std::optional<mx::array>& sinks, mx::Stream s, int qk_mode = -1,
            bool causal = false) {
  const auto t = q.dtype();
  // One query row on the CPU (a decode step): the explicit math below with BLAS gemv products.
  // MLX's fused attention falls back to sgemm there, which packs K and V on every call.
  const bool row_gemv = q.shape(2) == 1 && t == mx::float32 && s.device == mx::Device::cpu &&
                        cpu_gemv_available();
  if (softcap <= 0.f && qk_mode < 0 && !row_gemv) {
    std::optional<mx::array> m;
    if (bias && mask)
      m = mx::where(*mask, mx::astype(*bias, t, s), mx::array(kNegInf, t), s);
    else if (bias)
      m = mx::astype(*bias, t, s);
    else
      m = mask;
    std::optional<mx::array> sk;
    if (sinks) sk = mx::astype(*sinks, t, s);
    // causal (no mask given): MLX's own bottom-right causal mask, which its GPU kernels
    // apply without a mask array in memory.
    return {mx::fast::scaled_dot_product_attention(q, k, v, scale, causal && !m ? "causal" : "", m,
                                                   sk, false, s), {}};
  }
  // Explicit math: heads grouped as [B, Nkv, rep, S, *] so K/V are never repeated.
  const int B = q.shape(0), N = q.shape(1), S = q.shape(2), H = q.shape(3);
  const int Nkv = k.shape(1), T = k.shape(2), Hv = v.shape(3), rep = N / Nkv;
  std::optional<mx::array> mask_or_causal = mask;
  if (causal && !mask && S > 1)  // query row i sees keys [0, T - S + i]
    mask_or_causal = mx::greater_equal(
        mx::reshape(mx::arange(T - S, T, mx::int32, s), {S, 1}, s),
        mx::reshape(mx::arange(T, mx::int32, s), {1, T}, s), s);
  auto q5 = mx::reshape(q, {B, Nkv, rep, S, H}, s);
  auto k5 = mx::expand_dims(k, 2, s), v5 = mx::expand_dims(v, 2, s);
  auto product = [&](const mx::array& a, const mx::array& b) {
    if (row_gemv)
      if (auto y = cpu_row_gemv(a, b, s, /*small_products=*/true)) return *y;
    return mx::matmul(a, b, s);
  };
  auto scores = mx::multiply(product(q5, mx::swapaxes(k5, -1, -2, s)), mx::array(scale, t), s);
  scores = mx::reshape(scores, {B, N, S, T}, s);
  std::optional<mx::array> qk;
  if (qk_mode == 0) qk = scores;
  if (softcap > 0.f) {
    auto cap = mx::array(softcap, t);
    scores = mx::multiply(mx::tanh(mx::divide(scores, cap, s), s), cap, s);
  }
  if (qk_mode == 1) qk = scores;
  if (bias) scores = mx::add(scores, mx::astype(*bias, t, s), s);
  if (mask_or_causal) scores = mx::where(*mask_or_causal, scores, mx::array(kNegInf, t), s);
  if (qk_mode == 2) qk = scores;
  mx::array probs = scores;
  if (sinks) {
    auto sink = mx::broadcast_to(mx::reshape(mx::astype(*sinks, t, s), {1, N, 1, 1}, s), {B, N, S, 1}, s);
    probs = mx::softmax(mx::concatenate({sink, scores}, -1, s), -1, true, s);
    probs = mx::slice(probs, {0, 0, 0, 1}, {B, N, S, T + 1}, s);
  } else if (auto p = row_gemv ? cpu_softmax_last_axis(scores, s) : std::nullopt) {
    probs = *p;  // a decode row on the CPU: the vectorized softmax (ops/cpu_gemv.h)
  } else {
    probs = mx::softmax(scores, -1, true, s);
  }
  if (qk_mode == 3) qk = probs;
  auto out = product(mx::reshape(probs, {B, Nkv, rep, S, T}, s), v5);
  return {mx::reshape(out, {B, N, S, Hv}, s), qk};
}

mx::array to_bnsh(const mx::array& x, int B, int S, int N, int H, mx::Stream s) {
  return mx::transpose(mx::reshape(x, {B, S, N, H}, s), {0, 2, 1, 3}, s);
}

mx::array from_bnsh(const mx::array& x, mx::Stream s) {
  const int B = x.shape(0), N = x.shape(1), S = x.shape(2), H = x.shape(3);
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}, s), {B, S, N * H}, s);
}

// GroupQueryAttention's present cache [B, Nkv, T, H]: rows [0, past_len[b]) from the past buffer,
// the S new rows after them, zeros beyond (as ORT's CPU kernel writes a separate present buffer).
// past_len is data ([B] int32), so the rows are selected with a gather and masks.
mx::array gqa_present(const std::optional<mx::array>& past, const mx::array& fresh,
                      const mx::array& past_len, int T, mx::Stream s) {
  const int B = fresh.shape(0), Nkv = fresh.shape(1), S = fresh.shape(2), H = fresh.shape(3);
  const auto zero = mx::array(0, fresh.dtype());
  // The past buffer zero-padded to T rows. An empty past (a first prompt) adds nothing, and is
  // kept out of the graph: see concat_nonempty.
  std::optional<mx::array> past_t;
  if (past && past->size() > 0) {
    const int P = past->shape(2);
    past_t = P < T ? mx::pad(*past, {2}, {0}, {T - P}, zero, "constant", s) : *past;
  }
  if (B == 1 && S <= T) {
    // One sequence (every decode step): the padded past buffer with the new rows written at
    // past_len by a dynamic slice update: one pass over the cache, where the gather below
    // takes several. Rows from past_len + S up to the past buffer's length keep the past
    // buffer's rows instead of zeros; ORT's CPU kernel leaves those rows unwritten (no
    // attention reads them), and in decoding they do not exist (past_len is the past buffer's
    // length). past_len is clipped to [0, T - S] (consistent inputs always are).
    mx::array base = past_t ? *past_t : mx::zeros({1, Nkv, T, H}, fresh.dtype(), s);
    auto start = mx::clip(past_len, mx::array(0), mx::array(T - S), s);
    return mx::slice_update(base, fresh, start, {2}, s);
  }
  auto rel = mx::subtract(mx::reshape(mx::arange(T, mx::int32, s), {1, 1, T, 1}, s),
                          mx::reshape(past_len, {B, 1, 1, 1}, s), s);  // row - past_len[b]
  auto idx = mx::broadcast_to(mx::clip(rel, mx::array(0), mx::array(S - 1), s), {B, Nkv, T, H}, s);
  auto fresh_rows = mx::take_along_axis(fresh, idx, 2, s);
  auto in_new = mx::logical_and(mx::greater_equal(rel, mx::array(0), s), mx::less(rel, mx::array(S), s), s);
  mx::array base = past_t ? mx::where(mx::less(rel, mx::array(0), s), *past_t, zero, s) : zero;
  return mx::where(in_new, fresh_rows, base, s);
}

}  // namespace

// ---- GroupQueryAttention -----------------------------------------------------------------------
// inputs: query, key?, value?, past_key?, past_value?, seqlens_k, total_sequence_length,
//         cos_cache?, sin_cache?, position_ids?, attention_bias?, head_sink?, k_scale?, v_scale?,
//         q_norm_weight?, k_norm_weight?
// Per batch b (ORT's CPU semantics): total_b = seqlens_k[b] + 1; the first prompt (S equals
// total_sequence_length) has no past, otherwise past_len_b = total_b - S. Query row s sees keys
// [0, min(past_len_b + s + 1, total_b)), and with local_window_size W only the last W of them.

Support check_gqa(const NodeQuery& q) {
  const auto& n = q.node;
  const int64_t N = n.attr_int("num_heads", 0), Nkv = n.attr_int("kv_num_heads", 0);
  if (N <= 0 || Nkv <= 0 || N % Nkv != 0)
    return Support::no("GroupQueryAttention needs num_heads a positive multiple of kv_num_heads");
  const std::initializer_list<DType> fl = {DType::Float32, DType::Float16, DType::BFloat16};
  for (size_t i : {0, 1, 2, 3, 4, 7, 8, 10, 11})
    if (auto s = input_dtype_in(q, i, fl); !s) return Support::no("GroupQueryAttention " + s.reason);
  if (q.has_input(12) || q.has_input(13))
    return Support::no("GroupQueryAttention with a quantized KV cache (k_scale/v_scale)");
  if (q.has_input(14) || q.has_input(15))
    return Support::no("GroupQueryAttention with q_norm_weight/k_norm_weight (ORT's CPU EP rejects them)");
  if (n.attr_int("qk_output", 0) != 0) return Support::no("GroupQueryAttention qk_output");
  if (n.attr_int("sliding_window_cache", 0) != 0)
    return Support::no("GroupQueryAttention sliding_window_cache (window-sized KV buffers)");
  if (n.attr_int("causal", 1) != 1) return Support::no("GroupQueryAttention with causal=0");
  if (n.attr_int("local_window_size", -1) == 0)
    return Support::no("GroupQueryAttention local_window_size=0");
  if (n.attr_int("do_rotary", 0) == 1 && !(q.has_input(7) && q.has_input(8)))
    return Support::no("GroupQueryAttention do_rotary without cos_cache/sin_cache");
  if (q.has_input(3) != q.has_input(4))
    return Support::no("GroupQueryAttention needs both past_key and past_value, or neither");
  if (q.has_input(1) != q.has_input(2))
    return Support::no("GroupQueryAttention needs both key and value, or neither (packed QKV)");
  return Support::yes();
}

Outputs translate_gqa(OpContext& c) {
  const auto& n = c.node;
  const int N = static_cast<int>(n.attr_int("num_heads", 0));
  const int Nkv = static_cast<int>(n.attr_int("kv_num_heads", 0));
  const float softcap = n.attr_float("softcap", 0.f);
  const int window = static_cast<int>(n.attr_int("local_window_size", -1));
  const auto& query = c.in(0);
  if (query.ndim() != 3) c.fail("query must be [batch, sequence, hidden]");
  const int B = query.shape(0), S = query.shape(1);
  const bool packed = !c.has(1);

  int H = 0;
  mx::array Q = query, K = query, V = query;
  if (packed) {
    if (query.shape(2) % (N + 2 * Nkv) != 0) c.fail("packed QKV width is not (num_heads + 2 kv_num_heads) * head_size");
    H = query.shape(2) / (N + 2 * Nkv);
    Q = slice_axis(query, 2, 0, N * H, c.s);
    K = slice_axis(query, 2, N * H, (N + Nkv) * H, c.s);
    V = slice_axis(query, 2, (N + Nkv) * H, (N + 2 * Nkv) * H, c.s);
  } else {
    if (query.shape(2) % N != 0) c.fail("query hidden size is not a multiple of num_heads");
    H = query.shape(2) / N;
    K = c.in(1);
    V = c.in(2);
    if (K.ndim() != 3 || K.shape(1) != S || K.shape(2) != Nkv * H || V.shape() != K.shape())
      c.fail("key/value must be [batch, sequence, kv_num_heads * head_size]");
  }
  const float scale_attr = n.attr_float("scale", 0.f);
  const float scale = scale_attr != 0.f ? scale_attr : 1.f / std::sqrt(static_cast<float>(H));

  std::optional<mx::array> past_k, past_v;
  if (c.has(3)) {
    past_k = c.in(3);
    past_v = c.in(4);
    if (past_k->ndim() != 4 || past_k->shape(0) != B || past_k->shape(1) != Nkv ||
        past_k->shape(3) != H || past_v->shape() != past_k->shape())
      c.fail("past_key/past_value must be [batch, kv_num_heads, length, head_size]");
  }
  const int P = past_k ? past_k->shape(2) : 0;
  // An empty past (the first prompt of a generate loop) is no past: no op touches the zero-size
  // buffers, which keeps the graph off MLX's CUDA kernels' zero-size faults (the engine would
  // otherwise run the whole prompt on the CPU stream).
  if (P == 0) past_k.reset(), past_v.reset();
  // total_sequence_length sizes the present outputs, so it is read on the host (exporters derive
  // it from a Shape, which keeps the program compiled); seqlens_k stays on the device.
  const int64_t total = c.host_int(6);
  if (total < 1 || total > INT32_MAX) c.fail("total_sequence_length must be positive");
  const int T = std::max(static_cast<int>(total), P);
  const bool first_prompt = S == total;
  if (!first_prompt && S > 1 && B != 1)
    c.fail("sequence_length > 1 with past context requires batch_size 1 (as in ORT)");

  // Batch 1 (every generate loop): the sequence's length is read on the host too (one sync per
  // run, shared by all layers: the engine dedupes host reads). Knowing it, the common case (no
  // padding: total_b == T) needs no mask at all for a decode step and MLX's causal mode for a
  // prompt, which MLX's GPU attention kernels take without a mask array (with one, MLX falls
  // back to unfused math); the rotary rows are a slice, and the present cache a concatenation.
  // Batches keep everything on the device.
  //
  // Except a decode step into a shared past/present buffer (onnxruntime-genai's
  // past_present_share_buffer: the past holds max_length rows, total_sequence_length is no
  // more than that): there the position stays data on the device, so every step has the same
  // graph and runs as one compiled function instead of a new eager translation each step.
  const bool buffer_step = past_k && P >= total && S == 1;
  std::optional<int> known_past;  // past_len of the one sequence, when B == 1 and consistent
  bool unpadded = false;          // ... and its keys fill all T rows of present
  bool prompt_in_buffer = false;  // ... a prompt written at row 0 of a longer buffer
  if (B == 1 && !buffer_step) {
    const int64_t total_1 = c.host_int(5) + 1;
    const int64_t past_1 = first_prompt ? 0 : total_1 - S;
    if (total_1 >= S && total_1 <= T && past_1 >= 0 && past_1 <= P) {
      known_past = static_cast<int>(past_1);
      unpadded = total_1 == T;
      // Its queries see its own rows only: attention over those (causal), not the buffer.
      prompt_in_buffer = past_1 == 0 && total_1 == S && T > S && (window <= 0 || window >= S) &&
                         !c.has(10);
    }
  }
  auto seqlens = mx::reshape(mx::astype(c.in(5), mx::int32, c.s), {B}, c.s);
  auto total_b = mx::add(seqlens, mx::array(1), c.s);
  auto past_len = known_past ? mx::full({1}, *known_past, mx::int32, c.s)
                  : first_prompt ? mx::zeros({B}, mx::int32, c.s)
                                 : mx::subtract(total_b, mx::array(S), c.s);

  Q = mx::reshape(Q, {B, S, N, H}, c.s);
  K = mx::reshape(K, {B, S, Nkv, H}, c.s);
  V = mx::reshape(V, {B, S, Nkv, H}, c.s);
  if (n.attr_int("do_rotary", 0) == 1) {  // ORT tests == 1 (as for the flags below)
    const auto& cos_cache = c.in(7);
    const int rotary_dim = 2 * cos_cache.shape(1);
    if (rotary_dim > H) c.fail("cos_cache is wider than head_size / 2");
    const bool inter = n.attr_int("rotary_interleaved", 0) == 1;
    // The halves form rotates with full-width tables ([cos, cos], [-sin, sin]), prepared once;
    // only their rows are picked per run.
    mx::array cos_t = cos_cache, sin_t = c.in(8);
    if (!inter) std::tie(cos_t, sin_t) = prepared_half_tables(c, compute_dtype(Q, c.s), 7, 8);
    const int rows = cos_cache.shape(0);
    std::optional<mx::array> cos, sin;
    if (known_past && !c.has(9) && *known_past + S <= rows) {
      cos = mx::reshape(slice_axis(cos_t, 0, *known_past, *known_past + S, c.s), {1, S, 1, -1}, c.s);
      sin = mx::reshape(slice_axis(sin_t, 0, *known_past, *known_past + S, c.s), {1, S, 1, -1}, c.s);
    } else {
      // The rows follow from seqlens_k (or position_ids) alone: every layer reading the same
      // tables and lengths shares one gather of them (a kernel each saved per layer).
      const size_t rows_from = c.has(9) ? 9 : 5;
      auto rows_of = c.shared_result(
          "gqa_rotary_rows:" + std::to_string(S) + ":" + std::to_string(first_prompt) + ":" +
              std::to_string(rows_from) + ":" + std::to_string(known_past ? *known_past : -1),
          {cos_t, sin_t, c.in(rows_from)}, [&]() -> std::vector<mx::array> {
            mx::array pos = mx::arange(S, mx::int32, c.s);
            if (c.has(9))
              pos = mx::astype(c.checked_indices(c.in(9), {rows}, false, "position_ids", 9), mx::int32, c.s);
            else if (first_prompt)
              pos = mx::broadcast_to(mx::expand_dims(pos, 0, c.s), {B, S}, c.s);
            else
              pos = mx::add(mx::expand_dims(past_len, 1, c.s), mx::expand_dims(pos, 0, c.s), c.s);
            return {mx::expand_dims(mx::take(cos_t, pos, 0, c.s), 2, c.s),  // [B, S, 1, width]
                    mx::expand_dims(mx::take(sin_t, pos, 0, c.s), 2, c.s)};
          });
      cos = rows_of[0];
      sin = rows_of[1];
    }
    if (inter) {
      Q = apply_rotary(Q, *cos, *sin, rotary_dim, true, c.s);
      K = apply_rotary(K, *cos, *sin, rotary_dim, true, c.s);
    } else if (packed) {
      // Q and K are neighbours in the packed input: one rotation for both.
      auto qk = mx::reshape(slice_axis(query, 2, 0, (N + Nkv) * H, c.s), {B, S, N + Nkv, H}, c.s);
      qk = apply_rotary_halves(qk, *cos, *sin, rotary_dim, c.s);
      Q = slice_axis(qk, 2, 0, N, c.s);
      K = slice_axis(qk, 2, N, N + Nkv, c.s);
    } else {
      Q = apply_rotary_halves(Q, *cos, *sin, rotary_dim, c.s);
      K = apply_rotary_halves(K, *cos, *sin, rotary_dim, c.s);
    }
  }
  // A decode step into the shared buffer on a CUDA GPU: the one-row kernel attends to the
  // buffer's first seqlens_k rows plus the step's own key, so no mask array is built.
  std::optional<mx::array> buffer_out;
  if (buffer_step && c.gpu_kernels() && softcap <= 0.f && !c.has(10) && !c.has(11) &&
      n.attr_int("smooth_softmax", -1) != 1 && Q.dtype() == past_k->dtype())
    buffer_out = kernels::cuda::decode_attention(
        mx::reshape(Q, {B, N, H}, c.s), mx::reshape(K, {B, Nkv, H}, c.s), mx::reshape(V, {B, Nkv, H}, c.s),
        *past_k, *past_v, seqlens, {N, Nkv, scale, window}, c.s);
  Q = mx::transpose(Q, {0, 2, 1, 3}, c.s);
  K = mx::transpose(K, {0, 2, 1, 3}, c.s);
  V = mx::transpose(V, {0, 2, 1, 3}, c.s);

  mx::array present_k = K, present_v = V;
  if (known_past && past_k && *known_past == P && P + S == T) {
    // The usual decode step (on the CPU by chunk copies: see cpu_concat).
    present_k = concat_nonempty({*past_k, K}, 2, c.s);
    present_v = concat_nonempty({*past_v, V}, 2, c.s);
  } else if (past_k || !first_prompt || T != S) {
    present_k = gqa_present(past_k, K, past_len, T, c.s);
    present_v = gqa_present(past_v, V, past_len, T, c.s);
  }

  if (buffer_out)
    return {mx::astype(mx::reshape(*buffer_out, {B, 1, N * H}, c.s), query.dtype(), c.s), present_k, present_v};

  // Visible keys of row s in batch b: [lo, hi) with hi = min(past_len + s + 1, total_b).
  // Unpadded batch 1 without a window shorter than the keys: hi = T - S + s + 1, MLX's causal.
  const bool causal_only = prompt_in_buffer || (unpadded && (window <= 0 || window >= T) && !c.has(10));
  std::optional<mx::array> mask;
  if (!causal_only) {
    auto col = mx::reshape(mx::arange(T, mx::int32, c.s), {1, 1, 1, T}, c.s);
    auto row = mx::reshape(mx::arange(S, mx::int32, c.s), {1, 1, S, 1}, c.s);
    auto hi = mx::minimum(mx::add(mx::add(mx::reshape(past_len, {B, 1, 1, 1}, c.s), row, c.s), mx::array(1), c.s),
                          mx::reshape(total_b, {B, 1, 1, 1}, c.s), c.s);
    mask = mx::less(col, hi, c.s);
    if (window > 0)
      mask = mx::logical_and(*mask, mx::greater_equal(col, mx::subtract(hi, mx::array(window), c.s), c.s), c.s);
  }

  std::optional<mx::array> bias, sinks;
  const mx::Dtype ct = compute_dtype(query, c.s);
  if (c.has(10)) {
    // [B|1, N|1, S, total_sequence_length]: columns are absolute key positions.
    auto b = c.in(10);
    if (b.ndim() != 4 || b.shape(-1) != total) c.fail("attention_bias must be [B|1, N|1, S, total_sequence_length]");
    if (T > total) b = mx::pad(b, {3}, {0}, {T - static_cast<int>(total)}, mx::array(0, b.dtype()), "constant", c.s);
    bias = mx::astype(b, ct, c.s);
  }
  if (c.has(11))
    sinks = mx::reshape(c.in(11), {N}, c.s);
  else if (n.attr_int("smooth_softmax", -1) == 1)
    sinks = mx::zeros({N}, ct, c.s);

  const auto& keys = prompt_in_buffer ? K : present_k;
  const auto& values = prompt_in_buffer ? V : present_v;
  auto out = attend(mx::astype(Q, ct, c.s), mx::astype(keys, ct, c.s), mx::astype(values, ct, c.s),
                    scale, mask, bias, softcap, sinks, c.s, -1, causal_only && S > 1).out;
  return {mx::astype(from_bnsh(out, c.s), query.dtype(), c.s), present_k, present_v};
}

namespace {

// ORT's CPU mask semantics for Attention and MultiHeadAttention: masked scores get
// mask_filter_value *added* (finite: a fully masked row averages V instead of giving NaN).
// m: (B) key end positions; (2B) end positions then start positions (left padding); (B, T) 0/1
// per key; (B, S, T) per query and key. Returns the additive [B, 1, S or 1, T] mask.
mx::array ort_mask(OpContext& c, const mx::array& m, int B, int S, int T, float mfv, mx::Dtype t) {
  auto col = mx::reshape(mx::arange(T, mx::int32, c.s), {1, 1, 1, T}, c.s);
  auto mi = mx::astype(m, mx::int32, c.s);
  std::optional<mx::array> keep;
  if (m.ndim() == 1 && static_cast<int>(m.size()) == B) {
    keep = mx::less(col, mx::reshape(mi, {B, 1, 1, 1}, c.s), c.s);
  } else if (m.ndim() == 1 && static_cast<int>(m.size()) == 2 * B) {
    auto end = mx::reshape(mx::slice(mi, {0}, {B}, c.s), {B, 1, 1, 1}, c.s);
    auto start = mx::reshape(mx::slice(mi, {B}, {2 * B}, c.s), {B, 1, 1, 1}, c.s);
    keep = mx::logical_and(mx::less(col, end, c.s), mx::greater_equal(col, start, c.s), c.s);
  } else if (m.ndim() == 2 && m.shape(0) == B && m.shape(1) == T) {
    keep = mx::reshape(mx::not_equal(mi, mx::array(0), c.s), {B, 1, 1, T}, c.s);
  } else if (m.ndim() == 3 && m.shape(0) == B && m.shape(1) == S && m.shape(2) == T) {
    keep = mx::reshape(mx::not_equal(mi, mx::array(0), c.s), {B, 1, S, T}, c.s);
  } else {
    c.fail("unsupported mask shape (expected (B), (2B), (B, total) or (B, S, total))");
  }
  return mx::where(*keep, mx::array(0.f, t), mx::array(mfv, t), c.s);
}

// unidirectional: keys after past + s get mask_filter_value added, as ORT does, with the past
// P = T - S: query row s sits at position P + s. (ORT 1.31's CPU MultiHeadAttention, given K/V
// longer than the query and no past input, masks otherwise: rows before the last see keys
// [0, s] and the last row sees all of them; the bottom-right alignment is kept here.)
mx::array ort_causal(int S, int T, float mfv, mx::Dtype t, mx::Stream s) {
  const int P = T - S;
  auto col = mx::reshape(mx::arange(T, mx::int32, s), {1, T}, s);
  auto row = mx::reshape(mx::arange(S, mx::int32, s), {S, 1}, s);
  auto future = mx::greater(col, mx::add(row, mx::array(P), s), s);
  return mx::where(future, mx::array(mfv, t), mx::array(0.f, t), s);
}

std::optional<mx::array> add_opt(const std::optional<mx::array>& a, const mx::array& b, mx::Stream s) {
  return a ? mx::add(*a, b, s) : b;
}

// `bias` plus the node's attention_bias input `i`, if given. An all-zero one (an exporter's
// mask-derived bias in a decode step without padding, known on the host by folding) adds
// nothing and is left out (see known_all_zero); ORT_MLX_ZERO_BIAS=0 keeps it (read per
// translation, for A/Bs).
std::optional<mx::array> add_attention_bias(const std::optional<mx::array>& bias, OpContext& c, size_t i,
                                            mx::Dtype t) {
  if (!c.has(i) || (env_switch_on("ORT_MLX_ZERO_BIAS") && known_all_zero(c.in(i)))) return bias;
  return add_opt(bias, mx::astype(c.in(i), t, c.s), c.s);
}

float default_scale(const graph::Node& n, int H) {
  const float sc = n.attr_float("scale", 0.f);
  return sc != 0.f ? sc : 1.f / std::sqrt(static_cast<float>(H));
}

// The exporters' repeat_kv idiom: grouped-head models (Llama, Qwen) feed MultiHeadAttention,
// which has no grouped K/V, with each KV head repeated r times:
//   packed [B, T, N*H] = Reshape(Transpose(Reshape(Expand(Unsqueeze(P, 2), [B, Nkv, r, T, H]),
//                        [B, N, T, H]), {0, 2, 1, 3})),  P [B, Nkv, T, H]
// (onnxruntime-genai's fp16/bf16 decoders, with P the present cache). Attention takes grouped
// heads itself (query head n reads KV head n / r, which is what the repetition gives), so P
// can go in as it is: that skips two copies of the whole cache per layer and decode step
// (the broadcast and the transpose are views; the two reshapes over them are copies).
// Matched on the MLX graph those nodes' translators built and that nothing has evaluated yet:
// the unit-axis insert, the broadcast of that axis and the axis merges are checked by shape
// (each has one meaning given its input and output shapes), the transpose by its axes.
// Anything else (already evaluated, another layout, r = 1) returns nullopt.
std::optional<mx::array> repeated_kv_source(const mx::array& packed, int N) {
  auto producer = [](const mx::array& a, std::initializer_list<const char*> prims) -> std::optional<mx::array> {
    if (a.is_available() || !a.has_primitive() || a.inputs().size() != 1) return std::nullopt;
    const std::string name = a.primitive().name();
    for (const char* p : prims)
      if (name == p) return a.inputs()[0];
    return std::nullopt;
  };
  if (packed.ndim() != 3 || packed.shape(2) % N != 0) return std::nullopt;
  const int B = packed.shape(0), T = packed.shape(1), H = packed.shape(2) / N;
  auto bthn = producer(packed, {"Reshape"});  // [B, T, N, H] -> [B, T, N*H]
  if (!bthn || bthn->shape() != mx::Shape{B, T, N, H}) return std::nullopt;
  auto bnth = producer(*bthn, {"Transpose"});  // [B, N, T, H] -> [B, T, N, H]
  if (!bnth || bnth->shape() != mx::Shape{B, N, T, H} ||
      static_cast<const mx::Transpose&>(bthn->primitive()).state() != std::vector<int>{0, 2, 1, 3})
    return std::nullopt;
  auto repeated = producer(*bnth, {"Reshape"});  // [B, Nkv, r, T, H] -> [B, N, T, H]
  if (!repeated || repeated->ndim() != 5) return std::nullopt;
  const int Nkv = repeated->shape(1), r = repeated->shape(2);
  if (r < 2 || Nkv * r != N || repeated->shape() != mx::Shape{B, Nkv, r, T, H}) return std::nullopt;
  auto unit = producer(*repeated, {"Broadcast"});  // [B, Nkv, 1, T, H] -> [B, Nkv, r, T, H]
  if (!unit || unit->shape() != mx::Shape{B, Nkv, 1, T, H}) return std::nullopt;
  auto source = producer(*unit, {"ExpandDims", "Reshape"});  // [B, Nkv, T, H] -> [B, Nkv, 1, T, H]
  if (!source || source->shape() != mx::Shape{B, Nkv, T, H}) return std::nullopt;
  return source;
}

}  // namespace

// ---- MultiHeadAttention (com.microsoft) ----------------------------------------------------------
// inputs: query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?, past_value?,
//         past_sequence_length?, cache_indirection?; outputs: output, present_key?, present_value?, qk?

Support check_mha(const NodeQuery& q) {
  const auto& n = q.node;
  if (n.attr_int("num_heads", 0) <= 0) return Support::no("MultiHeadAttention needs num_heads");
  const std::initializer_list<DType> fl = {DType::Float32, DType::Float16, DType::BFloat16};
  for (size_t i : {0, 1, 2, 3, 5, 6, 7})
    if (auto s = input_dtype_in(q, i, fl); !s) return Support::no("MultiHeadAttention " + s.reason);
  if (q.has_input(8) || q.has_input(9))
    return Support::no("MultiHeadAttention with past_sequence_length/cache_indirection (beam search buffers)");
  if (n.has_output(3)) return Support::no("MultiHeadAttention qk output");
  if (q.has_input(6) != q.has_input(7)) return Support::no("MultiHeadAttention needs both past_key and past_value");
  if (q.input_rank(1) == 4 && q.has_input(3))
    return Support::no("MultiHeadAttention with BNSH key/value and a projection bias");
  if (q.input_rank(1) == 4 && q.has_input(6))
    return Support::no("MultiHeadAttention with BNSH key/value and past state");
  return Support::yes();
}

Outputs translate_mha(OpContext& c) {
  const auto& n = c.node;
  const int N = static_cast<int>(n.attr_int("num_heads", 0));
  const float mfv = n.attr_float("mask_filter_value", -10000.f);
  const auto& query = c.in(0);
  const auto out_t = query.dtype();
  const mx::Dtype ct = compute_dtype(query, c.s);
  auto take5 = [&](const mx::array& x, int i) {  // [B, L, N, k, H] -> BNSH slice i
    return mx::transpose(mx::take(x, i, 3, c.s), {0, 2, 1, 3}, c.s);
  };
  const int B = query.shape(0), S = query.shape(1);
  mx::array Q = query, K = query, V = query;
  bool kv_projected = true;  // K/V came as [B, L, *] inputs (bias and past apply)
  if (query.ndim() == 5) {  // packed QKV [B, S, N, 3, H]
    Q = take5(query, 0), K = take5(query, 1), V = take5(query, 2);
  } else {
    if (query.ndim() != 3 || query.shape(2) % N != 0) c.fail("query must be [batch, sequence, num_heads * head_size]");
    const int H = query.shape(2) / N;
    Q = to_bnsh(query, B, S, N, H, c.s);
    const auto& key = c.in(1);
    if (key.ndim() == 5) {  // packed KV [B, L, N, 2, H]
      K = take5(key, 0), V = take5(key, 1);
    } else if (key.ndim() == 4) {  // K/V already [B, N, L, H] (cross-attention cache)
      K = key, V = c.in(2);
      kv_projected = false;
    } else {
      const auto& value = c.in(2);
      if (key.ndim() != 3 || value.ndim() != 3 || value.shape(2) % N != 0) c.fail("key/value must be 3-D");
      // Grouped K/V under the exporter's repetition: only where nothing else needs N heads
      // (no projection bias per head, no past to concatenate, no present outputs).
      std::optional<mx::array> gk, gv;
      // ORT_MLX_GROUPED_KV=0 keeps the repeated K/V (read per translation, for A/Bs).
      if (!c.has(3) && !c.has(6) && !n.has_output(1) && !n.has_output(2) && env_switch_on("ORT_MLX_GROUPED_KV")) {
        gk = repeated_kv_source(key, N);
        gv = gk ? repeated_kv_source(value, N) : std::nullopt;
      }
      if (gk && gv && gk->shape(1) == gv->shape(1)) {
        K = *gk, V = *gv;
      } else {
        K = to_bnsh(key, B, key.shape(1), N, key.shape(2) / N, c.s);
        V = to_bnsh(value, B, value.shape(1), N, value.shape(2) / N, c.s);
      }
    }
  }
  const int H = Q.shape(3), Hv = V.shape(3);
  if (c.has(3)) {  // projection bias [N*H (q) + N*H (k) + N*Hv (v)]
    auto bias = c.in(3);
    auto part = [&](int lo, int len, int h) {
      return mx::reshape(mx::slice(bias, {lo}, {lo + len}, c.s), {1, N, 1, h}, c.s);
    };
    Q = mx::add(Q, part(0, N * H, H), c.s);
    if (kv_projected) {
      K = mx::add(K, part(N * H, N * H, H), c.s);
      V = mx::add(V, part(2 * N * H, N * Hv, Hv), c.s);
    }
  }
  if (c.has(6)) {
    K = concat_nonempty({c.in(6), K}, 2, c.s);
    V = concat_nonempty({c.in(7), V}, 2, c.s);
  }
  const int T = K.shape(2);
  std::optional<mx::array> bias;
  if (c.has(4)) bias = ort_mask(c, c.in(4), B, S, T, mfv, ct);
  if (n.attr_int("unidirectional", 0) != 0) bias = add_opt(bias, ort_causal(S, T, mfv, ct, c.s), c.s);
  bias = add_attention_bias(bias, c, 5, ct);
  auto out = attend(mx::astype(Q, ct, c.s), mx::astype(K, ct, c.s), mx::astype(V, ct, c.s),
                    default_scale(n, H), {}, bias, 0.f, {}, c.s).out;
  return {mx::astype(from_bnsh(out, c.s), out_t, c.s), K, V};
}

// ---- Attention (com.microsoft): input projection + multi-head attention ------------------------
// inputs: input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?
// outputs: output, present? ([2, B, N, T, H])

Support check_attention_ms(const NodeQuery& q) {
  const auto& n = q.node;
  if (n.attr_int("num_heads", 0) <= 0) return Support::no("Attention needs num_heads");
  const std::initializer_list<DType> fl = {DType::Float32, DType::Float16, DType::BFloat16};
  for (size_t i : {0, 1, 2, 4, 5})
    if (auto s = input_dtype_in(q, i, fl); !s) return Support::no("Attention " + s.reason);
  if (n.attr_int("do_rotary", 0) != 0) return Support::no("Attention with do_rotary");
  if (n.attr_int("past_present_share_buffer", 0) != 0 || q.has_input(6))
    return Support::no("Attention with past_present_share_buffer / past_sequence_length");
  if (q.input_rank(3) == 4) return Support::no("Attention with a 4-D (Megatron) mask");
  return Support::yes();
}

Outputs translate_attention_ms(OpContext& c) {
  const auto& n = c.node;
  const int N = static_cast<int>(n.attr_int("num_heads", 0));
  const float mfv = n.attr_float("mask_filter_value", -10000.f);
  const auto& input = c.in(0);
  if (input.ndim() != 3) c.fail("input must be [batch, sequence, input_hidden]");
  const int B = input.shape(0), S = input.shape(1);
  const auto out_t = input.dtype();
  const mx::Dtype ct = compute_dtype(input, c.s);
  auto qkv = mx::matmul(mx::astype(input, ct, c.s), mx::astype(c.in(1), ct, c.s), c.s);
  if (c.has(2)) qkv = mx::add(qkv, mx::astype(c.in(2), ct, c.s), c.s);
  const int W = qkv.shape(2);
  auto sizes = n.attr_ints("qkv_hidden_sizes", {W / 3, W / 3, W - 2 * (W / 3)});
  if (sizes.size() != 3 || sizes[0] + sizes[1] + sizes[2] != W || sizes[0] != sizes[1] ||
      sizes[0] % N != 0 || sizes[2] % N != 0)
    c.fail("qkv_hidden_sizes do not match the weights");
  const int D = static_cast<int>(sizes[0]), Dv = static_cast<int>(sizes[2]), H = D / N, Hv = Dv / N;
  auto Q = to_bnsh(slice_axis(qkv, 2, 0, D, c.s), B, S, N, H, c.s);
  auto K = to_bnsh(slice_axis(qkv, 2, D, 2 * D, c.s), B, S, N, H, c.s);
  auto V = to_bnsh(slice_axis(qkv, 2, 2 * D, 2 * D + Dv, c.s), B, S, N, Hv, c.s);
  if (c.has(4)) {  // past [2, B, N, P, H]
    auto past = mx::astype(c.in(4), ct, c.s);
    K = concat_nonempty({mx::take(past, 0, 0, c.s), K}, 2, c.s);
    V = concat_nonempty({mx::take(past, 1, 0, c.s), V}, 2, c.s);
  }
  const int T = K.shape(2);
  std::optional<mx::array> bias;
  if (c.has(3)) bias = ort_mask(c, c.in(3), B, S, T, mfv, ct);
  if (n.attr_int("unidirectional", 0) != 0) bias = add_opt(bias, ort_causal(S, T, mfv, ct, c.s), c.s);
  bias = add_attention_bias(bias, c, 5, ct);
  auto out = attend(Q, K, V, default_scale(n, H), {}, bias, 0.f, {}, c.s).out;
  Outputs outs = {mx::astype(from_bnsh(out, c.s), out_t, c.s)};
  if (n.has_output(1)) {  // [2, B, N, T, H]: needs K and V of one head size
    if (Hv != H) c.fail("present needs equal Q/K and V hidden sizes");
    outs.push_back(mx::astype(mx::stack({K, V}, 0, c.s), out_t, c.s));
  }
  return outs;
}

// ---- Attention (ai.onnx 23/24) -------------------------------------------------------------------
// inputs: Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen? (24)
// outputs: Y, present_key?, present_value?, qk_matmul_output?

Support check_attention_onnx(const NodeQuery& q) {
  for (size_t i : {0, 1, 2, 4, 5})
    if (auto s = input_dtype_in(q, i, {DType::Float32, DType::Float16, DType::BFloat16}); !s) return s;
  if (q.has_input(4) != q.has_input(5)) return Support::no("Attention needs both past_key and past_value");
  return Support::yes();
}

Outputs translate_attention_onnx(OpContext& c) {
  const auto& n = c.node;
  const auto& q_in = c.in(0);
  const auto out_t = q_in.dtype();
  const mx::Dtype ct = compute_dtype(q_in, c.s);
  const bool three_d = q_in.ndim() == 3;
  mx::array Q = q_in, K = c.in(1), V = c.in(2);
  if (three_d) {
    const int Nq = static_cast<int>(n.attr_int("q_num_heads", 0));
    const int Nkv = static_cast<int>(n.attr_int("kv_num_heads", 0));
    if (Nq <= 0 || Nkv <= 0) c.fail("3-D inputs need q_num_heads and kv_num_heads");
    const int B = Q.shape(0);
    Q = to_bnsh(Q, B, Q.shape(1), Nq, Q.shape(2) / Nq, c.s);
    K = to_bnsh(K, B, K.shape(1), Nkv, K.shape(2) / Nkv, c.s);
    V = to_bnsh(V, B, V.shape(1), Nkv, V.shape(2) / Nkv, c.s);
  }
  if (Q.ndim() != 4 || K.ndim() != 4 || V.ndim() != 4) c.fail("Q, K and V must be 3-D or 4-D");
  const int B = Q.shape(0), N = Q.shape(1), S = Q.shape(2), H = Q.shape(3);
  if (N % K.shape(1) != 0) c.fail("q_num_heads must be a multiple of kv_num_heads");
  int P = 0;
  if (c.has(4)) {
    P = c.in(4).shape(2);
    K = concat_nonempty({c.in(4), K}, 2, c.s);
    V = concat_nonempty({c.in(5), V}, 2, c.s);
  }
  const int T = K.shape(2);
  // One additive float bias: attn_mask (bool -> 0/-inf; a short last axis is padded with -inf),
  // the causal triangle (offset by the past length) and the nonpad_kv_seqlen padding mask.
  std::optional<mx::array> bias;
  if (c.has(3)) {
    auto m = c.in(3);
    if (m.dtype() == mx::bool_) m = mx::where(m, mx::array(0.f, ct), mx::array(kNegInf, ct), c.s);
    m = mx::astype(m, ct, c.s);
    if (m.ndim() == 0) m = mx::reshape(m, {1}, c.s);
    const int L = m.shape(-1);
    if (L < T) {
      m = mx::pad(m, {static_cast<int>(m.ndim()) - 1}, {0}, {T - L}, mx::array(kNegInf, ct), "constant", c.s);
    } else if (L > T) {
      c.fail("attn_mask is longer than the total sequence length");
    }
    bias = m;
  }
  if (n.attr_int("is_causal", 0) != 0) {
    auto col = mx::reshape(mx::arange(T, mx::int32, c.s), {1, T}, c.s);
    auto row = mx::reshape(mx::arange(S, mx::int32, c.s), {S, 1}, c.s);
    auto causal = mx::where(mx::greater(col, mx::add(row, mx::array(P), c.s), c.s),
                            mx::array(kNegInf, ct), mx::array(0.f, ct), c.s);
    bias = add_opt(bias, causal, c.s);
  }
  if (c.has(6)) {
    auto col = mx::reshape(mx::arange(T, mx::int32, c.s), {1, 1, 1, T}, c.s);
    auto len = mx::reshape(mx::astype(c.in(6), mx::int32, c.s), {B, 1, 1, 1}, c.s);
    bias = add_opt(bias, mx::where(mx::less(col, len, c.s), mx::array(0.f, ct), mx::array(kNegInf, ct), c.s), c.s);
  }
  const int qk_mode = n.has_output(3) ? static_cast<int>(n.attr_int("qk_matmul_output_mode", 0)) : -1;
  if (qk_mode > 3) c.fail("qk_matmul_output_mode must be 0..3");
  auto r = attend(mx::astype(Q, ct, c.s), mx::astype(K, ct, c.s), mx::astype(V, ct, c.s),
                  default_scale(n, H), {}, bias, n.attr_float("softcap", 0.f), {}, c.s, qk_mode);
  mx::array y = three_d ? from_bnsh(r.out, c.s) : r.out;
  Outputs outs = {mx::astype(y, out_t, c.s), K, V};
  if (r.qk) outs.push_back(mx::astype(*r.qk, out_t, c.s));
  return outs;
}

}  // namespace ortmlx::ops::contrib
