// The 4-bit kernels of kernels/cpu/kernels.h: the row kernel on ORT's bytes (cpu_int4_gemv) and the
// panel kernels for prompts and decode rows (cpu_int4_panel_product), MatMulNBits on the CPU.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>


#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// x split into its even and odd elements (the low and high nibbles of each byte), zero-padded
// to whole blocks so padding nibbles multiply zeros; and the sum of x over each block.
struct SplitRow {
  std::vector<float> even, odd, block_sum;
};

// x quantized to int8 per block of `block` values and back: scale = max|x_b| / 127,
// q = clip(round_half_even(x * (127 / max|x_b|)), -128, 127), x' = q * scale (0 where the block
// is all zeros), in float32 step by step as MLAS and the graph-level version in
// quantized_matmul.cc compute it. (127 / max, not 1 / scale: the two differ in the last bit for
// some maxima, and a code on a rounding tie then moves; ORT's CPU EP matched 127 / max in 300 of
// 300 random 9-row products, 1 / scale in 299.)
// Visits the int8 codes of x's block [b0, b1): code(k, q) per element, returns the scale.
template <typename Code>
float quantize_block(const float* x, int64_t incx, int b0, int b1, Code code) {
  float amax = 0.f;
  for (int k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(x[k * incx]));
  const float scale = amax / 127.f;
  const float inv = amax != 0.f ? 127.f / amax : 0.f;
  for (int k = b0; k < b1; ++k) code(k, std::min(127.f, std::max(-128.f, std::nearbyint(x[k * incx] * inv))));
  return scale;
}

std::vector<float> fake_quant_row(const float* x, int64_t incx, int K, int block) {
  std::vector<float> out(static_cast<size_t>(K));
  std::vector<float> q(static_cast<size_t>(block));
  for (int b0 = 0; b0 < K; b0 += block) {
    const int b1 = std::min(K, b0 + block);
    const float scale = quantize_block(x, incx, b0, b1, [&](int k, float c) { q[static_cast<size_t>(k - b0)] = c; });
    for (int k = b0; k < b1; ++k) out[static_cast<size_t>(k)] = q[static_cast<size_t>(k - b0)] * scale;
  }
  return out;
}

SplitRow split_row(const float* x, int64_t incx, int K, int block, int nb) {
  SplitRow r;
  const size_t half = static_cast<size_t>(nb) * block / 2;
  r.even.assign(half, 0.f);
  r.odd.assign(half, 0.f);
  r.block_sum.assign(static_cast<size_t>(nb), 0.f);
  for (int k = 0; k < K; ++k) {
    const float v = x[k * incx];
    (k % 2 ? r.odd : r.even)[k / 2] = v;
    r.block_sum[k / block] += v;
  }
  return r;
}

// One output: sum over blocks b of scales[b] * (q_b . x_b) + zbias[b] * sum(x_b), where q_b . x_b
// pairs the low nibble of byte j with even[j] and the high one with odd[j].
float int4_row_scalar(const uint8_t* q, const float* even, const float* odd, const float* sc,
                      const float* zb, const float* bsum, int nb, int blob) {
  float acc = 0.f;
  for (int b = 0; b < nb; ++b, q += blob, even += blob, odd += blob) {
    float dot = 0.f;
    for (int j = 0; j < blob; ++j)
      dot += static_cast<float>(q[j] & 15) * even[j] + static_cast<float>(q[j] >> 4) * odd[j];
    acc += sc[b] * dot + zb[b] * bsum[b];
  }
  return acc;
}

#ifdef ORTMLX_X86
// The same with AVX2, eight bytes (16 weights) a step (blob is a multiple of 8: block >= 16).
// Each block's products stay in a vector, scaled into the row's vector accumulator: one
// horizontal sum per output.
__attribute__((target("avx2,fma"))) float int4_row_avx2(const uint8_t* q, const float* even,
                                                        const float* odd, const float* sc,
                                                        const float* zb, const float* bsum, int nb,
                                                        int blob) {
  const __m128i mask = _mm_set1_epi8(15);
  __m256 acc = _mm256_setzero_ps();
  float zsum = 0.f;
  for (int b = 0; b < nb; ++b, q += blob, even += blob, odd += blob) {
    __m256 lo_acc = _mm256_setzero_ps(), hi_acc = _mm256_setzero_ps();
    for (int j = 0; j < blob; j += 8) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
      const __m128i lo = _mm_and_si128(v, mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
      lo_acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(even + j), lo_acc);
      hi_acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(odd + j), hi_acc);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(sc[b]), _mm256_add_ps(lo_acc, hi_acc), acc);
    zsum += zb[b] * bsum[b];
  }
  return hsum8(acc) + zsum;
}
#endif

