// A decode step's GroupQueryAttention as one CPU kernel (kernels/cpu/kernels.h, cpu_decode_gqa).
#include <algorithm>
#include <cmath>
#include <optional>
#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

float dot_f32(const float* a, const float* b, int n) {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return dot_f32_avx2(a, b, n);
#endif
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x over n floats.
void axpy_f32(float a, const float* x, float* y, int n) {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return axpy_f32_avx2(a, x, y, n);
#endif
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

#ifdef ORTMLX_X86
// One query head's attention over key/value rows [lo, hi) of head size H = 16 * C (C <= 8) with
// AVX-512: each score a dot of C registers, then the softmax, then the weighted rows summed in C
// registers (the output written once, where the loops above read and write it a row at a time).
template <int C>
__attribute__((target("avx512f"))) void attend_row_avx512(const float* q, const float* k, const float* v, float* o,
                                                          float* p, int lo, int hi, float scale) {
  constexpr int H = 16 * C;
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  for (int j = lo; j < hi; ++j) {
    const float* kj = k + static_cast<size_t>(j) * H;
    __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
    for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), acc);
    p[j - lo] = scale * _mm512_reduce_add_ps(acc);
  }
  softmax_row(p, p, hi - lo);
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int j = lo; j < hi; ++j) {
    const float* vj = v + static_cast<size_t>(j) * H;
    const __m512 pj = _mm512_set1_ps(p[j - lo]);
    for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + 16 * c, acc[c]);
}

// attend_row_avx512 for H = 64 or 128; false (nothing done) for other head sizes.
bool attend_row_avx512_any(const float* q, const float* k, const float* v, float* o, float* p, int lo, int hi,
                           float scale, int H) {
  switch (H) {
    case 64: attend_row_avx512<4>(q, k, v, o, p, lo, hi, scale); return true;
    case 128: attend_row_avx512<8>(q, k, v, o, p, lo, hi, scale); return true;
    default: return false;
  }
}
#endif

// ORT's rotary embedding of one head's row at one position: the first rotary_dim values rotated
// by (cos, sin) of that position, as halves (x1 = x[i], x2 = x[i + d/2]) or interleaved pairs.
void rotate(const float* x, float* y, const float* cos, const float* sin, int H, int rotary_dim, bool interleaved) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = x[a], x2 = x[b];
    y[a] = x1 * cos[i] - x2 * sin[i];
    y[b] = x2 * cos[i] + x1 * sin[i];
  }
  for (int i = rotary_dim; i < H; ++i) y[i] = x[i];
}

