// Scaled-dot-product attention of an encoder's heads in one primitive: cpu_attention of
// kernels/cpu/kernels.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

// One input's reads: its data, the strides of the two leading (batch, head) dims (0 where
// broadcast) and of its last two.
struct View {
  const float* p;
  int64_t lead0, lead1, row, col;
};

View view_of(const mx::array& a) {
  const int nd = static_cast<int>(a.ndim());
  const auto& st = a.strides();
  return {a.data<float>(), nd == 4 ? st[0] : 0, st[nd - 3], st[nd - 2], st[nd - 1]};
}

struct AttentionShape {
  int64_t lead0, lead1, S, H, T, Hv;  // q [lead0, lead1, S, H], kt [.., H, T], v [.., T, Hv]
  bool divide;                        // ONNX's Div: scores / scale, else scores * scale
  float scale;
  bool has_bias;
  int64_t kv_rep;  // query heads per K/V head (grouped heads): K/V head = head / kv_rep
  bool causal;     // query row i sees keys [0, T - S + i] (bottom-right aligned)
  bool heads_inner;  // the output [lead0, S, lead1, Hv], else [lead0, lead1, S, Hv]
  bool operator==(const AttentionShape&) const = default;
  // Pair (b0, b1)'s first output row, and the distance between its rows.
  int64_t out_offset(int64_t b0, int64_t b1) const {
    return heads_inner ? (b0 * S * lead1 + b1) * Hv : (b0 * lead1 + b1) * S * Hv;
  }
  int64_t out_row_stride() const { return heads_inner ? lead1 * Hv : Hv; }
};

// The reference row: max-shifted exp, sum, times the sum's inverse (RowSoftmax's arithmetic),
// for rows holding a NaN or whose maximum is not finite (then NaN, as a softmax gives).
void softmax_row_scalar(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) nan = nan || std::isnan(x[j]), m = std::max(m, x[j]);
  if (nan) m = std::numeric_limits<float>::quiet_NaN();
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
  for (int64_t j = 0; j < n; ++j) x[j] *= 1.f / sum;
}

#ifdef ORTMLX_X86
// GCC 12's unpack and reduce intrinsics start from an undefined vector, which its flow analysis
// reports as read uninitialized where they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Scores of R query rows against keys [j0, j0 + 16 NB): s[r][j] = sum_h q[r][h] kt[h][j], kt
// packed [H][Tp] (Tp: T rounded up to 16, zero-padded). R x NB accumulators, fixed at compile
// time so that they stay in registers.
template <int R, int NB>
__attribute__((target("avx512f"))) void scores_block(const float* const* q, const float* kt, int64_t H, int64_t Tp,
                                                     int64_t j0, float* s, int64_t s_stride) {
  __m512 acc[R][NB];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  const float* kr = kt + j0;
  for (int64_t h = 0; h < H; ++h, kr += Tp) {
    __m512 k[NB];
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) k[b] = _mm512_loadu_ps(kr + 16 * b);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r][h]);
      #pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(qv, k[b], acc[r][b]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(s + r * s_stride + j0 + 16 * b, acc[r][b]);
}

// f(std::integral_constant<int, NB>, c0) over columns [0, cols) in blocks of up to Max x 16 (the
// last block's NB covers the rest, rounded up to 16): the tiles' block count fixed at compile
// time, so that their accumulators stay in registers.
template <int Max, class F>
void column_blocks(int64_t cols, F&& f) {
  int64_t c0 = 0;
  for (; c0 + 16 * Max <= cols; c0 += 16 * Max) f(std::integral_constant<int, Max>{}, c0);
  // The rest: up to Max blocks (a width of 16 Max - 15 .. 16 Max - 1 takes Max).
  switch ((cols - c0 + 15) / 16) {
    case 4: if constexpr (Max >= 4) f(std::integral_constant<int, 4>{}, c0); break;
    case 3: if constexpr (Max >= 3) f(std::integral_constant<int, 3>{}, c0); break;
    case 2: if constexpr (Max >= 2) f(std::integral_constant<int, 2>{}, c0); break;
    case 1: f(std::integral_constant<int, 1>{}, c0); break;
    default: break;
  }
}