// x quantized to int8 per block (the same scale and rounding as fake_quant_row), kept as
// integers: per block, its even elements' codes then its odd ones' (blob each, zero-padded),
// its scale, and the sum of its dequantized values (for the zero-point term).
struct QuantRow {
  std::vector<int8_t> codes;
  std::vector<float> scale, block_sum;
  // For the AVX-512 VNNI kernel (blocks of 32): per group of 4 blocks, their even codes (64
  // bytes, as a 64-byte load of the weights' low nibbles lies) then their odd ones.
  std::vector<int8_t> codes4;
};

QuantRow quant_row(const float* x, int64_t incx, int K, int block, int nb) {
  QuantRow r;
  const int blob = block / 2;
  r.codes.assign(static_cast<size_t>(nb) * block, 0);
  r.scale.assign(static_cast<size_t>(nb), 0.f);
  r.block_sum.assign(static_cast<size_t>(nb), 0.f);
  for (int b = 0; b < nb; ++b) {
    const int b0 = b * block, b1 = std::min(K, b0 + block);
    int8_t* out = r.codes.data() + static_cast<size_t>(b) * block;
    int sum = 0;
    const float scale = quantize_block(x, incx, b0, b1, [&](int k, float q) {
      const int j = k - b0;
      out[(j % 2) * blob + j / 2] = static_cast<int8_t>(q);
      sum += static_cast<int>(q);
    });
    r.scale[static_cast<size_t>(b)] = scale;
    r.block_sum[static_cast<size_t>(b)] = static_cast<float>(sum) * scale;
  }
  if (block == 32) {
    r.codes4.assign(static_cast<size_t>(nb / 4) * 128, 0);
    for (int b = 0; b < nb / 4 * 4; ++b)
      for (int j = 0; j < 16; ++j) {
        const int g = b / 4, i = b % 4;
        r.codes4[static_cast<size_t>(g) * 128 + i * 16 + j] = r.codes[static_cast<size_t>(b) * 32 + j];
        r.codes4[static_cast<size_t>(g) * 128 + 64 + i * 16 + j] = r.codes[static_cast<size_t>(b) * 32 + 16 + j];
      }
  }
  return r;
}

#ifdef ORTMLX_X86
// One output from int8 codes: per block an exact integer dot product of the 4-bit weights with
// the codes (maddubs: unsigned weights x signed codes, 32 a step), scaled once by
// weight scale x code scale: what ORT's int8 path computes, and ~2x the float kernel's rate.
// blob is a multiple of 16 (block >= 32).
__attribute__((target("avx2,fma"))) float int4_row_i8_avx2(const uint8_t* q, const int8_t* codes,
                                                           const float* asc, const float* sc,
                                                           const float* zb, const float* bsum,
                                                           int nb, int blob) {
  const __m128i mask = _mm_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  float zsum = 0.f;
  for (int b = 0; b < nb; ++b, q += blob, codes += 2 * blob) {
    __m256i dot = _mm256_setzero_si256();
    for (int j = 0; j < blob; j += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j));
      const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
      const __m256i a = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + blob + j)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j)));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sc[b] * asc[b]), acc);
    zsum += zb[b] * bsum[b];
  }
  return hsum8(acc) + zsum;
}
#endif

