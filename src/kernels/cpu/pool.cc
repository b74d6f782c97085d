// 2-D max and average pooling over NCHW float32 on MLX's CPU stream (kernels/cpu/kernels.h:
// cpu_pool_2d).
//
// Why: MLX has no pooling primitive; the translator's form (a padded copy, then one strided view
// per kernel tap folded by maximum/add) runs on MLX's one stream thread, reading the input once
// per tap through generic strided indexing. Here a window's rows are reduced first (a pass over
// each needed input row), then the rows of each output (contiguous, vectorized), planes split
// over threads.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// max that keeps a NaN from either side, as MLX's maximum does. The comparison compiles to a
// branch-free maxss; the NaN test is a branch that random data always predicts.
inline float nan_max(float acc, float v) {
  float m = v > acc ? v : acc;
  return v != v ? v : m;
}

#ifdef ORTMLX_X86
__attribute__((target("avx2"))) inline __m256 nan_max8(__m256 acc, __m256 v) {
  const __m256 m = _mm256_max_ps(v, acc);  // acc where either is NaN: keeps a NaN acc
  return _mm256_blendv_ps(m, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// The even elements of p[0..15].
__attribute__((target("avx2"))) inline __m256 load_even(const float* p) {
  const __m256 t = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
}

// t[o] op= r[o * stride] for o in [o0, o1), stride 1 or 2, where r[(o1 - 1) * stride + stride - 1]
// may be read (bounds are the caller's). Returns where it stopped.
template <bool Max>
__attribute__((target("avx2"))) int64_t fold_row_avx2(float* t, const float* r, int64_t o0, int64_t o1, int stride) {
  int64_t o = o0;
  for (; o + 8 <= o1; o += 8) {
    const __m256 v = stride == 1 ? _mm256_loadu_ps(r + o) : load_even(r + 2 * o);
    const __m256 a = _mm256_loadu_ps(t + o);
    _mm256_storeu_ps(t + o, Max ? nan_max8(a, v) : _mm256_add_ps(a, v));
  }
  return o;
}

__attribute__((target("avx512f"))) inline __m512 nan_max16(__m512 acc, __m512 v) {
  const __m512 m = _mm512_max_ps(v, acc);  // acc where either is NaN: keeps a NaN acc
  return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}

// fold_row_avx2's work 16 outputs a step, the last step's lanes masked, r read only below
// `readable` (a stride-2 step loads 32 floats and keeps the even ones). Why: the pools of small
// planes (7 to 28 wide) left most outputs to the scalar tail.
template <bool Max>
__attribute__((target("avx512f"))) void fold_row_avx512(float* t, const float* r, int64_t o0, int64_t o1, int stride,
                                                        int64_t readable) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int64_t o = o0; o < o1; o += 16) {
    const __mmask16 out = first_lanes(o1 - o);
    __m512 v;
    if (stride == 1) {
      v = _mm512_maskz_loadu_ps(out, r + o);
    } else {
      const int64_t avail = readable - 2 * o;  // floats readable from r + 2o
      const __m512 a = _mm512_maskz_loadu_ps(first_lanes(avail), r + 2 * o);
      const __m512 b = _mm512_maskz_loadu_ps(first_lanes(avail - 16), r + 2 * o + 16);
      v = _mm512_permutex2var_ps(a, even, b);
    }
    const __m512 acc = _mm512_maskz_loadu_ps(out, t + o);
    _mm512_mask_storeu_ps(t + o, out, Max ? nan_max16(acc, v) : _mm512_add_ps(acc, v));
  }
}
#endif

template <bool Max>
void fold_row(float* t, const float* r, int64_t o0, int64_t o1, int stride, int64_t readable, bool avx512) {
  int64_t o = o0;
#ifdef ORTMLX_X86
  if ((stride == 1 || stride == 2) && avx512) return fold_row_avx512<Max>(t, r, o0, o1, stride, readable);
#else
  (void)avx512;
#endif
#ifdef ORTMLX_X86
  // Vector blocks read up to r[o * stride + 2 * 8 - 1]; `readable` bounds that.
  if ((stride == 1 || stride == 2) && cpu_has_avx2_fma()) {
    int64_t end = o1;
    while (end > o && (end - 1) * stride + stride - 1 >= readable) --end;
    o = fold_row_avx2<Max>(t, r, o, end, stride);
  }
#endif
  for (; o < o1; ++o) t[o] = Max ? nan_max(t[o], r[o * stride]) : t[o] + r[o * stride];
}