// Columns [0, cols) (a multiple of 16) of the scores; kt's rows are Tp apart.
template <int R>
void scores_rows(const float* const* q, const float* kt, int64_t H, int64_t cols, int64_t Tp, float* s,
                 int64_t s_stride) {
  column_blocks<4>(cols, [&](auto nb, int64_t j0) {
    scores_block<R, decltype(nb)::value>(q, kt, H, Tp, j0, s, s_stride);
  });
}

// Entries [j, j + 16) of a bias row (column stride bstep) under mask k.
__attribute__((target("avx512f"))) inline __m512 bias_block(const float* bias, int64_t bstep, int64_t j, int64_t T,
                                                            __mmask16 k) {
  if (bstep == 1) return _mm512_maskz_loadu_ps(k, bias + j);
  if (bstep == 0) return _mm512_set1_ps(bias[0]);
  alignas(64) float tmp[16] = {};
  for (int64_t t = 0; t < std::min<int64_t>(16, T - j); ++t) tmp[t] = bias[(j + t) * bstep];
  return _mm512_load_ps(tmp);
}

// R rows of scores in place (rows `stride` apart, T entries each): scaled, plus the row's bias
// (bias[r], column stride bstep; none when null), then softmax. The rows go through each pass
// together, so that one row's reductions overlap the others' work.
template <int R>
__attribute__((target("avx512f"))) void finish_rows(float* s, int64_t stride, int64_t T, bool divide, float scale,
                                                    const float* const* bias, int64_t bstep) {
  // A division by the scale is a product by its inverse, as ORT's CPU EP computes it (its
  // MatMul scale fusion makes the Div the product's alpha): a vector division costs ten times more.
  const __m512 sc = _mm512_set1_ps(divide ? 1.f / scale : scale);
  __m512 vmax[R];
  __mmask16 nan[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) vmax[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), nan[r] = 0;
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = tail_mask(T - j);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* row = s + r * stride;
      __m512 x = _mm512_maskz_loadu_ps(k, row + j);
      x = _mm512_mul_ps(x, sc);
      if (bias) x = _mm512_add_ps(x, bias_block(bias[r], bstep, j, T, k));
      _mm512_mask_storeu_ps(row + j, k, x);
      nan[r] |= _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q);
      vmax[r] = _mm512_mask_max_ps(vmax[r], k, vmax[r], x);
    }
  }
  __m512 mv[R], vs[R];
  bool exact[R];  // rows holding a NaN or whose maximum is not finite take the reference row
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float m = _mm512_reduce_max_ps(vmax[r]);
    exact[r] = nan[r] || !std::isfinite(m);
    mv[r] = _mm512_set1_ps(m), vs[r] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = tail_mask(T - j);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (exact[r]) continue;
      float* row = s + r * stride;
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), mv[r]));
      _mm512_mask_storeu_ps(row + j, k, e);
      vs[r] = _mm512_mask_add_ps(vs[r], k, vs[r], e);
    }
  }
  __m512 inv[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) inv[r] = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(vs[r]));
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = tail_mask(T - j);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (exact[r]) continue;
      float* row = s + r * stride;
      _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), inv[r]));
    }
  }
  for (int r = 0; r < R; ++r)
    if (exact[r]) softmax_row_scalar(s + r * stride, T);
}

// out[r][c0 .. c0 + 16 NB) = sum_j p[r][j] v[j][..], v packed [T][Hv] (row stride Hv); the
// last block masked to Hv.
template <int R, int NB>
__attribute__((target("avx512f"))) void weighted_block(const float* p, int64_t p_stride, const float* v, int64_t T,
                                                       int64_t Hv, int64_t c0, float* const* out) {
  __mmask16 km[NB];
  #pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) km[b] = tail_mask(Hv - c0 - 16 * b);
  __m512 acc[R][NB];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  const float* vr = v + c0;
  for (int64_t j = 0; j < T; ++j, vr += Hv) {
    __m512 vv[NB];
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) vv[b] = _mm512_maskz_loadu_ps(km[b], vr + 16 * b);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 pv = _mm512_set1_ps(p[r * p_stride + j]);
      #pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(pv, vv[b], acc[r][b]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) _mm512_mask_storeu_ps(out[r] + c0 + 16 * b, km[b], acc[r][b]);
}