#ifdef ORTMLX_X86
// The same for blocks of 32 with AVX-512 VNNI: four blocks (64 bytes of weights) a step, each
// nibble half against its codes by one vpdpbusd (unsigned weights x signed codes, 4 products a
// lane, exact); the lanes' integer sums scaled by their block's weight scale x code scale into
// a float accumulator. The blocks after the last whole group take the AVX2 kernel.
__attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma"))) float int4_row_i8_vnni(
    const uint8_t* q, const QuantRow& x, const float* sc, const float* zb, int nb) {
  const __m512i mask = _mm512_set1_epi8(15);
  const __m512i expand = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc = _mm512_setzero_ps();
  __m128 zacc = _mm_setzero_ps();
  const int groups = nb / 4;
  const int8_t* c = x.codes4.data();
  for (int g = 0; g < groups; ++g, q += 64, c += 128) {
    const __m512i v = _mm512_loadu_si512(q);
    const __m512i lo = _mm512_and_si512(v, mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(c));
    dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(c + 64));
    const __m128 s4 = _mm_mul_ps(_mm_loadu_ps(sc + 4 * g), _mm_loadu_ps(x.scale.data() + 4 * g));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(s4)), acc);
    zacc = _mm_fmadd_ps(_mm_loadu_ps(zb + 4 * g), _mm_loadu_ps(x.block_sum.data() + 4 * g), zacc);
  }
  zacc = _mm_add_ps(zacc, _mm_movehl_ps(zacc, zacc));
  zacc = _mm_add_ss(zacc, _mm_shuffle_ps(zacc, zacc, 1));
  float total = _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(zacc);
  const int done = groups * 4;
  if (done < nb)
    total += int4_row_i8_avx2(q, x.codes.data() + static_cast<size_t>(done) * 32, x.scale.data() + done, sc + done,
                              zb + done, x.block_sum.data() + done, nb - done, 16);
  return total;
}
#endif

using Int4Row = float (*)(const uint8_t*, const float*, const float*, const float*, const float*,
                          const float*, int, int);

Int4Row pick_int4_row() {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return int4_row_avx2;
#endif
  return int4_row_scalar;
}

#ifdef ORTMLX_X86
// Four outputs at once with the kernel above's arithmetic (its sums, added up in another order
// at the end): each group's codes are loaded once for the four rows, and the four accumulators
// are reduced together. A row is a short stream (K / 2 bytes), so the single-row kernel's
// per-output reduction and reloads of the codes cost as much as the products.
// One row's share of a group of four blocks (int4_rows4_i8_vnni).
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512dq,avx2,fma"), always_inline)) inline void vnni_group(
    const uint8_t* qr, const float* sr, const float* br, __m512i clo, __m512i chi, __m128 xs, __m128 xb, __m512& acc,
    __m128& z) {
  const __m512i mask = _mm512_set1_epi8(15);
  const __m512i expand = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i v = _mm512_loadu_si512(qr);
  __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, mask), clo);
  dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask), chi);
  const __m128 s4 = _mm_mul_ps(_mm_loadu_ps(sr), xs);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(s4)), acc);
  z = _mm_fmadd_ps(_mm_loadu_ps(br), xb, z);
}

// Each accumulator's 16 lanes to 4.
__attribute__((target("avx512f,avx512dq,avx2"), always_inline)) inline __m128 quarter_sum(__m512 a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

__attribute__((target("avx512f,avx512bw,avx512vnni,avx512dq,avx2,fma"))) void int4_rows4_i8_vnni(
    const uint8_t* q, int64_t row_bytes, const QuantRow& x, const float* sc, const float* zb, int nb, float* y) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  __m128 z0 = _mm_setzero_ps(), z1 = z0, z2 = z0, z3 = z0;
  const int groups = nb / 4;
  const int8_t* c = x.codes4.data();
  const uint8_t *q0 = q, *q1 = q + row_bytes, *q2 = q + 2 * row_bytes, *q3 = q + 3 * row_bytes;
  const float *s0 = sc, *s1 = sc + nb, *s2 = sc + 2 * nb, *s3 = sc + 3 * nb;
  const float *b0 = zb, *b1 = zb + nb, *b2 = zb + 2 * nb, *b3 = zb + 3 * nb;
  for (int g = 0; g < groups; ++g, c += 128) {
    const __m512i clo = _mm512_loadu_si512(c), chi = _mm512_loadu_si512(c + 64);
    const __m128 xs = _mm_loadu_ps(x.scale.data() + 4 * g), xb = _mm_loadu_ps(x.block_sum.data() + 4 * g);
    vnni_group(q0 + 64 * g, s0 + 4 * g, b0 + 4 * g, clo, chi, xs, xb, acc0, z0);
    vnni_group(q1 + 64 * g, s1 + 4 * g, b1 + 4 * g, clo, chi, xs, xb, acc1, z1);
    vnni_group(q2 + 64 * g, s2 + 4 * g, b2 + 4 * g, clo, chi, xs, xb, acc2, z2);
    vnni_group(q3 + 64 * g, s3 + 4 * g, b3 + 4 * g, clo, chi, xs, xb, acc3, z3);
  }
  // Each accumulator to four lanes, then the four rows' lanes summed across (one output each).
  const __m128 r0 = _mm_add_ps(quarter_sum(acc0), z0), r1 = _mm_add_ps(quarter_sum(acc1), z1);
  const __m128 r2 = _mm_add_ps(quarter_sum(acc2), z2), r3 = _mm_add_ps(quarter_sum(acc3), z3);
  __m128 total = _mm_hadd_ps(_mm_hadd_ps(r0, r1), _mm_hadd_ps(r2, r3));
  const int done = groups * 4;
  if (done < nb) {
    alignas(16) float tail[4];
    for (int r = 0; r < 4; ++r)
      tail[r] = int4_row_i8_avx2(q + r * row_bytes + static_cast<int64_t>(done) * 16,
                                 x.codes.data() + static_cast<size_t>(done) * 32, x.scale.data() + done,
                                 sc + r * nb + done, zb + r * nb + done, x.block_sum.data() + done, nb - done, 16);
    total = _mm_add_ps(total, _mm_load_ps(tail));
  }
  _mm_storeu_ps(y, total);
}
#endif

