// Layer normalization over the last axis on MLX's CPU stream: cpu_layer_norm of
// kernels/cpu/kernels.h.
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// y = (x - mean) / sqrt(var + eps) * scale (+ bias) for one row of n; the mean first, then the
// variance as the mean of squared deviations (two passes, as MLX's composed form).
// With `rms` the mean is taken as 0 (RMS normalization: x / sqrt(mean(x^2) + eps) * scale).
using NormRow = void (*)(const float* x, const float* scale, const float* bias, float* y, int64_t n, float eps,
                         bool rms);

void norm_row_scalar(const float* x, const float* scale, const float* bias, float* y, int64_t n, float eps, bool rms) {
  float sum = 0.f;
  if (!rms)
    for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float sq = 0.f;
  for (int64_t i = 0; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.f);
}

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) void norm_row_avx2(const float* x, const float* scale, const float* bias, float* y,
                                                        int64_t n, float eps, bool rms) {
  int64_t i = 0;
  float sum = 0.f;
  if (!rms) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    sum = hsum8(acc);
    for (; i < n; ++i) sum += x[i];
  }
  const float mean = sum / static_cast<float>(n);
  const __m256 m = _mm256_set1_ps(mean);
  __m256 acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
    acc = _mm256_fmadd_ps(d, d, acc);
  }
  float sq = hsum8(acc);
  for (; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
  const __m256 v = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), v), _mm256_loadu_ps(scale + i));
    _mm256_storeu_ps(y + i, bias ? _mm256_add_ps(t, _mm256_loadu_ps(bias + i)) : t);
  }
  for (; i < n; ++i) y[i] = (x[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.f);
}

// A row's values at [i, i + 16) under k: x, or in the skip forms x + skip (+ bias), kept in sum.
__attribute__((target("avx512f"))) inline __m512 row_values(const float* x, const float* skip, const float* skip_bias,
                                                            float* sum, int64_t i, __mmask16 k) {
  __m512 v = _mm512_maskz_loadu_ps(k, x + i);
  if (skip) {
    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, skip + i));
    if (skip_bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, skip_bias + i));
    _mm512_mask_storeu_ps(sum + i, k, v);
  }
  return v;
}

// The sum of four vectors' lanes.
__attribute__((target("avx512f"))) inline float sum_of4(const __m512* acc) {
  return hsum16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// The same row with 16 lanes and four sums in flight (a row's passes are otherwise bound by
// their one sum's add latency), the skip forms' sum x + skip (+ bias) made in the first pass,
// into `sum` (which may be y), instead of a pass of its own.
__attribute__((target("avx512f"))) void norm_row_avx512(const float* x, const float* skip, const float* skip_bias,
                                                        float* sum, const float* scale, const float* bias, float* y,
                                                        int64_t n, float eps, bool rms) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = row_values(x, skip, skip_bias, sum, i, 0xFFFF);
    if (!rms) acc[(i >> 4) & 3] = _mm512_add_ps(acc[(i >> 4) & 3], v);
  }
  if (i < n) {
    const __m512 v = row_values(x, skip, skip_bias, sum, i, first_lanes(n - i));
    if (!rms) acc[(i >> 4) & 3] = _mm512_add_ps(acc[(i >> 4) & 3], v);
  }
  const float* r = skip ? sum : x;
  const float mean = sum_of4(acc) / static_cast<float>(n);
  const __m512 m = _mm512_set1_ps(mean);
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = first_lanes(n - i);
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, r + i), m);
    acc[(i >> 4) & 3] = _mm512_fmadd_ps(d, d, acc[(i >> 4) & 3]);
  }
  const float sq = sum_of4(acc);
  const __m512 v = _mm512_set1_ps(1.f / std::sqrt(sq / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = first_lanes(n - i);
    __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, r + i), m), v),
                             _mm512_maskz_loadu_ps(k, scale + i));
    if (bias) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(k, bias + i));
    _mm512_mask_storeu_ps(y + i, k, t);
  }
}
#endif

// out = (a + b) (+ bias) over n floats, in that order (as MLX's two adds).
using AddRow = void (*)(const float* a, const float* b, const float* bias, float* out, int64_t n);

void add_row_scalar(const float* a, const float* b, const float* bias, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bias ? (a[i] + b[i]) + bias[i] : a[i] + b[i];
}

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) void add_row_avx2(const float* a, const float* b, const float* bias, float* out,
                                                       int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + i));
    _mm256_storeu_ps(out + i, v);
  }
  add_row_scalar(a + i, b + i, bias ? bias + i : nullptr, out + i, n - i);
}
#endif

AddRow pick_add_row() {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return add_row_avx2;
#endif
  return add_row_scalar;
}

NormRow pick_norm_row() {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return norm_row_avx2;
#endif
  return norm_row_scalar;
}

// Which inputs a row normalization reads beside x and scale, and whether it keeps the sum.
struct NormInputs {
  bool skip = false;      // x + skip (+ bias) is normalized (the skip forms)
  bool beta = false;      // added after the scale
  bool bias = false;      // added to the sum (with skip only)
  bool with_sum = false;  // the sum a second output (a decoder's residual stream reads it)
  bool operator==(const NormInputs&) const = default;
};