// Up to 16 accumulators: 8 rows take 32 columns a block, fewer rows 64.
template <int R>
void weighted_rows(const float* p, int64_t p_stride, const float* v, int64_t T, int64_t Hv, float* const* out) {
  column_blocks<(R > 4 ? 2 : 4)>(
      Hv, [&](auto nb, int64_t c0) { weighted_block<R, decltype(nb)::value>(p, p_stride, v, T, Hv, c0, out); });
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r, c < 16.
__attribute__((target("avx512f"))) void transpose16(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m512 r[16], t[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld_src);
  #pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4 i + q]: in its 128-bit lane L, column 4 L + q of rows 4 i .. 4 i + 3.
  #pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    t[q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);
    t[4 + q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
    t[8 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
    t[12 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
  }
  #pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
    r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xdd);
    r[4 + q] = _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0x88);
    r[12 + q] = _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0xdd);
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld_dst, r[i]);
}

// One (batch, head) pair: K^T and V gathered into packed scratch (V's rows, as a head's slice of
// wider rows, lie so many lines apart that they share few L1 sets), then the query rows eight at
// a time (scores, softmax, weighted values), every intermediate in the thread's scratch.
__attribute__((target("avx512f"))) void attend_pair(const AttentionShape& g, const View& q, const View& kt, const View& v,
                                                    const View* bias, float* out, int64_t b0, int64_t b1,
                                                    std::vector<float>& scratch) {
  const int64_t Tp = (g.T + 15) / 16 * 16;
  constexpr int kRows = 8;
  scratch.resize(static_cast<size_t>(g.H * Tp + g.T * g.Hv + kRows * Tp + kRows * g.H));
  float* kp = scratch.data();
  float* vp = kp + g.H * Tp;
  float* sp = vp + g.T * g.Hv;
  float* qp = sp + kRows * Tp;
  const int64_t kvh = b1 / g.kv_rep;
  const float* kb = kt.p + b0 * kt.lead0 + kvh * kt.lead1;
  if (kt.row == 1 && kt.col != 1) {
    // K as it lies ([T, H] rows, as K^T's transpose view of it reads): transposed in 16 x 16
    // blocks into the packed buffer (which stays in cache), the edges a value at a time;
    // reading K^T's rows instead would stride across T lines per row.
    for (int64_t h = 0; h < g.H; ++h) std::fill(kp + h * Tp + g.T, kp + (h + 1) * Tp, 0.f);
    const int64_t T16 = g.T / 16 * 16, H16 = g.H / 16 * 16;
    for (int64_t j = 0; j < T16; j += 16)
      for (int64_t h = 0; h < H16; h += 16) transpose16(kb + j * kt.col + h, kt.col, kp + h * Tp + j, Tp);
    for (int64_t j = 0; j < g.T; ++j) {
      const float* src = kb + j * kt.col;
      for (int64_t h = j < T16 ? H16 : 0; h < g.H; ++h) kp[h * Tp + j] = src[h];
    }
  } else {
    for (int64_t h = 0; h < g.H; ++h) {
      float* dst = kp + h * Tp;
      const float* src = kb + h * kt.row;
      if (kt.col == 1) std::copy(src, src + g.T, dst);
      else
        for (int64_t j = 0; j < g.T; ++j) dst[j] = src[j * kt.col];
      std::fill(dst + g.T, dst + Tp, 0.f);
    }
  }
  const float* vb = v.p + b0 * v.lead0 + kvh * v.lead1;
  for (int64_t j = 0; j < g.T; ++j) {
    const float* src = vb + j * v.row;
    float* dst = vp + j * g.Hv;
    if (v.col == 1) std::copy(src, src + g.Hv, dst);
    else
      for (int64_t c = 0; c < g.Hv; ++c) dst[c] = src[c * v.col];
  }
  const float* qb = q.p + b0 * q.lead0 + b1 * q.lead1;
  const float* bb = bias ? bias->p + b0 * bias->lead0 + b1 * bias->lead1 : nullptr;
  for (int64_t i0 = 0; i0 < g.S; i0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, g.S - i0));
    const float* qr[kRows];
    float* orow[kRows];
    const float* brow[kRows];
    for (int r = 0; r < rows; ++r) {
      const float* src = qb + (i0 + r) * q.row;
      if (q.col == 1) {
        qr[r] = src;
      } else {
        float* dst = qp + r * g.H;
        for (int64_t h = 0; h < g.H; ++h) dst[h] = src[h * q.col];
        qr[r] = dst;
      }
      orow[r] = out + (i0 + r) * g.out_row_stride();
      brow[r] = bb ? bb + (i0 + r) * bias->row : nullptr;
    }
    const int64_t bstep = bias ? bias->col : 0;
    // Causal: the block's last row sees keys [0, T - S + i0 + rows); the keys past a row's own
    // last one take no part in its softmax (probability 0 in the weighted sum).
    const int64_t seen = g.causal ? std::clamp<int64_t>(g.T - g.S + i0 + rows, 0, g.T) : g.T;
    const int64_t seen_p = (seen + 15) / 16 * 16;
    if (rows == kRows) {
      scores_rows<4>(qr, kp, g.H, seen_p, Tp, sp, Tp);
      scores_rows<4>(qr + 4, kp, g.H, seen_p, Tp, sp + 4 * Tp, Tp);
    } else {
      for (int r = 0; r < rows; ++r) scores_rows<1>(qr + r, kp, g.H, seen_p, Tp, sp + r * Tp, Tp);
    }
    if (rows == kRows && !g.causal) {
      finish_rows<kRows>(sp, Tp, g.T, g.divide, g.scale, bb ? brow : nullptr, bstep);
    } else {
      for (int r = 0; r < rows; ++r) {
        float* row = sp + r * Tp;
        const int64_t n = g.causal ? std::clamp<int64_t>(g.T - g.S + i0 + r + 1, 0, g.T) : g.T;
        if (n == 0) {  // no key to attend to: a softmax of nothing but -inf
          std::fill(row, row + seen, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        finish_rows<1>(row, Tp, n, g.divide, g.scale, bb ? brow + r : nullptr, bstep);
        std::fill(row + n, row + seen, 0.f);
      }
    }
    if (rows == kRows) weighted_rows<kRows>(sp, Tp, vp, seen, g.Hv, orow);
    else
      for (int r = 0; r < rows; ++r) weighted_rows<1>(sp + r * Tp, Tp, vp, seen, g.Hv, orow + r);
  }
}
#pragma GCC diagnostic pop
#endif