// Rows [n0, n1) of y: from the float row split in even/odd elements, or (`qr`, int8 blocks on
// AVX2) from its integer codes.
void int4_rows(const SplitRow& r, const QuantRow* qr, const uint8_t* packed, const float* scales,
               const float* zbias, float* y, int n0, int n1, int nb, int block, bool vnni) {
  static const Int4Row row = pick_int4_row();
  const int blob = block / 2;
  const int64_t row_bytes = static_cast<int64_t>(nb) * blob;
#ifdef ORTMLX_X86
  if (qr && vnni && block == 32) {
    for (; n0 + 4 <= n1; n0 += 4)
      int4_rows4_i8_vnni(packed + n0 * row_bytes, row_bytes, *qr, scales + static_cast<int64_t>(n0) * nb,
                         zbias + static_cast<int64_t>(n0) * nb, nb, y + n0);
    for (int n = n0; n < n1; ++n)
      y[n] = int4_row_i8_vnni(packed + n * row_bytes, *qr, scales + static_cast<int64_t>(n) * nb,
                              zbias + static_cast<int64_t>(n) * nb, nb);
    return;
  }
  if (qr) {
    for (int n = n0; n < n1; ++n)
      y[n] = int4_row_i8_avx2(packed + n * row_bytes, qr->codes.data(), qr->scale.data(),
                              scales + static_cast<int64_t>(n) * nb, zbias + static_cast<int64_t>(n) * nb,
                              qr->block_sum.data(), nb, blob);
    return;
  }
#endif
  for (int n = n0; n < n1; ++n)
    y[n] = row(packed + n * row_bytes, r.even.data(), r.odd.data(), scales + static_cast<int64_t>(n) * nb,
               zbias + static_cast<int64_t>(n) * nb, r.block_sum.data(), nb, blob);
}

