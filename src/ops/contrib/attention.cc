// Attention ops: MultiHeadAttention and Attention (com.microsoft), Attention (ai.onnx 23/24), and
// the core they share with GroupQueryAttention (gqa.cc).
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

#include "ops/contrib/attention_core.h"
#include "kernels/cpu/kernels.h"
#include "ops/switches.h"

namespace ortmlx::ops::contrib {

static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Attn attend(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
            const std::optional<mx::array>& mask, const std::optional<mx::array>& bias,
            float softcap, const std::optional<mx::array>& sinks, mx::Stream s, int qk_mode,
            bool causal) {
  const auto t = q.dtype();
  // One query row on the CPU (a decode step): the explicit math below with BLAS gemv products.
  // MLX's fused attention falls back to sgemm there, which packs K and V on every call.
  const bool row_gemv = q.shape(2) == 1 && t == mx::float32 && s.device == mx::Device::cpu &&
                        cpu_gemv_available();
  // Several query rows on the CPU (a prompt): the explicit math too, for the EP's softmax kernel;
  // MLX's fused attention has no CPU kernel, and its composed form's softmax runs exp one lane
  // at a time (most of a 1024-token prompt's time).
  const bool cpu_rows = t == mx::float32 && s.device == mx::Device::cpu && cpu_row_kernels_enabled();
  if (softcap <= 0.f && qk_mode < 0 && !row_gemv && !cpu_rows) {
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
  // Several query rows on the CPU with AVX-512: the EP's attention kernel (kernels/cpu/
  // attention.cc), the mask folded into the bias as -inf, grouped heads read in place.
  if (cpu_rows && !row_gemv && softcap <= 0.f && qk_mode < 0 && !sinks && translation_switches().cpu_attention) {
    std::optional<mx::array> add;
    if (bias) add = mx::astype(*bias, t, s);
    if (mask) add = mx::where(*mask, add ? *add : mx::array(0.f, t), mx::array(kNegInf, t), s);
    // Rank 4: the kernel writes [B, S, N, Hv] (heads side by side), returned as the [B, N, S, Hv]
    // view of it: from_bnsh's transpose back is then row-contiguous and its reshape a view.
    const bool heads_inner = q.ndim() == 4;
    if (auto y = cpu_attention(q, mx::swapaxes(k, -1, -2, s), v, scale, false, add, s, causal && !mask, heads_inner))
      return {heads_inner ? mx::transpose(*y, {0, 2, 1, 3}, s) : *y, {}};
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
  } else if (auto p = row_gemv || cpu_rows ? cpu_softmax_last_axis(scores, s) : std::nullopt) {
    probs = *p;  // on the CPU: the vectorized softmax (kernels/cpu/kernels.h)
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
// nothing and is left out (see known_all_zero); the option zero_bias=0 keeps it (for A/Bs).
std::optional<mx::array> add_attention_bias(const std::optional<mx::array>& bias, OpContext& c, size_t i,
                                            mx::Dtype t) {
  if (!c.has(i) || (translation_switches().zero_bias && known_all_zero(c.in(i)))) return bias;
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
      // The option grouped_kv=0 keeps the repeated K/V (for A/Bs).
      if (!c.has(3) && !c.has(6) && !n.has_output(1) && !n.has_output(2) && translation_switches().grouped_kv) {
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