// Inputs: q, k, v ([1, 1, *]: the packed projection three times, or the three projections),
// past_k, past_v ([1, Nkv, P, H]), seqlens_k ([1] int32), then cos and sin caches when rotating.
// Outputs: the attention [1, 1, N * H], present_k and present_v ([1, Nkv, T, H]).
class DecodeGqa : public mx::Primitive {
 public:
  DecodeGqa(mx::Stream s, const CpuDecodeGqa& g, bool avx512) : mx::Primitive(s), g_(g), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) begin_output(inputs, o, stream());
    const auto& past_k = inputs[3];
    const int P = past_k.shape(2), T = outputs[1].shape(2);
    const int rows = g_.rotary_dim ? inputs[6].shape(0) : 0;
    dispatch_task(stream(), [g = g_, q = RowMajorInput(inputs[0]), k = RowMajorInput(inputs[1]),
                             v = RowMajorInput(inputs[2]), pk = RowMajorInput(inputs[3]), pv = RowMajorInput(inputs[4]),
                             seqlens = inputs[5].data<int32_t>(),
                             cos_in = g_.rotary_dim ? std::optional<RowMajorInput>(inputs[6]) : std::nullopt,
                             sin_in = g_.rotary_dim ? std::optional<RowMajorInput>(inputs[7]) : std::nullopt,
                             out = outputs[0].data<float>(),
                             ok = outputs[1].data<float>(), ov = outputs[2].data<float>(), P, T, rows,
                             avx512 = avx512_] {
      const int N = g.N, Nkv = g.Nkv, H = g.H, rep = N / Nkv;
      // The step's row: the past's length (a growing cache), or seqlens_k in a shared buffer
      // (clipped to the buffer, as the GPU kernel clips it).
      const int pos = g.in_buffer ? std::clamp(seqlens[0], 0, T - 1) : P;
      const int half = g.rotary_dim / 2;
      const float* cos = cos_in ? cos_in->rows() : nullptr;
      const float* sin = sin_in ? sin_in->rows() : nullptr;
      if (g.rotary_dim && pos >= rows)
        throw std::out_of_range("GroupQueryAttention: position " + std::to_string(pos) +
                                " is past the rotary caches' " + std::to_string(rows) + " rows");
      std::vector<float> qr(static_cast<size_t>(N) * H), kr(static_cast<size_t>(Nkv) * H);
      const float* qs = q.rows() + g.q_offset;
      const float* ks = k.rows() + g.k_offset;
      const float* vs = v.rows() + g.v_offset;
      for (int n = 0; n < N; ++n)
        if (g.rotary_dim)
          rotate(qs + n * H, qr.data() + n * H, cos + pos * half, sin + pos * half, H, g.rotary_dim, g.interleaved);
        else
          std::memcpy(qr.data() + n * H, qs + n * H, sizeof(float) * H);
      for (int h = 0; h < Nkv; ++h)
        if (g.rotary_dim)
          rotate(ks + h * H, kr.data() + h * H, cos + pos * half, sin + pos * half, H, g.rotary_dim, g.interleaved);
        else
          std::memcpy(kr.data() + h * H, ks + h * H, sizeof(float) * H);
      const int hi = pos + 1, lo = g.window > 0 ? std::max(0, hi - g.window) : 0;
      const float* past_kp = pk.rows();
      const float* past_vp = pv.rows();
      // Per KV head: its present rows (the past's, unless present is the past's own buffer, then
      // the step's row), then its query heads' attention over rows [lo, hi).
      auto heads = [&](int64_t h0, int64_t h1) {
        std::vector<float> p(static_cast<size_t>(hi - lo));
        for (int h = static_cast<int>(h0); h < static_cast<int>(h1); ++h) {
          float* kh = ok + static_cast<size_t>(h) * T * H;
          float* vh = ov + static_cast<size_t>(h) * T * H;
          const size_t keep = static_cast<size_t>(std::min(P, T)) * H;
          if (kh != past_kp + static_cast<size_t>(h) * P * H) std::memcpy(kh, past_kp + static_cast<size_t>(h) * P * H, sizeof(float) * keep);
          if (vh != past_vp + static_cast<size_t>(h) * P * H) std::memcpy(vh, past_vp + static_cast<size_t>(h) * P * H, sizeof(float) * keep);
          std::memcpy(kh + static_cast<size_t>(pos) * H, kr.data() + h * H, sizeof(float) * H);
          std::memcpy(vh + static_cast<size_t>(pos) * H, vs + h * H, sizeof(float) * H);
          for (int r = 0; r < rep; ++r) {
            const int n = h * rep + r;
            const float* qn = qr.data() + n * H;
#ifdef ORTMLX_X86
            if (avx512 && attend_row_avx512_any(qn, kh, vh, out + n * H, p.data(), lo, hi, g.scale, H)) continue;
#endif
            for (int j = lo; j < hi; ++j) p[j - lo] = g.scale * dot_f32(qn, kh + static_cast<size_t>(j) * H, H);
            softmax_row(p.data(), p.data(), hi - lo);
            float* o = out + n * H;
            std::fill(o, o + H, 0.f);
            for (int j = lo; j < hi; ++j) axpy_f32(p[j - lo], vh + static_cast<size_t>(j) * H, o, H);
          }
        }
      };
      // Two threads when the copies and products are worth a hand-off: each query head's two
      // products over the attended rows, and the past's rows copied where present is not its buffer.
      const bool copies = ok != past_kp || ov != past_vp;
      const int64_t work = static_cast<int64_t>(N) * (hi - lo) * H + (copies ? int64_t{2} * Nkv * std::min(P, T) * H : 0);
      cpu_parallel_for(Nkv, work >= (int64_t{1} << 15) ? std::min(cpu_threads(), Nkv) : 1, heads);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error("[DecodeGqa] runs on the CPU stream only");
  }
  const char* name() const override { return "DecodeGqa"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(DecodeGqa) && static_cast<const DecodeGqa&>(other).g_ == g_ &&
           static_cast<const DecodeGqa&>(other).avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape present = inputs[3].shape();
    if (!g_.in_buffer) present[2] += 1;
    return {{1, 1, g_.N * g_.H}, present, present};
  }

 private:
  CpuDecodeGqa g_;
  bool avx512_;  // head sizes 64 and 128 in AVX-512 registers (cpu_avx512_kernels() at translation)
};