// norm(x) or norm(x + skip (+ bias)) over the last axis, times scale (+ beta). Inputs: x, then
// skip when given, scale, then beta and bias when given.
class RowNorm : public mx::Primitive {
 public:
  RowNorm(mx::Stream s, float eps, bool rms, NormInputs in, bool avx512)
      : mx::Primitive(s), eps_(eps), rms_(rms), in_(in), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) begin_output(inputs, o, stream());
    const auto& x = inputs[0];
    const int64_t n = x.shape(-1), rows = n ? static_cast<int64_t>(x.size()) / n : 0;
    size_t next = 1;
    std::optional<RowMajorInput> skip, beta, bias;
    if (in_.skip) skip.emplace(inputs[next++]);
    RowMajorInput scale(inputs[next++]);
    if (in_.beta) beta.emplace(inputs[next++]);
    if (in_.bias) bias.emplace(inputs[next++]);
    dispatch_task(stream(), [in = RowMajorInput(x), skip = std::move(skip), scale = std::move(scale),
                             beta = std::move(beta), bias = std::move(bias), yp = outputs[0].data<float>(),
                             sum_out = outputs.size() > 1 ? outputs[1].data<float>() : nullptr, n, rows, eps = eps_,
                             rms = rms_, avx512 = avx512_] {
      static const NormRow row = pick_norm_row();
      static const AddRow add = pick_add_row();
      const float *xp = in.rows(), *sp = scale.rows();
      const float* kp = skip ? skip->rows() : nullptr;
      const float* betap = beta ? beta->rows() : nullptr;
      const float* biasp = bias ? bias->rows() : nullptr;
      const int parts = rows * n >= (int64_t{1} << 16) ? cpu_threads() : 1;
      cpu_parallel_for(rows, parts, [&](int64_t r0, int64_t r1) {
#ifdef ORTMLX_X86
        if (avx512) {
          for (int64_t r = r0; r < r1; ++r)
            norm_row_avx512(xp + r * n, kp ? kp + r * n : nullptr, biasp, (sum_out ? sum_out : yp) + r * n, sp, betap,
                            yp + r * n, n, eps, rms);
          return;
        }
#endif
        for (int64_t r = r0; r < r1; ++r) {
          const float* src = xp + r * n;
          if (kp) {  // the sum where it is kept, else in the output row, normalized there in place
            float* sum = (sum_out ? sum_out : yp) + r * n;
            add(src, kp + r * n, biasp, sum, n);
            src = sum;
          }
          row(src, sp, betap, yp + r * n, n, eps, rms);
        }
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error(std::string("[") + name() + "] runs on the CPU stream only");
  }
  const char* name() const override {
    return in_.skip ? (rms_ ? "RowSkipRmsNorm" : "RowSkipLayerNorm") : (rms_ ? "RowRmsNorm" : "RowLayerNorm");
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RowNorm*>(&other);
    return o && o->eps_ == eps_ && o->rms_ == rms_ && o->in_ == in_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return std::vector<mx::Shape>(in_.with_sum ? 2 : 1, inputs[0].shape());
  }

 private:
  float eps_;
  bool rms_;
  NormInputs in_;
  bool avx512_;  // cpu_avx512_kernels() at translation, on a CPU that has AVX-512F
};

bool row_vector(const std::optional<mx::array>& v, int n) {
  return !v || (v->dtype() == mx::float32 && v->ndim() == 1 && v->shape(0) == n);
}

}  // namespace

std::optional<std::vector<mx::array>> cpu_skip_norm(const mx::array& x, const mx::array& skip,
                                                    const std::optional<mx::array>& bias, const mx::array& scale,
                                                    const std::optional<mx::array>& beta, float eps, bool rms,
                                                    bool with_sum, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 || x.ndim() < 1 ||
      x.size() == 0 || skip.dtype() != mx::float32 || skip.shape() != x.shape())
    return std::nullopt;
  const int n = x.shape(-1);
  if (!row_vector(scale, n) || !row_vector(beta, n) || !row_vector(bias, n)) return std::nullopt;
  std::vector<mx::array> in{x, skip, scale};
  if (beta) in.push_back(*beta);
  if (bias) in.push_back(*bias);
  auto prim = std::make_shared<RowNorm>(s, eps, rms, NormInputs{true, beta.has_value(), bias.has_value(), with_sum},
                                        cpu_avx512_kernels());
  if (!with_sum) return std::vector<mx::array>{mx::array(x.shape(), mx::float32, std::move(prim), std::move(in))};
  return mx::array::make_arrays({x.shape(), x.shape()}, {mx::float32, mx::float32}, std::move(prim), std::move(in));
}

std::optional<mx::array> cpu_layer_norm(const mx::array& x, const mx::array& scale, const std::optional<mx::array>& bias,
                                        float eps, mx::Stream s, bool rms) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 || x.ndim() < 1 ||
      x.size() == 0 || !row_vector(scale, x.shape(-1)) || !row_vector(bias, x.shape(-1)))
    return std::nullopt;
  std::vector<mx::array> in{x, scale};
  if (bias) in.push_back(*bias);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<RowNorm>(s, eps, rms, NormInputs{.beta = bias.has_value()}, cpu_avx512_kernels()),
                   std::move(in));
}

}  // namespace ortmlx::ops
