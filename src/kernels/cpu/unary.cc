// Transcendental elementwise functions on MLX's CPU stream, 8 lanes at a time, or 16 with AVX-512 (kernels/cpu/kernels.h:
// cpu_unary): erf and the erf-based GELU, exp, the logistic sigmoid, tanh.
//
// Why: on x86 MLX's CPU backend evaluates these one lane at a time, each lane calling libm's
// out-of-line fmaf (a sigmoid over 100K floats took ~2 ms against ~0.03 ms in ORT's CPU EP; in
// the MiniLM encoder's profile the fused GELU kernel around Erf took as long as all of its matrix
// products).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <typeinfo>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// Abramowitz & Stegun 7.1.26: erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p |x|),
// odd in x; |error| < 1.5e-7. The same formula MLX's CPU and Metal erf use, so the EP's result
// does not depend on which path ran.
constexpr float kP = 0.3275911f;
constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f,
                kA5 = 1.061405429f;

float erf_scalar(float x) {
  const float ax = std::fabs(x);
  const float t = 1.f / (1.f + kP * ax);
  const float r = (((((kA5 * t + kA4) * t) + kA3) * t + kA2) * t + kA1) * t;
  const float y = 1.f - r * std::exp(-ax * ax);
  return std::copysign(y, x);  // NaN stays NaN (t, and so y, are NaN)
}

float scalar(CpuUnary f, float x) {
  switch (f) {
    case CpuUnary::Erf: return erf_scalar(x);
    case CpuUnary::Gelu: return 0.5f * x * (1.f + erf_scalar(x * static_cast<float>(M_SQRT1_2)));
    case CpuUnary::Exp: return std::exp(x);
    case CpuUnary::Sigmoid: return 1.f / (1.f + std::exp(-x));
    case CpuUnary::Tanh: return std::tanh(x);
  }
  return x;
}

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) inline __m256 erf_avx2(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.f);
  const __m256 sign = _mm256_and_ps(x, sign_bit);
  const __m256 ax = _mm256_andnot_ps(sign_bit, x);
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(_mm256_set1_ps(kP), ax, _mm256_set1_ps(1.f)));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(kA5), t, _mm256_set1_ps(kA4));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA3));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA2));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA1));
  r = _mm256_mul_ps(r, t);
  // exp_avx2 covers [-87.3, 0] and gives 0 below (and for NaN, whose t already makes y NaN).
  const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
  const __m256 y = _mm256_fnmadd_ps(r, e, _mm256_set1_ps(1.f));
  return _mm256_or_ps(y, sign);
}

// Cephes' tanhf: x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1)).
__attribute__((target("avx2,fma"))) inline __m256 tanh_avx2(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.f);
  const __m256 ax = _mm256_andnot_ps(sign_bit, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(-5.70498872745E-3f), z, _mm256_set1_ps(2.06390887954E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 e = exp_any_avx2(_mm256_add_ps(ax, ax));
  const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.f), _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, _mm256_set1_ps(1.f))));
  const __m256 signed_big = _mm256_or_ps(big, _mm256_and_ps(x, sign_bit));  // NaN: exp gave NaN
  return _mm256_blendv_ps(signed_big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

// The same functions on 16 lanes, each operation as the 8-lane form's (the same bits). Sign
// bits through integer ops: AVX-512F has no float and/or.
__attribute__((target("avx512f"))) inline __m512 sign_of(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
}
__attribute__((target("avx512f"))) inline __m512 abs_of(__m512 x) {
  return _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_set1_epi32(INT32_MIN), _mm512_castps_si512(x)));
}
__attribute__((target("avx512f"))) inline __m512 with_sign(__m512 y, __m512 sign) {
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), _mm512_castps_si512(sign)));
}

__attribute__((target("avx512f"))) inline __m512 erf_avx512(__m512 x) {
  const __m512 ax = abs_of(x);
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_fmadd_ps(_mm512_set1_ps(kP), ax, _mm512_set1_ps(1.f)));
  __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(kA5), t, _mm512_set1_ps(kA4));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(kA3));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(kA2));
  r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(kA1));
  r = _mm512_mul_ps(r, t);
  const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(ax, ax)));
  return with_sign(_mm512_fnmadd_ps(r, e, _mm512_set1_ps(1.f)), sign_of(x));
}

