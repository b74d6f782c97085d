// Pointwise (1x1, stride 1, unpadded) convolutions over NCHW as they lie: cpu_pointwise_conv of
// kernels/cpu/kernels.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <typeinfo>
#include <memory>
#include <mutex>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

struct PointwiseShape {
  int64_t n, groups, cg, mg, positions;  // batch, groups, input / output channels per group, H*W...
  bool relu;
  bool residual;  // y += r (an input laid out as y) before the Relu
  bool operator==(const PointwiseShape&) const = default;
};

// One group of one image, output columns [p0, p1): y[m, p] = b[m] + sum_k w[m, k] x[k, p], then
// max(y, 0) with relu. x rows (channels) are `positions` apart, as are y's.
void panel_scalar(const float* x, const float* w, const float* b, const float* res, float* y, const PointwiseShape& s,
                  int64_t p0, int64_t p1) {
  for (int64_t m = 0; m < s.mg; ++m) {
    float* yr = y + m * s.positions;
    for (int64_t p = p0; p < p1; ++p) yr[p] = b ? b[m] : 0.f;
    for (int64_t k = 0; k < s.cg; ++k) {
      const float wk = w[m * s.cg + k];
      const float* xr = x + k * s.positions;
      for (int64_t p = p0; p < p1; ++p) yr[p] += wk * xr[p];
    }
    if (res)
      for (int64_t p = p0; p < p1; ++p) yr[p] += res[m * s.positions + p];
    if (s.relu)
      for (int64_t p = p0; p < p1; ++p) yr[p] = std::max(yr[p], 0.f);
  }
}

// The weight [groups * mg, cg] as the AVX2 tiles read it: per group, blocks of six output
// channels, each [cg][6] (channel k's six weights side by side, one stream for the tile instead
// of six rows cg apart); the last block's missing rows repeat its last row (computed, not stored).
std::vector<float> packed_weight(const float* w, const PointwiseShape& s) {
  const int64_t blocks = (s.mg + 5) / 6;
  std::vector<float> out(static_cast<size_t>(s.groups * blocks * 6 * s.cg));
  float* o = out.data();
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int64_t k = 0; k < s.cg; ++k)
        for (int64_t r = 0; r < 6; ++r) *o++ = w[(g * s.mg + std::min(blk * 6 + r, s.mg - 1)) * s.cg + k];
  return out;
}

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) inline void store_row(float* yp, const float* rp, __m256 a0, __m256 a1, bool relu,
                                                           bool full, __m256i mask0, __m256i mask1) {
  if (rp) {
    a0 = _mm256_add_ps(a0, full ? _mm256_loadu_ps(rp) : _mm256_maskload_ps(rp, mask0));
    a1 = _mm256_add_ps(a1, full ? _mm256_loadu_ps(rp + 8) : _mm256_maskload_ps(rp + 8, mask1));
  }
  if (relu) {
    a0 = _mm256_max_ps(a0, _mm256_setzero_ps());
    a1 = _mm256_max_ps(a1, _mm256_setzero_ps());
  }
  if (full) {
    _mm256_storeu_ps(yp, a0);
    _mm256_storeu_ps(yp + 8, a1);
  } else {
    _mm256_maskstore_ps(yp, mask0, a0);
    _mm256_maskstore_ps(yp + 8, mask1, a1);
  }
}