class Int4RowGemv : public mx::Primitive {
 public:
  Int4RowGemv(mx::Stream s, int K, int block, bool int8_blocks, bool vnni, bool mid_zero)
      : mx::Primitive(s), K_(K), block_(block), int8_blocks_(int8_blocks), vnni_(vnni), mid_zero_(mid_zero) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& packed = inputs[1];
    const auto& scales = inputs[2];
    const auto& zbias = inputs[3];
    auto& y = outputs[0];
    for (size_t i = 1; i < 4; ++i)
      if (!inputs[i].flags().row_contiguous)
        throw std::runtime_error("[Int4RowGemv] weights, scales and zero biases must be row-contiguous");
    begin_output(inputs, y, stream());
    const int N = static_cast<int>(y.size()), nb = scales.shape(1), K = K_, block = block_;
    dispatch_task(stream(), [xp = x.data<float>(), incx = x.strides().back(), qp = packed.data<uint8_t>(),
                  sp = scales.data<float>(), zp = zbias.data<float>(), yp = y.data<float>(), N, nb, K,
                  block, int8 = int8_blocks_, vnni = vnni_, mid = mid_zero_] {
      // int8 blocks: integer codes where the CPU has AVX2 and blocks hold whole 16-byte steps;
      // otherwise the codes dequantized back to floats for the float kernel (same values).
      bool integer = false;
#ifdef ORTMLX_X86
      integer = int8 && cpu_has_avx2_fma() && block % 32 == 0;
#endif
      SplitRow r;
      std::optional<QuantRow> qr;
      if (integer) {
        qr = quant_row(xp, incx, K, block, nb);
      } else if (int8) {
        const std::vector<float> xq = fake_quant_row(xp, incx, K, block);
        r = split_row(xq.data(), 1, K, block, nb);
      } else {
        r = split_row(xp, incx, K, block, nb);
      }
      // Every zero point 8: zbias = -8 x scale, so the kernels read the scales for it, against
      // the block sums times -8 (the same products: scaling by 8 is exact), and the zero
      // biases' stream (a fifth of the bytes a decode step reads) is not read at all.
      const float* zb = zp;
      if (mid) {
        zb = sp;
        for (auto& v : qr ? qr->block_sum : r.block_sum) v *= -8.f;
      }
      const QuantRow* qp8 = qr ? &*qr : nullptr;
      // Split the rows when there is enough work to pay for a hand-off (~10 us).
      const int64_t work = static_cast<int64_t>(N) * nb * block;
      const int parts = work >= (int64_t{1} << 18) ? std::max(1, std::min(cpu_threads(), N / 16)) : 1;
      cpu_parallel_for(N, parts, [&](int64_t n0, int64_t n1) {
        int4_rows(r, qp8, qp, sp, zb, yp, static_cast<int>(n0), static_cast<int>(n1), nb, block, vnni);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error("[Int4RowGemv] runs on the CPU stream only");
  }
  const char* name() const override { return "Int4RowGemv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Int4RowGemv*>(&other);
    return o && o->K_ == K_ && o->block_ == block_ && o->int8_blocks_ == int8_blocks_ && o->vnni_ == vnni_ &&
           o->mid_zero_ == mid_zero_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out.back() = inputs[1].shape(0);
    return {out};
  }

 private:
  int K_, block_;
  bool int8_blocks_;
  bool vnni_;  // the AVX-512 VNNI kernel (cpu_has_avx512_vnni() and cpu_avx512_kernels() at translation)
  bool mid_zero_;  // every zero point is 8 (none given): zbias is -8 x scale
};

bool cpu_has_avx512_vnni() {
#ifdef ORTMLX_X86
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}


// ---- The panel layout: prompt rows and decode rows of one copy of the weight, AVX-512 VNNI ----
//
// The weight laid out once (cpu_int4_panel_codes, cpu_int4_panel_floats) as panels of 16 outputs: per panel and group of 8
// values of K, 64 bytes, lane n's 4 bytes holding output n's codes k..k+3 in their low nibbles
// and k+4..k+7 in their high ones (a vpdpbusd operand each, after a mask or a shift and mask);
// scales and zero biases per panel and block as 16 lanes. Outputs past N are zero. Prompt rows
// and decode rows read this one copy, the size of ORT's bytes: a prompt leaves in the caches the
// weights the next decode steps read.

// The rows quantized as MLAS does (quantize_block): codes [M][Kp] (zero past K), and per row and
// block the scale and the sum of the dequantized values.
struct QuantRows {
  std::vector<int8_t> codes;
  std::vector<float> scale, sum;
};

// The panel weight's pointers (the arrays of cpu_int4_panel_codes and cpu_int4_panel_floats).
// mid: every zero point is 8, and `zb` is not read: the zero-point term is scale x (-8 x the
// row's block sum), the same products.
struct PanelWeight {
  const uint8_t* codes;
  const float *sc, *zb;
  int64_t Kp;
  int nb, block, N;
  bool mid;
};

#ifdef ORTMLX_X86
// quantize_block's arithmetic on a whole block (a multiple of 16 values), 16 lanes a step: the
// same scale and codes (x * (127 / max) rounded half to even by the conversion, as nearbyint
// in the default rounding mode), their sum in `sum`.
__attribute__((target("avx512f,avx512bw"))) float quantize_block_avx512(const float* x, int n, int8_t* codes,
                                                                       int32_t& sum) {
  __m512 vmax = _mm512_setzero_ps();
  for (int k = 0; k < n; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  const float amax = _mm512_reduce_max_ps(vmax);
  const float scale = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
  __m512i vsum = _mm512_setzero_si512();
  for (int k = 0; k < n; k += 16) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
    q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-128));
    vsum = _mm512_add_epi32(vsum, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_cvtepi32_epi8(q));
  }
  sum = _mm512_reduce_add_epi32(vsum);
  return scale;
}

// M rows of K floats (row-major) quantized per block; split over the threads when large.
QuantRows quantize_rows(const float* xp, int64_t M, int K, int nb, int block) {
  const int64_t Kp = static_cast<int64_t>(nb) * block;
  QuantRows q;
  q.codes.assign(static_cast<size_t>(M * Kp), 0);
  q.scale.assign(static_cast<size_t>(M * nb), 0.f);
  q.sum.assign(static_cast<size_t>(M * nb), 0.f);
  cpu_parallel_for(M, M * K >= (int64_t{1} << 16) ? cpu_threads() : 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int b = 0; b < nb; ++b) {
        const int k0 = b * block, k1 = std::min(K, k0 + block);
        if (k0 >= k1) continue;
        int32_t codes = 0;
        int8_t* c = q.codes.data() + m * Kp;
        const float scale = k1 - k0 == block ? quantize_block_avx512(xp + m * K + k0, block, c + k0, codes)
                                             : quantize_block(xp + m * K, 1, k0, k1, [&](int k, float v) {
                                                 c[k] = static_cast<int8_t>(v);
                                                 codes += static_cast<int32_t>(v);
                                               });
        q.scale[static_cast<size_t>(m * nb + b)] = scale;
        q.sum[static_cast<size_t>(m * nb + b)] = static_cast<float>(codes) * scale;
      }
  });
  return q;
}