__attribute__((target("avx512f"))) inline __m512 tanh_avx512(__m512 x) {
  const __m512 ax = abs_of(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(-5.70498872745E-3f), z, _mm512_set1_ps(2.06390887954E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp_any_avx512(_mm512_add_ps(ax, ax));
  const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.f), _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, _mm512_set1_ps(1.f))));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), with_sign(big, sign_of(x)),
                              small);
}

template <CpuUnary F>
__attribute__((target("avx512f"))) inline __m512 lanes16(__m512 v) {
  const __m512 one = _mm512_set1_ps(1.f);
  if constexpr (F == CpuUnary::Erf) return erf_avx512(v);
  if constexpr (F == CpuUnary::Gelu) {
    const __m512 e = erf_avx512(_mm512_mul_ps(v, _mm512_set1_ps(static_cast<float>(M_SQRT1_2))));
    return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)), _mm512_add_ps(e, one));
  }
  if constexpr (F == CpuUnary::Exp) return exp_any_avx512(v);
  if constexpr (F == CpuUnary::Sigmoid)
    return _mm512_div_ps(one, _mm512_add_ps(one, exp_any_avx512(_mm512_sub_ps(_mm512_setzero_ps(), v))));
  if constexpr (F == CpuUnary::Tanh) return tanh_avx512(v);
  return v;
}

template <CpuUnary F>
__attribute__((target("avx512f"))) void map_avx512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, lanes16<F>(_mm512_loadu_ps(x + i)));
  if (i < n) {  // the tail through the same lanes (the masked-off lanes compute on zeros)
    const __mmask16 k = first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, k, lanes16<F>(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

template <CpuUnary F>
__attribute__((target("avx2,fma"))) inline __m256 lanes(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.f);
  if constexpr (F == CpuUnary::Erf) return erf_avx2(v);
  if constexpr (F == CpuUnary::Gelu) {
    const __m256 e = erf_avx2(_mm256_mul_ps(v, _mm256_set1_ps(static_cast<float>(M_SQRT1_2))));
    return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(0.5f)), _mm256_add_ps(e, one));
  }
  if constexpr (F == CpuUnary::Exp) return exp_any_avx2(v);
  if constexpr (F == CpuUnary::Sigmoid)
    return _mm256_div_ps(one, _mm256_add_ps(one, exp_any_avx2(_mm256_sub_ps(_mm256_setzero_ps(), v))));
  if constexpr (F == CpuUnary::Tanh) return tanh_avx2(v);
  return v;
}

template <CpuUnary F>
__attribute__((target("avx2,fma"))) void map_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, lanes<F>(_mm256_loadu_ps(x + i)));
  if (i < n) {  // the tail through the same lanes, so no element depends on where it lies
    alignas(32) float buf[8] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(buf, lanes<F>(_mm256_load_ps(buf)));
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}
#endif

using MapFn = CpuUnaryFn;

template <CpuUnary F>
void map_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = scalar(F, x[i]);
}

template <CpuUnary F>
MapFn pick(bool avx512) {
#ifdef ORTMLX_X86
  if (avx512 && cpu_has_avx512f()) return map_avx512<F>;
  if (cpu_has_avx2_fma()) return map_avx2<F>;
#endif
  return map_scalar<F>;
}

// The 16-lane forms with `avx512` (cpu_avx512_kernels() at translation) where the CPU has them.
MapFn map_of(CpuUnary f, bool avx512) {
  static const MapFn fns[2][5] = {
      {pick<CpuUnary::Erf>(false), pick<CpuUnary::Gelu>(false), pick<CpuUnary::Exp>(false),
       pick<CpuUnary::Sigmoid>(false), pick<CpuUnary::Tanh>(false)},
      {pick<CpuUnary::Erf>(true), pick<CpuUnary::Gelu>(true), pick<CpuUnary::Exp>(true),
       pick<CpuUnary::Sigmoid>(true), pick<CpuUnary::Tanh>(true)}};
  return fns[avx512 ? 1 : 0][static_cast<int>(f)];
}