// 6 output channels x 16 positions in 12 named accumulators (an array of them ends up on the
// stack), over all input channels: the panel of x (cg rows of 16 floats) stays in L1 across the
// channel blocks. Past the last channel the rows repeat the last one (computed, not stored);
// fewer than 16 positions at the end go through masked loads and stores.
template <bool Full>  // all 16 positions, or `cols` of them (masked)
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, const float* w6, const float* b, const float* res,
                                                    float* y, const PointwiseShape& s, int64_t m0, int64_t p0, int cols) {
  const int64_t P = s.positions, K = s.cg, last = s.mg - 1;
  const int rows = static_cast<int>(std::min<int64_t>(6, s.mg - m0));
  alignas(32) static const int lanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const __m256i n = _mm256_set1_epi32(cols);
  const __m256i mask0 = _mm256_cmpgt_epi32(n, _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)));
  const __m256i mask1 = _mm256_cmpgt_epi32(n, _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 8)));
  int64_t m[6];
  for (int r = 0; r < 6; ++r) m[r] = std::min(m0 + r, last);
  float bias[6];
  for (int r = 0; r < 6; ++r) bias[r] = b ? b[m[r]] : 0.f;
  __m256 c00 = _mm256_set1_ps(bias[0]), c01 = c00, c10 = _mm256_set1_ps(bias[1]), c11 = c10;
  __m256 c20 = _mm256_set1_ps(bias[2]), c21 = c20, c30 = _mm256_set1_ps(bias[3]), c31 = c30;
  __m256 c40 = _mm256_set1_ps(bias[4]), c41 = c40, c50 = _mm256_set1_ps(bias[5]), c51 = c50;
  const float* xp = x + p0;
  const float* wk = w6;  // the block's six weights of channel k, side by side (packed_weight)
  for (int64_t k = 0; k < K; ++k, xp += P, wk += 6) {
    __m256 x0, x1;
    if constexpr (Full) {
      x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8);
    } else {
      x0 = _mm256_maskload_ps(xp, mask0), x1 = _mm256_maskload_ps(xp + 8, mask1);
    }
    __m256 v = _mm256_broadcast_ss(wk);
    c00 = _mm256_fmadd_ps(v, x0, c00), c01 = _mm256_fmadd_ps(v, x1, c01);
    v = _mm256_broadcast_ss(wk + 1);
    c10 = _mm256_fmadd_ps(v, x0, c10), c11 = _mm256_fmadd_ps(v, x1, c11);
    v = _mm256_broadcast_ss(wk + 2);
    c20 = _mm256_fmadd_ps(v, x0, c20), c21 = _mm256_fmadd_ps(v, x1, c21);
    v = _mm256_broadcast_ss(wk + 3);
    c30 = _mm256_fmadd_ps(v, x0, c30), c31 = _mm256_fmadd_ps(v, x1, c31);
    v = _mm256_broadcast_ss(wk + 4);
    c40 = _mm256_fmadd_ps(v, x0, c40), c41 = _mm256_fmadd_ps(v, x1, c41);
    v = _mm256_broadcast_ss(wk + 5);
    c50 = _mm256_fmadd_ps(v, x0, c50), c51 = _mm256_fmadd_ps(v, x1, c51);
  }
  const __m256 a[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < rows; ++r)
    store_row(y + (m0 + r) * P + p0, res ? res + (m0 + r) * P + p0 : nullptr, a[r][0], a[r][1], s.relu, Full, mask0,
              mask1);
}


// The same tile with AVX-512: 6 output channels x 32 positions in 12 zmm accumulators (one
// weight broadcast feeds two 16-lane FMAs), the tail of fewer than 32 positions by lane masks.
template <bool Full>
__attribute__((target("avx512f"))) void tile_avx512(const float* x, const float* w6, const float* b, const float* res,
                                                    float* y, const PointwiseShape& s, int64_t m0, int64_t p0, int cols) {
  const int64_t P = s.positions, K = s.cg, last = s.mg - 1;
  const int rows = static_cast<int>(std::min<int64_t>(6, s.mg - m0));
  const __mmask16 k0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 k1 = cols >= 32 ? __mmask16(0xFFFF) : cols > 16 ? __mmask16((1u << (cols - 16)) - 1) : __mmask16(0);
  float bias[6];
  for (int r = 0; r < 6; ++r) bias[r] = b ? b[std::min(m0 + r, last)] : 0.f;
  __m512 c00 = _mm512_set1_ps(bias[0]), c01 = c00, c10 = _mm512_set1_ps(bias[1]), c11 = c10;
  __m512 c20 = _mm512_set1_ps(bias[2]), c21 = c20, c30 = _mm512_set1_ps(bias[3]), c31 = c30;
  __m512 c40 = _mm512_set1_ps(bias[4]), c41 = c40, c50 = _mm512_set1_ps(bias[5]), c51 = c50;
  const float* xp = x + p0;
  const float* wk = w6;
  for (int64_t k = 0; k < K; ++k, xp += P, wk += 6) {
    __m512 x0, x1;
    if constexpr (Full) {
      x0 = _mm512_loadu_ps(xp), x1 = _mm512_loadu_ps(xp + 16);
    } else {
      x0 = _mm512_maskz_loadu_ps(k0, xp), x1 = _mm512_maskz_loadu_ps(k1, xp + 16);
    }
    __m512 v = _mm512_set1_ps(wk[0]);
    c00 = _mm512_fmadd_ps(v, x0, c00), c01 = _mm512_fmadd_ps(v, x1, c01);
    v = _mm512_set1_ps(wk[1]);
    c10 = _mm512_fmadd_ps(v, x0, c10), c11 = _mm512_fmadd_ps(v, x1, c11);
    v = _mm512_set1_ps(wk[2]);
    c20 = _mm512_fmadd_ps(v, x0, c20), c21 = _mm512_fmadd_ps(v, x1, c21);
    v = _mm512_set1_ps(wk[3]);
    c30 = _mm512_fmadd_ps(v, x0, c30), c31 = _mm512_fmadd_ps(v, x1, c31);
    v = _mm512_set1_ps(wk[4]);
    c40 = _mm512_fmadd_ps(v, x0, c40), c41 = _mm512_fmadd_ps(v, x1, c41);
    v = _mm512_set1_ps(wk[5]);
    c50 = _mm512_fmadd_ps(v, x0, c50), c51 = _mm512_fmadd_ps(v, x1, c51);
  }
  const __m512 a[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    float* yp = y + (m0 + r) * P + p0;
    __m512 a0 = a[r][0], a1 = a[r][1];
    if (res) {
      const float* rp = res + (m0 + r) * P + p0;
      a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(k0, rp));
      a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(k1, rp + 16));
    }
    if (s.relu) a0 = _mm512_max_ps(a0, zero), a1 = _mm512_max_ps(a1, zero);
    if constexpr (Full) {
      _mm512_storeu_ps(yp, a0);
      _mm512_storeu_ps(yp + 16, a1);
    } else {
      _mm512_mask_storeu_ps(yp, k0, a0);
      _mm512_mask_storeu_ps(yp + 16, k1, a1);
    }
  }
}