// R rows x NP panels of 16 outputs: per block, int32 sums by vpdpbusd (the weight's unsigned
// codes against the rows' signed ones), then scaled into float accumulators with the zero
// biases times the rows' block sums. Fixed R and NP keep the accumulators in registers; one row
// (a decode step) keeps the low and high nibbles' sums apart, two dependency chains a panel.
template <int R, int NP>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void int4_panel_tile(const QuantRows& x, const PanelWeight& w,
                                                                            int64_t r0, int64_t p0, float* y) {
  constexpr int H = R == 1 ? 2 : 1;  // separate sums for the two nibbles
  const __m512i mask = _mm512_set1_epi8(15);
  __m512 acc[R][NP];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t groups_per_block = w.block / 8, panel_bytes = w.Kp * 8;
  const uint8_t* panel = w.codes + p0 * panel_bytes;
  for (int b = 0; b < w.nb; ++b) {
    __m512i dot[R][NP][H];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p)
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h) dot[r][p][h] = _mm512_setzero_si512();
    const int64_t g0 = b * groups_per_block;
    for (int64_t g = g0; g < g0 + groups_per_block; ++g) {
      __m512i lo[NP], hi[NP];
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) {
        const __m512i v = _mm512_loadu_si512(panel + p * panel_bytes + g * 64);
        lo[p] = _mm512_and_si512(v, mask);
        hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t eight[2];
        std::memcpy(eight, x.codes.data() + (r0 + r) * w.Kp + g * 8, 8);
        const __m512i xlo = _mm512_set1_epi32(eight[0]), xhi = _mm512_set1_epi32(eight[1]);
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
          dot[r][p][0] = _mm512_dpbusd_epi32(dot[r][p][0], lo[p], xlo);
          dot[r][p][H - 1] = _mm512_dpbusd_epi32(dot[r][p][H - 1], hi[p], xhi);
        }
      }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const int64_t at = ((p0 + p) * w.nb + b) * 16;
      const __m512 ws = _mm512_loadu_ps(w.sc + at);
      const __m512 zb = w.mid ? ws : _mm512_loadu_ps(w.zb + at);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const size_t rb = static_cast<size_t>((r0 + r) * w.nb + b);
        const __m512i d = H == 2 ? _mm512_add_epi32(dot[r][p][0], dot[r][p][H - 1]) : dot[r][p][0];
        acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, _mm512_set1_ps(x.scale[rb])), acc[r][p]);
        acc[r][p] = _mm512_fmadd_ps(zb, _mm512_set1_ps(w.mid ? -8.f * x.sum[rb] : x.sum[rb]), acc[r][p]);
      }
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int64_t n0 = (p0 + p) * 16;
    const __mmask16 m = w.N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (w.N - n0)) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * w.N + n0, m, acc[r][p]);
  }
}

template <int R>
void int4_panel_rows(const QuantRows& x, const PanelWeight& w, int64_t r0, int64_t p0, int64_t np, float* y) {
  if (np == 2) int4_panel_tile<R, 2>(x, w, r0, p0, y);
  else int4_panel_tile<R, 1>(x, w, r0, p0, y);
}
#endif

