// Transposed convolutions whose kernel equals their stride, over NCHW as they lie:
// cpu_patch_deconv of kernels/cpu/kernels.h.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

struct PatchShape {
  int64_t n, c, h, w, o;  // batch, input channels, input rows and columns, output channels
  int kh, kw;             // the kernel, which is also the stride
  bool operator==(const PatchShape&) const = default;
};

// Input row i of one image (channel rows `cs` apart) into its kh output rows per output channel:
// y[o, i*kh + a, j*kw + b] = bias[o] + sum_c w[c, o, a, b] x[c, i, j], for the (o, a) pairs
// oa0..oa1 (oa = o * kh + a); `rows[t]` is the output row of pair oa0 + t.
void row_scalar(const float* x, int64_t cs, const float* w, const float* bias, float* const* rows, const PatchShape& s,
                int64_t oa0, int64_t oa1, std::vector<float>& acc) {
  const int64_t okk = s.o * s.kh * s.kw;
  acc.resize(static_cast<size_t>(s.w));
  for (int64_t oa = oa0; oa < oa1; ++oa) {
    const float b0 = bias ? bias[oa / s.kh] : 0.f;
    float* y = rows[oa - oa0];
    for (int b = 0; b < s.kw; ++b) {
      std::fill(acc.begin(), acc.end(), b0);
      for (int64_t k = 0; k < s.c; ++k) {
        const float wk = w[k * okk + oa * s.kw + b];
        const float* xr = x + k * cs;
        for (int64_t j = 0; j < s.w; ++j) acc[static_cast<size_t>(j)] += wk * xr[j];
      }
      for (int64_t j = 0; j < s.w; ++j) y[j * s.kw + b] = acc[static_cast<size_t>(j)];
    }
  }
}

#ifdef ORTMLX_X86
// kw == 2 with AVX-512: G (o, a) pairs at once, both columns of each, 16 input columns a step
// (one load of x feeds 2G FMAs); the two columns' sums interleaved into 32 outputs.
template <int G>
__attribute__((target("avx512f"))) void pairs_kw2_avx512(const float* x, int64_t cs, const float* w,
                                                          const float* bias, float* const* rows, const PatchShape& s,
                                                          int64_t oa0) {
  const int64_t okk = s.o * s.kh * 2;
  const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t j = 0; j < s.w; j += 16) {
    const int64_t left = std::min<int64_t>(16, s.w - j);
    const __mmask16 m = static_cast<__mmask16>((1u << left) - 1u);
    __m512 acc[G][2];
    for (int g = 0; g < G; ++g) {
      const __m512 b0 = _mm512_set1_ps(bias ? bias[(oa0 + g) / s.kh] : 0.f);
      acc[g][0] = b0;
      acc[g][1] = b0;
    }
    for (int64_t k = 0; k < s.c; ++k) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + k * cs + j);
      const float* wk = w + k * okk + oa0 * 2;
      for (int g = 0; g < G; ++g) {
        acc[g][0] = _mm512_fmadd_ps(_mm512_set1_ps(wk[2 * g]), xv, acc[g][0]);
        acc[g][1] = _mm512_fmadd_ps(_mm512_set1_ps(wk[2 * g + 1]), xv, acc[g][1]);
      }
    }
    const int64_t outs = 2 * left;
    const __mmask16 m_lo = static_cast<__mmask16>(outs >= 16 ? 0xFFFFu : (1u << outs) - 1u);
    const __mmask16 m_hi = static_cast<__mmask16>(outs <= 16 ? 0u : outs >= 32 ? 0xFFFFu : (1u << (outs - 16)) - 1u);
    for (int g = 0; g < G; ++g) {
      _mm512_mask_storeu_ps(rows[g] + 2 * j, m_lo, _mm512_permutex2var_ps(acc[g][0], lo_idx, acc[g][1]));
      _mm512_mask_storeu_ps(rows[g] + 2 * j + 16, m_hi, _mm512_permutex2var_ps(acc[g][0], hi_idx, acc[g][1]));
    }
  }
}
#endif