// Inputs: q, k, v ([1, S, *]), then cos and sin caches when rotating. Outputs: q [1, N, S, H],
// k and v [1, Nkv, S, H].
class GqaLayout : public mx::Primitive {
 public:
  GqaLayout(mx::Stream s, const CpuGqaLayout& g) : mx::Primitive(s), g_(g) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) begin_output(inputs, o, stream());
    const int S = inputs[0].shape(1);
    const int64_t wq = inputs[0].shape(2), wk = inputs[1].shape(2), wv = inputs[2].shape(2);
    dispatch_task(stream(), [g = g_, q = RowMajorInput(inputs[0]), k = RowMajorInput(inputs[1]),
                             v = RowMajorInput(inputs[2]),
                             cos_in = g_.rotary_dim ? std::optional<RowMajorInput>(inputs[3]) : std::nullopt,
                             sin_in = g_.rotary_dim ? std::optional<RowMajorInput>(inputs[4]) : std::nullopt,
                             oq = outputs[0].data<float>(), ok = outputs[1].data<float>(),
                             ov = outputs[2].data<float>(), S, wq, wk, wv] {
      const int H = g.H, half = g.rotary_dim / 2;
      const float* cos = cos_in ? cos_in->rows() : nullptr;
      const float* sin = sin_in ? sin_in->rows() : nullptr;
      const float* qs = q.rows();
      const float* ks = k.rows();
      const float* vs = v.rows();
      // Rows [s0, s1): each row's heads to their planes ([head][S][H]).
      auto rows = [&](int64_t s0, int64_t s1) {
        for (int s = static_cast<int>(s0); s < static_cast<int>(s1); ++s) {
          const float* c = cos ? cos + static_cast<size_t>(g.first + s) * half : nullptr;
          const float* sn = sin ? sin + static_cast<size_t>(g.first + s) * half : nullptr;
          auto place = [&](const float* src, float* dst, int heads, bool rotated) {
            for (int h = 0; h < heads; ++h) {
              float* d = dst + (static_cast<size_t>(h) * S + s) * H;
              if (rotated && g.rotary_dim)
                rotate(src + h * H, d, c, sn, H, g.rotary_dim, g.interleaved);
              else
                std::memcpy(d, src + h * H, sizeof(float) * H);
            }
          };
          place(qs + s * wq + g.q_offset, oq, g.N, true);
          place(ks + s * wk + g.k_offset, ok, g.Nkv, true);
          place(vs + s * wv + g.v_offset, ov, g.Nkv, false);
        }
      };
      const int64_t work = static_cast<int64_t>(S) * (g.N + 2 * g.Nkv) * H;
      cpu_parallel_for(S, work >= (int64_t{1} << 15) ? std::min(cpu_threads(), S) : 1, rows);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error("[GqaLayout] runs on the CPU stream only");
  }
  const char* name() const override { return "GqaLayout"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(GqaLayout) && static_cast<const GqaLayout&>(other).g_ == g_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const int S = inputs[0].shape(1);
    return {{1, g_.N, S, g_.H}, {1, g_.Nkv, S, g_.H}, {1, g_.Nkv, S, g_.H}};
  }

 private:
  CpuGqaLayout g_;
};

}  // namespace