// x [M, K] times the panel weight: inputs x, codes, scales and (unless mid) zero biases.
class Int4PanelProduct : public mx::UnaryPrimitive {
 public:
  Int4PanelProduct(mx::Stream s, int K, int N, int block, bool mid, bool one_row)
      : mx::UnaryPrimitive(s), K_(K), N_(N), block_(block), mid_(mid), one_row_(one_row) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    for (size_t i = 1; i < inputs.size(); ++i)
      if (!inputs[i].flags().row_contiguous)
        throw std::runtime_error(std::string("[") + name() + "] the panel weight must be row-contiguous");
    begin_output(inputs, out, stream());
    const int nb = inputs[2].shape(1) / 16;
    const PanelWeight pw{inputs[1].data<uint8_t>(), inputs[2].data<float>(), mid_ ? nullptr : inputs[3].data<float>(),
                         static_cast<int64_t>(nb) * block_, nb, block_, N_, mid_};
    dispatch_task(stream(), [x = RowMajorInput(inputs[0]), pw, yp = out.data<float>(), K = K_, N = N_,
                             M = static_cast<int64_t>(inputs[0].size() / K_)] {
#ifdef ORTMLX_X86
      const QuantRows q = quantize_rows(x.rows(), M, K, pw.nb, pw.block);
      const int64_t panels = (N + 15) / 16;
      if (M == 1) {
        // One row: four panels (64 outputs) a step, split over the threads when the weight is
        // large enough to pay for a hand-off.
        const int64_t quads = (panels + 3) / 4;
        const int64_t work = static_cast<int64_t>(N) * pw.Kp;
        const int parts = work >= (int64_t{1} << 18) ? std::max<int>(1, std::min<int64_t>(cpu_threads(), quads)) : 1;
        cpu_parallel_for(quads, parts, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t p0 = 4 * i;
            if (p0 + 4 <= panels)
              int4_panel_tile<1, 4>(q, pw, 0, p0, yp);
            else
              for (int64_t p = p0; p < panels; ++p) int4_panel_tile<1, 1>(q, pw, 0, p, yp);
          }
        });
        return;
      }
      // Tiles of 4 rows x 2 panels (32 outputs), split over the threads.
      const int64_t row_tiles = (M + 3) / 4, panel_pairs = (panels + 1) / 2;
      cpu_parallel_for(row_tiles * panel_pairs, cpu_threads(), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r0 = (i / panel_pairs) * 4, p0 = (i % panel_pairs) * 2;
          const int64_t rows = std::min<int64_t>(4, M - r0), np = std::min<int64_t>(2, panels - p0);
          switch (rows) {
            case 4: int4_panel_rows<4>(q, pw, r0, p0, np, yp); break;
            case 3: int4_panel_rows<3>(q, pw, r0, p0, np, yp); break;
            case 2: int4_panel_rows<2>(q, pw, r0, p0, np, yp); break;
            default: int4_panel_rows<1>(q, pw, r0, p0, np, yp); break;
          }
        }
      });
#else
      throw std::logic_error("[Int4PanelProduct] needs an x86-64 CPU with AVX-512 VNNI");
#endif
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error(std::string("[") + name() + "] runs on the CPU stream only");
  }
  // A decode row and a prompt's rows are told apart by name (reports, tests).
  const char* name() const override { return one_row_ ? "Int4PanelGemv" : "Int4GemmVnni"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Int4PanelProduct*>(&other);
    return o && o->K_ == K_ && o->N_ == N_ && o->block_ == block_ && o->mid_ == mid_ && o->one_row_ == one_row_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out.back() = N_;
    return {out};
  }
 private:
  int K_, N_, block_;
  bool mid_;
  bool one_row_;  // named for a decode row (the kernel takes any row count)
};
}  // namespace