mx::Shape output_shape(const mx::Shape& q, const AttentionShape& g) {
  mx::Shape out = q;
  out.back() = static_cast<int>(g.Hv);
  if (g.heads_inner) std::swap(out[1], out[2]);
  return out;
}

class Attention : public mx::UnaryPrimitive {
 public:
  Attention(mx::Stream st, const AttentionShape& g) : mx::UnaryPrimitive(st), g_(g) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    std::optional<View> bias;
    if (g_.has_bias) bias = view_of(inputs[3]);
    dispatch_task(stream(), [g = g_, q = view_of(inputs[0]), kt = view_of(inputs[1]), v = view_of(inputs[2]), bias,
                             yp = out.data<float>()] {
#ifdef ORTMLX_X86
      const int64_t pairs = g.lead0 * g.lead1;
      const double flops = 4.0 * static_cast<double>(pairs) * g.S * g.T * std::max(g.H, g.Hv);
      auto run = [&](int64_t p0, int64_t p1) {
        std::vector<float> scratch;
        for (int64_t p = p0; p < p1; ++p)
          attend_pair(g, q, kt, v, bias ? &*bias : nullptr, yp + g.out_offset(p / g.lead1, p % g.lead1), p / g.lead1,
                      p % g.lead1, scratch);
      };
      cpu_parallel_for(pairs, flops >= 2e5 ? std::min<int64_t>(cpu_threads(), pairs) : 1, run);
#else
      throw std::logic_error("[FusedAttention] needs an x86-64 CPU with AVX-512");
#endif
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[FusedAttention] runs on the CPU stream only");
  }
  const char* name() const override { return "FusedAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Attention*>(&other);
    return o && o->g_ == g_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {output_shape(inputs[0].shape(), g_)};
  }

 private:
  AttentionShape g_;
};

}  // namespace