std::optional<std::vector<mx::array>> cpu_decode_gqa(const mx::array& q, const mx::array& k, const mx::array& v,
                                                     const mx::array& past_k, const mx::array& past_v,
                                                     const mx::array& seqlens, const std::optional<mx::array>& cos,
                                                     const std::optional<mx::array>& sin, const CpuDecodeGqa& g,
                                                     mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || g.N <= 0 || g.Nkv <= 0 || g.N % g.Nkv || g.H <= 0)
    return std::nullopt;
  for (const auto* a : {&q, &k, &v, &past_k, &past_v})
    if (a->dtype() != mx::float32) return std::nullopt;
  if (q.size() < static_cast<size_t>(g.q_offset + g.N * g.H) || k.size() < static_cast<size_t>(g.k_offset + g.Nkv * g.H) ||
      v.size() < static_cast<size_t>(g.v_offset + g.Nkv * g.H))
    return std::nullopt;
  if (past_k.ndim() != 4 || past_k.shape(0) != 1 || past_k.shape(1) != g.Nkv || past_k.shape(3) != g.H ||
      past_v.shape() != past_k.shape() || seqlens.dtype() != mx::int32 || seqlens.size() != 1)
    return std::nullopt;
  if (g.in_buffer && past_k.shape(2) < 1) return std::nullopt;
  std::vector<mx::array> inputs{q, k, v, past_k, past_v, seqlens};
  if (g.rotary_dim) {
    if (!cos || !sin || cos->dtype() != mx::float32 || sin->dtype() != mx::float32 || cos->ndim() != 2 ||
        sin->shape() != cos->shape() || 2 * cos->shape(1) != g.rotary_dim || g.rotary_dim > g.H)
      return std::nullopt;
    inputs.push_back(*cos);
    inputs.push_back(*sin);
  }
  mx::Shape present = past_k.shape();
  if (!g.in_buffer) present[2] += 1;
  return mx::array::make_arrays({{1, 1, g.N * g.H}, present, present}, {mx::float32, mx::float32, mx::float32},
                                std::make_shared<DecodeGqa>(s, g, cpu_avx512_kernels()), std::move(inputs));
}

std::optional<std::vector<mx::array>> cpu_gqa_layout(const mx::array& q, const mx::array& k, const mx::array& v,
                                                     const std::optional<mx::array>& cos,
                                                     const std::optional<mx::array>& sin, const CpuGqaLayout& g,
                                                     mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || g.N <= 0 || g.Nkv <= 0 || g.H <= 0 || g.first < 0)
    return std::nullopt;
  for (const auto* a : {&q, &k, &v})
    if (a->dtype() != mx::float32 || a->ndim() != 3 || a->shape(0) != 1 || a->shape(1) != q.shape(1)) return std::nullopt;
  const int S = q.shape(1);
  if (S < 1 || q.shape(2) < g.q_offset + g.N * g.H || k.shape(2) < g.k_offset + g.Nkv * g.H ||
      v.shape(2) < g.v_offset + g.Nkv * g.H)
    return std::nullopt;
  std::vector<mx::array> inputs{q, k, v};
  if (g.rotary_dim) {
    if (!cos || !sin || cos->dtype() != mx::float32 || sin->dtype() != mx::float32 || cos->ndim() != 2 ||
        sin->shape() != cos->shape() || 2 * cos->shape(1) != g.rotary_dim || g.rotary_dim > g.H ||
        static_cast<int64_t>(g.first) + S > cos->shape(0))
      return std::nullopt;
    inputs.push_back(*cos);
    inputs.push_back(*sin);
  }
  return mx::array::make_arrays({{1, g.N, S, g.H}, {1, g.Nkv, S, g.H}, {1, g.Nkv, S, g.H}},
                                {mx::float32, mx::float32, mx::float32}, std::make_shared<GqaLayout>(s, g),
                                std::move(inputs));
}

}  // namespace ortmlx::ops
