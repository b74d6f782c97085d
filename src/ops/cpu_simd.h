// x86-64 AVX2 pieces shared by the CPU row kernels (cpu_gemv.cc, cpu_int4_gemv.cc,
// cpu_softmax.cc). Each caller still checks cpu_has_avx2_fma() before running AVX2 code.
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

}  // namespace ortmlx::ops
#endif