// Output positions o of one axis whose taps all lie in [0, in): [lo, hi).
void interior(int64_t out, int64_t in, int k, int stride, int dil, int pad, int64_t& lo, int64_t& hi) {
  lo = out;
  hi = 0;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t first = o * stride - pad, last = first + static_cast<int64_t>(k - 1) * dil;
    if (first >= 0 && last < in) {
      lo = std::min(lo, o);
      hi = std::max(hi, o + 1);
    }
  }
  if (hi < lo) hi = lo;
}

#ifdef ORTMLX_X86
// A plane whose output rows fit one register (out_w <= 16, stride_w 1 or 2): each output row
// from its window's input rows directly, each tap one (masked) load of the row's inputs for all
// outputs, padding lanes 0 (average) or -inf (max), which leaves the sums and maxima as the
// separable form computes them (its row sums start from 0, so a masked tap never meets a -0).
// Why: the separable form costs a call per tap and row, for 7 to 14 outputs each (shufflenet's
// pools: tens of thousands of calls a run).
template <bool Max>
__attribute__((target("avx512f"))) void pool_plane_narrow_avx512(const float* x, float* y, const CpuPool2d& g,
                                                                 int64_t H, int64_t W) {
  const int64_t OH = g.out_h, OW = g.out_w;
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512 init = _mm512_set1_ps(Max ? -std::numeric_limits<float>::infinity() : 0.f);
  const __mmask16 out_lanes = first_lanes(OW);
  // Per tap j: the first input column it reads (the row's offset) and the lanes that lie inside.
  struct Tap {
    int64_t col;
    __mmask16 lo, hi;  // elements [0, 16) and [16, 32) from col that lie in [0, W) (stride 1: lo only)
  };
  Tap taps[32];
  auto inside = [&](int64_t col, int64_t e0) {
    uint32_t m = 0;
    for (int e = 0; e < 16; ++e)
      if (col + e0 + e >= 0 && col + e0 + e < W) m |= 1u << e;
    return static_cast<__mmask16>(m);
  };
  for (int j = 0; j < g.kernel_w; ++j) {
    const int64_t col = static_cast<int64_t>(j) * g.dil_w - g.pad_left;
    taps[j] = {col, inside(col, 0), inside(col, 16)};
  }
  __m512 div = _mm512_set1_ps(1.f);
  if constexpr (!Max) div = _mm512_maskz_loadu_ps(out_lanes, g.count_w.data());
  for (int64_t oh = 0; oh < OH; ++oh) {
    __m512 acc = init;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
      if (ih < 0 || ih >= H) continue;
      const float* r = x + ih * W;
      __m512 row = init;
      for (int j = 0; j < g.kernel_w; ++j) {
        const Tap& t = taps[j];
        __m512 v = _mm512_mask_loadu_ps(init, t.lo, r + t.col);
        if (g.stride_w == 2) v = _mm512_permutex2var_ps(v, even, _mm512_mask_loadu_ps(init, t.hi, r + t.col + 16));
        row = Max ? nan_max16(row, v) : _mm512_add_ps(row, v);
      }
      acc = Max ? nan_max16(acc, row) : _mm512_add_ps(acc, row);
    }
    if constexpr (!Max) acc = _mm512_div_ps(acc, _mm512_mul_ps(_mm512_set1_ps(g.count_h[static_cast<size_t>(oh)]), div));
    _mm512_mask_storeu_ps(y + oh * OW, out_lanes, acc);
  }
}
#endif

// Rows of at most this many outputs are computed output by output: folding them tap by tap
// costs a call a tap for one or two outputs (a global pooling's 7 x 7 window: 49 calls a plane).
constexpr int64_t kNarrowRow = 2;

