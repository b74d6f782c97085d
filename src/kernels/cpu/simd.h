// x86-64 AVX2 pieces shared by the CPU kernels (gemv.cc, int4_gemv.cc, softmax.cc,
// unary.cc, decode_attention.cc). Each caller still checks cpu_has_avx2_fma() before running AVX2 code.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ORTMLX_X86 1

namespace ortmlx::ops {

// The sum of the 8 lanes.
__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// The sum of the 16 lanes, halves added pairwise. (GCC 12's unmasked shuffles and extracts, and
// _mm512_reduce_add_ps built on them, start from an undefined vector, which its flow analysis
// reports as read uninitialized where they are inlined: the masked forms name their source.)
__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0xB1));
  __m128 s = _mm512_mask_extractf32x4_ps(_mm_setzero_ps(), 0xF, v, 0);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Cephes' expf on 8 lanes (range reduction by ln 2 split in two, degree-5 polynomial): within
// ~2 ulp of expf for d in [-87.3, 0]; 0 below (the true value underflows to a denormal there).
// exp(x) = 2^fx * exp(r): fx = round(x / ln 2) (returned), exp(r) by Cephes' degree-5
// polynomial on the remainder r (ln 2 split in two for the reduction).
__attribute__((target("avx2,fma"))) inline __m256 exp_reduced_avx2(__m256 x, __m256& fx) {
  fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  return _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
}

__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 d) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(d, lo, _CMP_GE_OQ);
  __m256 fx;
  const __m256 y = exp_reduced_avx2(_mm256_max_ps(d, lo), fx);
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(n)), keep);
}

// The same expf over the whole float range: 2^n applied as two factors so that results near
// FLT_MAX and the denormals come out (+inf above ~88.72, 0 below ~-103.9); NaN stays NaN.
__attribute__((target("avx2,fma"))) inline __m256 exp_any_avx2(__m256 d) {
  const __m256 nan = _mm256_cmp_ps(d, d, _CMP_UNORD_Q);
  __m256 fx;
  __m256 y = exp_reduced_avx2(_mm256_min_ps(_mm256_max_ps(d, _mm256_set1_ps(-104.f)), _mm256_set1_ps(88.8f)), fx);
  const __m256i n = _mm256_cvttps_epi32(fx);
  const __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
  return _mm256_blendv_ps(y, d, nan);
}

// The same three on 16 lanes, with the same operations in the same order (the same bits).
__attribute__((target("avx512f"))) inline __m512 exp_reduced_avx512(__m512 x, __m512& fx) {
  fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                            _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  return _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
}

__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 d) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  const __mmask16 keep = _mm512_cmp_ps_mask(d, lo, _CMP_GE_OQ);
  __m512 fx;
  const __m512 y = exp_reduced_avx512(_mm512_max_ps(d, lo), fx);
  const __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(n));
}

__attribute__((target("avx512f"))) inline __m512 exp_any_avx512(__m512 d) {
  const __mmask16 nan = _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
  __m512 fx;
  __m512 y = exp_reduced_avx512(_mm512_min_ps(_mm512_max_ps(d, _mm512_set1_ps(-104.f)), _mm512_set1_ps(88.8f)), fx);
  const __m512i n = _mm512_cvttps_epi32(fx);
  const __m512i n1 = _mm512_srai_epi32(n, 1), n2 = _mm512_sub_epi32(n, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23)));
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23)));
  return _mm512_mask_blend_ps(nan, y, d);
}

// The first n of 16 lanes (none for n <= 0, all for n >= 16): an AVX-512 step's mask over a
// row's last, partial block.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n > 0 ? n : 0)) - 1);
}

// sum a[i] * b[i] over n floats.
__attribute__((target("avx2,fma"))) inline float dot_f32_avx2(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum8(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] += alpha * x[i] over n floats.
__attribute__((target("avx2,fma"))) inline void axpy_f32_avx2(float alpha, const float* x, float* y, int n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace ortmlx::ops
#endif