// Output columns [p0, p1) of one group in tiles of Cols positions (the full tile, or the edge
// tile for the last few); `w6`: the group's weight as packed_weight lays it out.
using TileFn = void (*)(const float*, const float*, const float*, const float*, float*, const PointwiseShape&, int64_t,
                        int64_t, int);
template <int Cols, TileFn Full, TileFn Edge>
void panel(const float* x, const float* w6, const float* b, const float* res, float* y, const PointwiseShape& s,
           int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; p += Cols) {
    const int cols = static_cast<int>(std::min<int64_t>(Cols, p1 - p));
    for (int64_t m = 0; m < s.mg; m += 6) (cols == Cols ? Full : Edge)(x, w6 + m * s.cg, b, res, y, s, m, p, cols);
  }
}
constexpr auto panel_avx2 = panel<16, tile_avx2<true>, tile_avx2<false>>;
constexpr auto panel_avx512 = panel<32, tile_avx512<true>, tile_avx512<false>>;
#endif

class PointwiseConv : public mx::UnaryPrimitive {
 public:
  PointwiseConv(mx::Stream st, const PointwiseShape& s, bool parallel, bool constant_weight, bool avx512)
      : mx::UnaryPrimitive(st),
        s_(s),
        parallel_(parallel),
        constant_weight_(constant_weight),
        avx512_(avx512),
        cache_(constant_weight ? std::make_shared<PackedWeight>() : nullptr) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (!inputs[1].flags().row_contiguous) throw std::runtime_error("[PointwiseConv] the weight must be row-contiguous");
    begin_output(inputs, out, stream());
    std::optional<RowMajorInput> bias, residual;
    if (inputs.size() > (s_.residual ? 3u : 2u)) bias.emplace(inputs[2]);
    if (s_.residual) residual.emplace(inputs.back());
    dispatch_task(stream(), [cache = cache_, x = RowMajorInput(inputs[0]), wp = inputs[1].data<float>(), bias = std::move(bias),
                  residual = std::move(residual), yp = out.data<float>(), s = s_, parallel = parallel_,
                  avx512 = avx512_] {
      const float* xp = x.rows();
      const float* rp = residual ? residual->rows() : nullptr;
#ifdef ORTMLX_X86
      const bool avx2 = cpu_has_avx2_fma();
      // A constant weight is packed once (a compiled function's runs share this primitive);
      // any other on every run.
      std::shared_ptr<const std::vector<float>> packed;
      if (avx2) packed = cache ? cache->packed_for(wp, s) : std::make_shared<const std::vector<float>>(packed_weight(wp, s));
#endif
      const float* bp = bias ? bias->rows() : nullptr;
      // Work items: (image, group, 64-position stretch), split over the threads.
      constexpr int64_t kStretch = 64;
      const int64_t stretches = (s.positions + kStretch - 1) / kStretch;
      const int64_t items = s.n * s.groups * stretches;
      auto run = [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t t = i % stretches, ng = i / stretches, g = ng % s.groups, img = ng / s.groups;
          const int64_t p0 = t * kStretch, p1 = std::min(s.positions, p0 + kStretch);
          const float* xg = xp + (img * s.groups + g) * s.cg * s.positions;
          float* yg = yp + (img * s.groups + g) * s.mg * s.positions;
          const float* wg = wp + g * s.mg * s.cg;
          const float* bg = bp ? bp + g * s.mg : nullptr;
          const float* rg = rp ? rp + (img * s.groups + g) * s.mg * s.positions : nullptr;
#ifdef ORTMLX_X86
          if (avx512) {
            panel_avx512(xg, packed->data() + g * ((s.mg + 5) / 6) * 6 * s.cg, bg, rg, yg, s, p0, p1);
            continue;
          }
          if (avx2) {
            panel_avx2(xg, packed->data() + g * ((s.mg + 5) / 6) * 6 * s.cg, bg, rg, yg, s, p0, p1);
            continue;
          }
#endif
          panel_scalar(xg, wg, bg, rg, yg, s, p0, p1);
        }
      };
      cpu_parallel_for(items, parallel ? std::min<int64_t>(cpu_threads(), items) : 1, run);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[PointwiseConv] runs on the CPU stream only");
  }
  const char* name() const override { return "PointwiseConv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PointwiseConv*>(&other);
    return o && o->s_ == s_ && o->parallel_ == parallel_ && o->constant_weight_ == constant_weight_ &&
           o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out[1] = static_cast<int>(s_.groups * s_.mg);
    return {out};
  }

