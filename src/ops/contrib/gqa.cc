// GroupQueryAttention (com.microsoft), the onnxruntime-genai decoder form: rotary, the KV cache
// (a growing past or a shared past/present buffer) and grouped-head attention through the
// shared core (attention_core.h), or on a CUDA GPU the one-row decode kernel (kernels/cuda).
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/cuda/decode_attention.h"
#include "ops/contrib/attention_core.h"
#include "ops/switches.h"

namespace ortmlx::ops::contrib {

namespace {

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

// A shared-buffer decode step (S = 1, the past buffer at least total_sequence_length long) through
// kernels::cuda::decode_attention_qkv: the projections read flat (as_rows), no slices, reshapes,
// transposes or rotary kernel. The present buffers are slice updates at seqlens_k of the past
// ones, which the engine writes as rows in place (RowUpdate). std::nullopt: the general path.
std::optional<Outputs> gqa_step(OpContext& c, bool packed, int N, int Nkv, int H, float scale, int window,
                                float softcap, const mx::array& past_k, const mx::array& past_v) {
  const auto& n = c.node;
  const auto& query = c.in(0);
  if (c.s.device != mx::Device::gpu || softcap > 0.f || c.has(9) || c.has(10) || c.has(11) || n.attr_int("smooth_softmax", -1) == 1 ||
      query.dtype() != past_k.dtype())
    return std::nullopt;
  const int B = query.shape(0), T = past_k.shape(2);
  kernels::cuda::ProjectionLayout layout;
  const auto q = as_rows(query, c.s);
  mx::array k = q, v = q;
  if (packed) {
    const int W = query.shape(2);
    layout = {W, 0, W, N * H, W, (N + Nkv) * H};
  } else {
    k = as_rows(c.in(1), c.s);
    v = as_rows(c.in(2), c.s);
    layout = {N * H, 0, Nkv * H, 0, Nkv * H, 0};
  }
  std::optional<mx::array> cos, sin;
  if (n.attr_int("do_rotary", 0) == 1) {
    cos = c.in(7);
    sin = c.in(8);
    layout.interleaved = n.attr_int("rotary_interleaved", 0) == 1;
  }
  const auto& seqlens = c.in(5);
  auto step = kernels::cuda::decode_attention_qkv(q, k, v, cos, sin, past_k, past_v, seqlens,
                                                  {N, Nkv, scale, window, translation_switches().gpu_attention_split_rows},
                                                  layout, c.s);
  if (!step) return std::nullopt;
  // The row each sequence writes: its past length (seqlens_k for one new token), clipped to the
  // buffer as the kernel clips it; one array for every layer of the step.
  auto start = c.shared_result("gqa_step_row:" + std::to_string(B) + ":" + std::to_string(T), {seqlens},
                               [&]() -> std::vector<mx::array> {
                                 auto p = mx::reshape(mx::astype(seqlens, mx::int32, c.s), {B}, c.s);
                                 return {mx::clip(p, mx::array(0), mx::array(T - 1), c.s)};
                               })[0];
  auto present = [&](const mx::array& past, const mx::array& row) {
    return B == 1 ? mx::slice_update(past, row, start, {2}, c.s) : gqa_present(past, row, start, T, c.s);
  };
  return Outputs{rows_to(step->out, query, c.s), present(past_k, step->k_row), present(past_v, step->v_row)};
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

namespace {

// The CPU kernels' view of the node's heads (a packed projection: k and v past q in the same
// row), with the rotary caches when it rotates.
CpuGqaHeads kernel_heads(OpContext& c, bool packed, int N, int Nkv, int H, std::optional<mx::array>& cos,
                         std::optional<mx::array>& sin) {
  CpuGqaHeads h;
  h.N = N, h.Nkv = Nkv, h.H = H;
  if (packed) h.k_offset = N * H, h.v_offset = (N + Nkv) * H;
  if (c.node.attr_int("do_rotary", 0) == 1) {
    cos = c.in(7), sin = c.in(8);
    h.rotary_dim = 2 * cos->shape(1);
    h.interleaved = c.node.attr_int("rotary_interleaved", 0) == 1;
  }
  return h;
}

}  // namespace

// One function, though long: the node's forms (packed or separate QKV, rotary, first prompt,
// growing past or shared buffer, window, bias, sinks) are decided in order and each decision
// feeds the later ones; as separate steps they would hand a dozen values between them.
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
  // A decode step on the CPU (a growing cache or a shared buffer): one EP kernel rotates, writes
  // the present rows and attends (kernels/cpu/decode_attention.cc).
  if (c.s.device == mx::Device::cpu && translation_switches().cpu_gqa_step && B == 1 && S == 1 && past_k &&
      (buffer_step || (known_past && *known_past == P && P + 1 == T)) && softcap <= 0.f && !c.has(9) &&
      !c.has(10) && !c.has(11) && n.attr_int("smooth_softmax", -1) != 1) {
    CpuDecodeGqa g;
    std::optional<mx::array> cos, sin;
    static_cast<CpuGqaHeads&>(g) = kernel_heads(c, packed, N, Nkv, H, cos, sin);
    g.scale = scale, g.window = window, g.in_buffer = buffer_step;
    const auto seqlens = mx::reshape(mx::astype(c.in(5), mx::int32, c.s), {1}, c.s);
    if (auto r = cpu_decode_gqa(query, packed ? query : c.in(1), packed ? query : c.in(2), *past_k, *past_v, seqlens,
                                cos, sin, g, c.s))
      return {(*r)[0], (*r)[1], (*r)[2]};
  }
  // A decode step into the shared buffer on a CUDA GPU, from the projections as they come: one
  // EP kernel rotates q and k, attends (as the one-row kernel below) and gives the step's key and
  // value rows, which the present buffers take at the step's position (see gqa_step).
  if (buffer_step && translation_switches().gqa_step_kernel)
    if (auto out = gqa_step(c, packed, N, Nkv, H, scale, window, softcap, *past_k, *past_v)) return *out;

  auto seqlens = mx::reshape(mx::astype(c.in(5), mx::int32, c.s), {B}, c.s);
  auto total_b = mx::add(seqlens, mx::array(1), c.s);
  auto past_len = known_past ? mx::full({1}, *known_past, mx::int32, c.s)
                  : first_prompt ? mx::zeros({B}, mx::int32, c.s)
                                 : mx::subtract(total_b, mx::array(S), c.s);

  // A prompt (or a chunk after a known past) on the CPU: one EP kernel lays q, k and v out per
  // head, q and k rotated at their positions (kernels/cpu/decode_attention.cc, cpu_gqa_layout).
  std::optional<std::vector<mx::array>> laid_out;
  if (c.s.device == mx::Device::cpu && translation_switches().cpu_gqa_prompt && B == 1 && S > 1 && known_past &&
      !c.has(9)) {
    CpuGqaLayout g;
    std::optional<mx::array> cos, sin;
    static_cast<CpuGqaHeads&>(g) = kernel_heads(c, packed, N, Nkv, H, cos, sin);
    g.first = *known_past;
    laid_out = cpu_gqa_layout(query, packed ? query : c.in(1), packed ? query : c.in(2), cos, sin, g, c.s);
  }
  std::optional<mx::array> buffer_out;
  if (laid_out) {
    Q = (*laid_out)[0], K = (*laid_out)[1], V = (*laid_out)[2];
  } else {
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
    if (buffer_step && translation_switches().gpu_kernels && softcap <= 0.f && !c.has(10) && !c.has(11) &&
        n.attr_int("smooth_softmax", -1) != 1 && Q.dtype() == past_k->dtype())
      buffer_out = kernels::cuda::decode_attention(
          mx::reshape(Q, {B, N, H}, c.s), mx::reshape(K, {B, Nkv, H}, c.s), mx::reshape(V, {B, Nkv, H}, c.s),
          *past_k, *past_v, seqlens, {N, Nkv, scale, window, translation_switches().gpu_attention_split_rows}, c.s);
    Q = mx::transpose(Q, {0, 2, 1, 3}, c.s);
    K = mx::transpose(K, {0, 2, 1, 3}, c.s);
    V = mx::transpose(V, {0, 2, 1, 3}, c.s);
  }

  mx::array present_k = K, present_v = V;
  if (known_past && past_k && *known_past == P && P + S == T) {
    // The usual decode step (on the CPU by chunk copies: see cpu_concat).
    present_k = concat_nonempty({*past_k, K}, 2, c.s);
    present_v = concat_nonempty({*past_v, V}, 2, c.s);
  } else if ((past_k && past_k->size() > 0) || !first_prompt || T != S) {
    // (a first prompt's empty past adds no rows: its present is its own keys and values)
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

}  // namespace ortmlx::ops::contrib