const char* name_of(CpuUnary f) {
  switch (f) {
    case CpuUnary::Erf: return "ErfMap";
    case CpuUnary::Gelu: return "ErfGelu";
    case CpuUnary::Exp: return "ExpMap";
    case CpuUnary::Sigmoid: return "SigmoidMap";
    case CpuUnary::Tanh: return "TanhMap";
  }
  return "UnaryMap";
}

class UnaryMap : public mx::UnaryPrimitive {
 public:
  UnaryMap(mx::Stream s, CpuUnary f, bool avx512) : mx::UnaryPrimitive(s), f_(f), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [in = RowMajorInput(x), yp = out.data<float>(), n = static_cast<int64_t>(x.size()), fn = map_of(f_, avx512_)] {
      const float* xp = in.rows();
      // Chunks of >= 32K elements (~10 us of work each, the price of a hand-off).
      const int parts = static_cast<int>(std::min<int64_t>(cpu_threads(), n / (int64_t{1} << 15)));
      cpu_parallel_for(n, parts, [&](int64_t b, int64_t e) { fn(xp + b, yp + b, e - b); });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error(std::string("[") + name() + "] runs on the CPU stream only");
  }
  const char* name() const override { return name_of(f_); }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const UnaryMap*>(&other);
    return o && o->f_ == f_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  CpuUnary f_;
  bool avx512_;
};

// y = (g * s) * up over n floats: two roundings, as MLX's two products.
#ifdef ORTMLX_X86
__attribute__((target("avx2"))) void gate_products_avx2(const float* g, const float* s, const float* up, float* y,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(s + i)),
                                          _mm256_loadu_ps(up + i)));
  for (; i < n; ++i) y[i] = (g[i] * s[i]) * up[i];
}
#endif
void gate_products(const float* g, const float* s, const float* up, float* y, int64_t n) {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return gate_products_avx2(g, s, up, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = (g[i] * s[i]) * up[i];
}

// y = (g * sigmoid(g)) * up, the sigmoid in chunks of a stack buffer.
class SwiGlu : public mx::UnaryPrimitive {
 public:
  SwiGlu(mx::Stream s, bool avx512) : mx::UnaryPrimitive(s), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [g = RowMajorInput(inputs[0]), up = RowMajorInput(inputs[1]), yp = out.data<float>(),
                             n = static_cast<int64_t>(inputs[0].size()), fn = map_of(CpuUnary::Sigmoid, avx512_)] {
      const float* gp = g.rows();
      const float* upp = up.rows();
      const int parts = static_cast<int>(std::min<int64_t>(cpu_threads(), n / (int64_t{1} << 15)));
      cpu_parallel_for(n, parts, [&](int64_t b, int64_t e) {
        constexpr int64_t kChunk = 256;
        alignas(64) float sig[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t m = std::min(kChunk, e - i);
          fn(gp + i, sig, m);
          gate_products(gp + i, sig, upp + i, yp + i, m);
        }
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[SwiGlu] runs on the CPU stream only");
  }
  const char* name() const override { return "SwiGlu"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const SwiGlu*>(&other);
    return o && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  bool avx512_;
};

}  // namespace

void cpu_unary_rows(CpuUnary f, const float* x, float* y, int64_t n, bool avx512) { map_of(f, avx512)(x, y, n); }
CpuUnaryFn cpu_unary_fn(CpuUnary f, bool avx512) { return map_of(f, avx512); }

std::optional<mx::array> cpu_unary(CpuUnary f, const mx::array& x, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 ||
      x.size() < kCpuUnaryMinElements)
    return std::nullopt;
  return mx::array(x.shape(), mx::float32, std::make_shared<UnaryMap>(s, f, cpu_avx512_kernels()), {x});
}

std::optional<mx::array> cpu_swiglu(const mx::array& g, const mx::array& up, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || g.dtype() != mx::float32 ||
      up.dtype() != mx::float32 || g.shape() != up.shape() || g.size() < kCpuUnaryMinElements)
    return std::nullopt;
  return mx::array(g.shape(), mx::float32, std::make_shared<SwiGlu>(s, cpu_avx512_kernels()), {g, up});
}

}  // namespace ortmlx::ops