std::optional<mx::array> cpu_attention(const mx::array& q, const mx::array& kt, const mx::array& v, float scale,
                                       bool divide, const std::optional<mx::array>& bias, mx::Stream s, bool causal,
                                       bool heads_inner) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || !cpu_avx512_kernels()) return std::nullopt;
  const int nd = static_cast<int>(q.ndim());
  if (heads_inner && nd != 4) return std::nullopt;
  if ((nd != 3 && nd != 4) || kt.ndim() != q.ndim() || v.ndim() != q.ndim() || q.dtype() != mx::float32 ||
      kt.dtype() != mx::float32 || v.dtype() != mx::float32 || q.size() == 0 || kt.size() == 0 || v.size() == 0)
    return std::nullopt;
  // A divisor whose inverse is not a normal float (the kernel multiplies by it): the composed ops.
  if (divide && !std::isnormal(1.f / scale)) return std::nullopt;
  const int S = q.shape(-2), H = q.shape(-1), T = kt.shape(-1), Hv = v.shape(-1);
  if (kt.shape(-2) != H || v.shape(-2) != T) return std::nullopt;
  // The leading dims: q's, which kt, v and the bias broadcast to (zero strides); or, grouped
  // heads, K/V with fewer heads that each serve kv_rep query heads.
  mx::Shape lead(q.shape().begin(), q.shape().end() - 2);
  const int heads = lead.back(), kv_heads = nd == 4 ? kt.shape(1) : heads;
  const bool grouped = nd == 4 && kv_heads != heads && kv_heads != 1;
  if (grouped && (heads % kv_heads != 0 || v.shape(1) != kv_heads)) return std::nullopt;
  for (const auto* a : {&kt, &v})
    for (int d = 0; d < nd - 2; ++d)
      if (a->shape(d) != lead[d] && a->shape(d) != 1 && !(grouped && d == 1)) return std::nullopt;
  auto widen = [&](const mx::array& a, int rows, int cols) {
    mx::Shape sh = lead;
    if (grouped) sh[1] = kv_heads;
    sh.push_back(rows);
    sh.push_back(cols);
    return mx::broadcast_to(a, sh, s);
  };
  std::vector<mx::array> in{q, widen(kt, H, T), widen(v, T, Hv)};
  if (bias) {
    if (bias->dtype() != mx::float32 || bias->ndim() > q.ndim()) return std::nullopt;
    mx::Shape full = lead;
    full.push_back(S);
    full.push_back(T);
    try {
      if (mx::broadcast_shapes(bias->shape(), full) != full) return std::nullopt;  // it would widen the scores
    } catch (const std::exception&) {
      return std::nullopt;  // not broadcastable: the composed ops say so
    }
    in.push_back(mx::broadcast_to(*bias, full, s));
  }
  const AttentionShape g{nd == 4 ? lead[0] : 1, lead[nd - 3], S, H, T, Hv, divide, scale, bias.has_value(),
                         grouped ? heads / kv_heads : 1, causal, heads_inner};
  return mx::array(output_shape(q.shape(), g), mx::float32, std::make_shared<Attention>(s, g), std::move(in));
}

}  // namespace ortmlx::ops