 private:
  // A constant weight's packed layout, made on the first run for its buffer (on the stream
  // thread). Held by the tasks too: an eager run's primitive may go before its task runs.
  struct PackedWeight {
    std::shared_ptr<const std::vector<float>> packed_for(const float* w, const PointwiseShape& s) {
      std::lock_guard<std::mutex> lock(mu);
      if (src != w || !packed) {
        packed = std::make_shared<const std::vector<float>>(packed_weight(w, s));
        src = w;
      }
      return packed;
    }
    std::mutex mu;
    const float* src = nullptr;
    std::shared_ptr<const std::vector<float>> packed;
  };

  PointwiseShape s_;
  bool parallel_;
  bool constant_weight_;  // the weight is a constant of the graph: its buffer never changes
  bool avx512_;           // the AVX-512 tiles (cpu_avx512_kernels() at translation)
  std::shared_ptr<PackedWeight> cache_;  // with constant_weight_
};

}  // namespace

std::optional<mx::array> cpu_pointwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                            int groups, bool relu, bool parallel, bool constant_weight,
                                            mx::Stream s, const std::optional<mx::array>& residual) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 ||
      w.dtype() != mx::float32 || x.ndim() < 3 || w.ndim() != 2 || groups < 1 || x.size() == 0 || w.size() == 0 ||
      (bias && (bias->dtype() != mx::float32 || bias->size() != static_cast<size_t>(w.shape(0)))))
    return std::nullopt;
  const int64_t C = x.shape(1), M = w.shape(0);
  if (C % groups || M % groups || w.shape(1) * groups != C) return std::nullopt;
  if (C / groups < kPointwiseMinDepth) return std::nullopt;
  int64_t positions = 1;
  for (int d = 2; d < static_cast<int>(x.ndim()); ++d) positions *= x.shape(d);
  mx::Shape out = x.shape();
  out[1] = static_cast<int>(M);
  // The residual is added in the tiles only when it is the output's shape (no broadcast).
  if (residual && (residual->dtype() != mx::float32 || residual->shape() != out)) return std::nullopt;
  const PointwiseShape shape{x.shape(0), groups, C / groups, M / groups, positions, relu, residual.has_value()};
  std::vector<mx::array> in{x, w};
  if (bias) in.push_back(*bias);
  if (residual) in.push_back(*residual);
  return mx::array(std::move(out), mx::float32, std::make_shared<PointwiseConv>(s, shape, parallel, constant_weight,
                                                                                 cpu_avx512_kernels()),
                   std::move(in));
}

}  // namespace ortmlx::ops