template <bool Max>
void pool_planes(const float* x, float* y, int64_t p0, int64_t p1, const CpuPool2d& g, int64_t H, int64_t W,
                 bool avx512) {
  const int64_t OH = g.out_h, OW = g.out_w;
  const float init = Max ? -std::numeric_limits<float>::infinity() : 0.f;
  int64_t ow_lo, ow_hi;
  interior(OW, W, g.kernel_w, g.stride_w, g.dil_w, g.pad_left, ow_lo, ow_hi);
#ifdef ORTMLX_X86
  if (avx512 && OW <= 16 && (g.stride_w == 1 || g.stride_w == 2) && g.kernel_w <= 32) {
    for (int64_t p = p0; p < p1; ++p) pool_plane_narrow_avx512<Max>(x + p * H * W, y + p * OH * OW, g, H, W);
    return;
  }
#endif
  std::vector<float> rows(static_cast<size_t>(H * OW));  // each input row reduced over kw
  for (int64_t p = p0; p < p1; ++p) {
    const float* xp = x + p * H * W;
    float* yp = y + p * OH * OW;
    for (int64_t ih = 0; ih < H; ++ih) {
      const float* r = xp + ih * W;
      float* t = rows.data() + ih * OW;
      auto edge = [&](int64_t o) {
        float a = init;
        for (int j = 0; j < g.kernel_w; ++j) {
          const int64_t iw = o * g.stride_w - g.pad_left + static_cast<int64_t>(j) * g.dil_w;
          if (iw >= 0 && iw < W) a = Max ? nan_max(a, r[iw]) : a + r[iw];
        }
        t[o] = a;
      };
      if (OW <= kNarrowRow) {  // a global pooling's row: each output's taps at once (the same sums)
        for (int64_t o = 0; o < OW; ++o) edge(o);
        continue;
      }
      for (int64_t o = 0; o < ow_lo; ++o) edge(o);
      for (int64_t o = ow_lo; o < ow_hi; ++o) t[o] = init;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int64_t off = static_cast<int64_t>(j) * g.dil_w - g.pad_left;  // rj[o * stride] = r[o * stride + off]
        fold_row<Max>(t, r + off, ow_lo, ow_hi, g.stride_w, W - off, avx512);
      }
      for (int64_t o = std::max(ow_hi, ow_lo); o < OW; ++o) edge(o);
    }
    for (int64_t oh = 0; oh < OH; ++oh) {
      float* out = yp + oh * OW;
      std::fill(out, out + OW, init);
      for (int i = 0; i < g.kernel_h; ++i) {
        const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
        if (ih < 0 || ih >= H) continue;
        const float* rr = rows.data() + ih * OW;
        if (OW <= kNarrowRow)
          for (int64_t o = 0; o < OW; ++o) out[o] = Max ? nan_max(out[o], rr[o]) : out[o] + rr[o];
        else
          fold_row<Max>(out, rr, 0, OW, 1, OW, avx512);
      }
      if constexpr (!Max) {
        const float ch = g.count_h[oh];
        for (int64_t o = 0; o < OW; ++o) out[o] /= ch * g.count_w[o];
      }
    }
  }
}

class Pool2d : public mx::UnaryPrimitive {
 public:
  Pool2d(mx::Stream s, const CpuPool2d& g, bool avx512) : mx::UnaryPrimitive(s), g_(g), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [in = RowMajorInput(x), yp = out.data<float>(), g = g_, planes = int64_t{x.shape(0)} * x.shape(1),
                  H = int64_t{x.shape(2)}, W = int64_t{x.shape(3)}, avx512 = avx512_] {
      const float* xp = in.rows();
      // Planes in shares of >= 32K input elements (~10 us of work, the price of a hand-off).
      const int64_t work = planes * H * W;
      const int parts = static_cast<int>(std::min<int64_t>({cpu_threads(), planes, work / (int64_t{1} << 15)}));
      cpu_parallel_for(planes, std::max(parts, 1), [&](int64_t p0, int64_t p1) {
        if (g.max)
          pool_planes<true>(xp, yp, p0, p1, g, H, W, avx512);
        else
          pool_planes<false>(xp, yp, p0, p1, g, H, W, avx512);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[Pool2d] runs on the CPU stream only");
  }
  const char* name() const override { return g_.max ? "MaxPool2d" : "AvgPool2d"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Pool2d*>(&other);
    return o && o->g_ == g_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& x = inputs[0];
    return {{x.shape(0), x.shape(1), g_.out_h, g_.out_w}};
  }

 private:
  CpuPool2d g_;
  bool avx512_;  // rows folded in AVX-512 registers (cpu_avx512_kernels() at translation)
};

}  // namespace

std::optional<mx::array> cpu_pool_2d(const mx::array& x, const CpuPool2d& g, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 || x.ndim() != 4 ||
      x.size() == 0 || g.out_h <= 0 || g.out_w <= 0 || g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 ||
      g.stride_w < 1 || g.dil_h < 1 || g.dil_w < 1 ||
      (!g.max && (g.count_h.size() != static_cast<size_t>(g.out_h) || g.count_w.size() != static_cast<size_t>(g.out_w))))
    return std::nullopt;
  return mx::array({x.shape(0), x.shape(1), g.out_h, g.out_w}, mx::float32, std::make_shared<Pool2d>(s, g, cpu_avx512_kernels()), {x});
}

}  // namespace ortmlx::ops