class PatchDeconv : public mx::UnaryPrimitive {
 public:
  PatchDeconv(mx::Stream st, const PatchShape& s, bool parallel, bool avx512)
      : mx::UnaryPrimitive(st), s_(s), parallel_(parallel), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    std::optional<RowMajorInput> bias;
    if (inputs.size() > 2) bias.emplace(inputs[2]);
    dispatch_task(stream(), [x = RowMajorInput(inputs[0]), w = RowMajorInput(inputs[1]), bias = std::move(bias),
                             yp = out.data<float>(), s = s_, parallel = parallel_, avx512 = avx512_] {
      const float* xp = x.rows();
      const float* wp = w.rows();
      const float* bp = bias ? bias->rows() : nullptr;
      const int64_t oh = s.h * s.kh, ow = s.w * s.kw, pairs = s.o * s.kh;
      // One task per input row of an image: its kh output rows of every output channel.
      auto run = [&](int64_t r0, int64_t r1) {
        std::vector<float*> rows(static_cast<size_t>(pairs));
        std::vector<float> acc;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t n = r / s.h, i = r % s.h;
          const float* xr = xp + (n * s.c * s.h + i) * s.w;
          for (int64_t oa = 0; oa < pairs; ++oa)
            rows[static_cast<size_t>(oa)] = yp + ((n * s.o + oa / s.kh) * oh + i * s.kh + oa % s.kh) * ow;
          int64_t oa = 0;
#ifdef ORTMLX_X86
          if (avx512 && s.kw == 2) {
            const int64_t cs = s.h * s.w;
            for (; oa + 8 <= pairs; oa += 8) pairs_kw2_avx512<8>(xr, cs, wp, bp, rows.data() + oa, s, oa);
            for (; oa + 2 <= pairs; oa += 2) pairs_kw2_avx512<2>(xr, cs, wp, bp, rows.data() + oa, s, oa);
            for (; oa < pairs; ++oa) pairs_kw2_avx512<1>(xr, cs, wp, bp, rows.data() + oa, s, oa);
          }
#endif
          if (oa < pairs) row_scalar(xr, s.h * s.w, wp, bp, rows.data() + oa, s, oa, pairs, acc);
        }
      };
      const int64_t tasks = s.n * s.h;
      cpu_parallel_for(tasks, parallel ? std::min<int64_t>(cpu_threads(), tasks) : 1, run);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[PatchDeconv] runs on the CPU stream only");
  }
  const char* name() const override { return "PatchDeconv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PatchDeconv*>(&other);
    return o && o->s_ == s_ && o->parallel_ == parallel_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    return {{static_cast<int>(s_.n), static_cast<int>(s_.o), static_cast<int>(s_.h * s_.kh),
             static_cast<int>(s_.w * s_.kw)}};
  }

 private:
  PatchShape s_;
  bool parallel_;
  bool avx512_;
};

}  // namespace

std::optional<mx::array> cpu_patch_deconv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                          bool parallel, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 ||
      w.dtype() != mx::float32 || x.ndim() != 4 || w.ndim() != 4 || x.size() == 0 || w.size() == 0 ||
      w.shape(0) != x.shape(1) ||
      (bias && (bias->dtype() != mx::float32 || bias->size() != static_cast<size_t>(w.shape(1)))))
    return std::nullopt;
  const PatchShape sh{x.shape(0), x.shape(1), x.shape(2), x.shape(3), w.shape(1), w.shape(2), w.shape(3)};
  std::vector<mx::array> in{x, w};
  if (bias) in.push_back(*bias);
  return mx::array({x.shape(0), w.shape(1), x.shape(2) * w.shape(2), x.shape(3) * w.shape(3)}, mx::float32,
                   std::make_shared<PatchDeconv>(s, sh, parallel, cpu_avx512_kernels()), std::move(in));
}

}  // namespace ortmlx::ops