std::optional<mx::array> cpu_int4_gemv(const mx::array& x, const mx::array& packed,
                                       const mx::array& scales, const mx::array& zbias, int K,
                                       int block, mx::Stream s, bool int8_blocks, bool mid_zero) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 || x.ndim() < 1)
    return std::nullopt;
  if (x.shape(-1) != K || static_cast<int64_t>(x.size()) != K || K == 0) return std::nullopt;
  if (block < 16 || block % 16 != 0 || packed.dtype() != mx::uint8 || packed.ndim() != 2) return std::nullopt;
  if (scales.dtype() != mx::float32 || zbias.dtype() != mx::float32 || scales.ndim() != 2 ||
      zbias.shape() != scales.shape())
    return std::nullopt;
  const int N = packed.shape(0), nb = scales.shape(1);
  if (scales.shape(0) != N || static_cast<int64_t>(nb) * block < K ||
      packed.shape(1) != nb * block / 2 || N == 0)
    return std::nullopt;
  mx::Shape out = x.shape();
  out.back() = N;
  return mx::array(std::move(out), mx::float32,
                   std::make_shared<Int4RowGemv>(s, K, block, int8_blocks, cpu_avx512_kernels() && cpu_has_avx512_vnni(),
                                                 mid_zero),
                   {x, packed, scales, zbias});
}

bool cpu_int4_panels_apply(int block) {
  return cpu_row_kernels_enabled() && cpu_avx512_kernels() && cpu_has_avx512_vnni() && block >= 32 &&
         block % 32 == 0 && block <= 256;
}

namespace {
std::atomic<uint64_t> g_panel_layouts{0};
}  // namespace

uint64_t cpu_int4_panel_layouts() { return g_panel_layouts.load(std::memory_order_relaxed); }

mx::array cpu_int4_panel_codes(const mx::array& packed, mx::Stream s) {
  g_panel_layouts.fetch_add(1, std::memory_order_relaxed);
  const int N = packed.shape(0), Kp = 2 * packed.shape(1), P = (N + 15) / 16;
  const auto u8 = [](int v) { return mx::array(static_cast<uint8_t>(v), mx::uint8); };
  // Codes in K's order: [N, Kp].
  auto c = mx::reshape(mx::stack({mx::bitwise_and(packed, u8(15), s), mx::right_shift(packed, u8(4), s)}, -1, s),
                       {N, Kp}, s);
  if (P * 16 != N) c = mx::pad(c, {0}, {0}, {P * 16 - N}, u8(0), "constant", s);
  // k = 8 g + 4 h + j -> [h][P][g][lane][j]: h = 0 the low nibbles, h = 1 the high ones.
  c = mx::transpose(mx::reshape(c, {P, 16, Kp / 8, 2, 4}, s), {3, 0, 2, 1, 4}, s);
  const auto low = mx::slice(c, {0, 0, 0, 0, 0}, {1, P, Kp / 8, 16, 4}, s);
  const auto high = mx::slice(c, {1, 0, 0, 0, 0}, {2, P, Kp / 8, 16, 4}, s);
  return mx::reshape(mx::bitwise_or(low, mx::left_shift(high, u8(4), s), s), {P, Kp * 8}, s);
}

mx::array cpu_int4_panel_floats(const mx::array& per_block, mx::Stream s) {
  const int N = per_block.shape(0), nb = per_block.shape(1), P = (N + 15) / 16;
  auto f = mx::astype(per_block, mx::float32, s);
  if (P * 16 != N) f = mx::pad(f, {0}, {0}, {P * 16 - N}, mx::array(0.f), "constant", s);
  return mx::reshape(mx::transpose(mx::reshape(f, {P, 16, nb}, s), {0, 2, 1}, s), {P, nb * 16}, s);
}

std::optional<mx::array> cpu_int4_panel_product(const mx::array& x, const mx::array& codes, const mx::array& scales,
                                                const std::optional<mx::array>& zbias, int K, int N, int block,
                                                mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_int4_panels_apply(block) || x.dtype() != mx::float32 || x.ndim() < 1 ||
      x.shape(-1) != K || K == 0 || x.size() == 0 || N <= 0)
    return std::nullopt;
  const int P = (N + 15) / 16, nb = (K + block - 1) / block;
  if (codes.dtype() != mx::uint8 || codes.shape() != mx::Shape{P, nb * block * 8} || scales.dtype() != mx::float32 ||
      scales.shape() != mx::Shape{P, nb * 16} || (zbias && (zbias->dtype() != mx::float32 || zbias->shape() != scales.shape())))
    return std::nullopt;
  mx::Shape out = x.shape();
  out.back() = N;
  std::vector<mx::array> inputs{x, codes, scales};
  if (zbias) inputs.push_back(*zbias);
  const bool one_row = static_cast<int64_t>(x.size()) == K;
  return mx::array(std::move(out), mx::float32,
                   std::make_shared<Int4PanelProduct>(s, K, N, block, /*mid=*/!zbias, one_row), std::move(inputs));
}

}  // namespace ortmlx::ops
