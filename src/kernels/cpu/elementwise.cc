// MLX's own elementwise primitives computed by the calling thread (kernels/cpu/kernels.h:
// cpu_elementwise_on_caller), for the evaluation on the caller (engine/caller_eval.h).
//
// Why: on MLX's CPU device each of these is a task handed to the stream's thread, and for the
// small tensors of a wake-word head or a VAD step the hand-off costs more than the arithmetic.
// The arithmetic is MLX's own (IEEE float32 operations, Maximum and Minimum returning a NaN
// first operand as MLX does, its exp, sigmoid and erf formulas below, libm's tanh, log, pow),
// so a result does not depend on which thread computed it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/buffers.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {
namespace {

// Elements from which a flat loop is split over the threads.
constexpr int64_t kParallelElements = int64_t{1} << 16;

int parts_for(int64_t n) { return n >= kParallelElements ? cpu_threads() : 1; }

struct AddOp { template <class T> T operator()(T a, T b) const { return a + b; } };
struct SubtractOp { template <class T> T operator()(T a, T b) const { return a - b; } };
struct MultiplyOp { template <class T> T operator()(T a, T b) const { return a * b; } };
struct DivideOp { float operator()(float a, float b) const { return a / b; } };
struct MaximumOp {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) if (std::isnan(a)) return a;
    return a > b ? a : b;
  }
};
struct MinimumOp {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) if (std::isnan(a)) return a;
    return a < b ? a : b;
  }
};
struct PowerOp { float operator()(float a, float b) const { return std::pow(a, b); } };

// y = op(a, b) over inputs of y's shape with any strides (broadcasts are stride 0): a flat loop
// when both are row-contiguous or one is a single value, else row by row along the last axis.
template <class T, class Op>
void binary(const mx::array& a, const mx::array& b, T* y, Op op) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const int64_t n = static_cast<int64_t>(a.size());
  const bool ra = a.flags().row_contiguous, rb = b.flags().row_contiguous;
  const bool sa = a.data_size() == 1, sb = b.data_size() == 1;
  if ((ra || sa) && (rb || sb)) {
    cpu_parallel_for(n, parts_for(n), [&](int64_t i0, int64_t i1) {
      if (sa && !sb) {
        const T x = pa[0];
        for (int64_t i = i0; i < i1; ++i) y[i] = op(x, pb[i]);
      } else if (sb && !sa) {
        const T x = pb[0];
        for (int64_t i = i0; i < i1; ++i) y[i] = op(pa[i], x);
      } else if (sa && sb) {
        const T v = op(pa[0], pb[0]);
        for (int64_t i = i0; i < i1; ++i) y[i] = v;
      } else {
        for (int64_t i = i0; i < i1; ++i) y[i] = op(pa[i], pb[i]);
      }
    });
    return;
  }
  const auto& shape = a.shape();
  const int nd = static_cast<int>(shape.size());
  const int64_t inner = shape[nd - 1], ia = a.strides()[nd - 1], ib = b.strides()[nd - 1];
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t done = 0; done < n; done += inner, y += inner) {
    int64_t oa = 0, ob = 0;
    for (int k = 0; k + 1 < nd; ++k) {
      oa += idx[k] * a.strides()[k];
      ob += idx[k] * b.strides()[k];
    }
    const T* ra_ = pa + oa;
    const T* rb_ = pb + ob;
    if (ia == 1 && ib == 1) {
      for (int64_t j = 0; j < inner; ++j) y[j] = op(ra_[j], rb_[j]);
    } else if (ia == 1 && ib == 0) {
      for (int64_t j = 0; j < inner; ++j) y[j] = op(ra_[j], rb_[0]);
    } else if (ia == 0 && ib == 1) {
      for (int64_t j = 0; j < inner; ++j) y[j] = op(ra_[0], rb_[j]);
    } else {
      for (int64_t j = 0; j < inner; ++j) y[j] = op(ra_[j * ia], rb_[j * ib]);
    }
    for (int k = nd - 2; k >= 0; --k) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

template <class F>
void unary(const mx::array& x, float* y, F f) {
  std::vector<float> scratch;
  const float* p = row_major(x, scratch);
  const int64_t n = static_cast<int64_t>(x.size());
  cpu_parallel_for(n, parts_for(n), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = f(p[i]);
  });
}

// MLX's CPU formulas for exp, the sigmoid and erf (its simd math, which on x86 runs one lane
// at a time), operation for operation: a fused multiply-add where MLX calls fma, none elsewhere
// (this file is built with -ffp-contract=off), so a value is the same bits whichever of MLX's
// kernels (eager, or fused into a compiled kernel) or this file computed it.
constexpr float kExpP[] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                           5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f, 1.f};
constexpr float kErfP = 0.3275911f, kErfA[] = {1.061405429f, -1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f};

float mlx_exp(float x0) {
  const float x = x0 * 1.442695f;
  const float ip = static_cast<float>(std::floor(static_cast<double>(x) + 0.5));  // MLX adds a double 0.5
  const float fp = x - ip;
  float p = kExpP[0];
  for (int k = 1; k < 7; ++k) p = std::fma(p, fp, kExpP[k]);
  const int32_t bits = (static_cast<int32_t>(ip) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float r = std::isnan(x0) ? x0 : scale * p;
  if (x0 > 88.f) r = INFINITY;
  if (x0 < -88.f) r = 0.f;
  return r;
}
float mlx_sigmoid(float x) {
  const float y = 1.f / (1.f + mlx_exp(std::fabs(x)));
  return x < 0.f ? y : 1.f - y;
}
float mlx_erf(float v) {
  const float t = 1.f / std::fma(kErfP, std::fabs(v), 1.f);
  float r = std::fma(kErfA[0], t, kErfA[1]);
  for (int k = 2; k < 5; ++k) r = std::fma(r, t, kErfA[k]);
  const float e = -mlx_exp(-v * v);
  const float y = std::fma(e * t, r, 1.f);
  return v > 0.f ? y : -y;
}

enum class Transcendental { Exp, Sigmoid, Erf, Tanh };

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) __m256 mlx_exp8(__m256 x0) {
  const __m256 x = _mm256_mul_ps(x0, _mm256_set1_ps(1.442695f));
  const __m256d half = _mm256_set1_pd(0.5);
  const __m128 lo = _mm256_cvtpd_ps(_mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), half)));
  const __m128 hi = _mm256_cvtpd_ps(_mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), half)));
  const __m256 ip = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
  const __m256 fp = _mm256_sub_ps(x, ip);
  __m256 p = _mm256_set1_ps(kExpP[0]);
  for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, fp, _mm256_set1_ps(kExpP[k]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(ip), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(_mm256_castsi256_ps(bits), p);
  r = _mm256_blendv_ps(r, x0, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x0, _mm256_set1_ps(88.f), _CMP_GT_OQ));
  return _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x0, _mm256_set1_ps(-88.f), _CMP_LT_OQ));
}
__attribute__((target("avx2,fma"))) __m256 mlx_sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.f), x);
  const __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, mlx_exp8(ax)));
  return _mm256_blendv_ps(_mm256_sub_ps(one, y), y, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}
__attribute__((target("avx2,fma"))) __m256 mlx_erf8(__m256 v) {
  const __m256 av = _mm256_andnot_ps(_mm256_set1_ps(-0.f), v);
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(_mm256_set1_ps(kErfP), av, _mm256_set1_ps(1.f)));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(kErfA[0]), t, _mm256_set1_ps(kErfA[1]));
  for (int k = 2; k < 5; ++k) r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kErfA[k]));
  const __m256 neg = _mm256_set1_ps(-0.f);
  const __m256 e = _mm256_xor_ps(mlx_exp8(_mm256_mul_ps(_mm256_xor_ps(v, neg), v)), neg);
  const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(e, t), r, _mm256_set1_ps(1.f));
  return _mm256_blendv_ps(_mm256_xor_ps(y, neg), y, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
}
template <Transcendental F>
__attribute__((target("avx2,fma"))) int64_t lanes8(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 r;
    if constexpr (F == Transcendental::Exp) r = mlx_exp8(v);
    if constexpr (F == Transcendental::Sigmoid) r = mlx_sigmoid8(v);
    if constexpr (F == Transcendental::Erf) r = mlx_erf8(v);
    _mm256_storeu_ps(y + i, r);
  }
  return i;
}
#endif

template <Transcendental F>
void map_mlx(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef ORTMLX_X86
  if constexpr (F != Transcendental::Tanh)
    if (cpu_has_avx2_fma()) i = lanes8<F>(x, y, n);
#endif
  for (; i < n; ++i) {
    if constexpr (F == Transcendental::Exp) y[i] = mlx_exp(x[i]);
    if constexpr (F == Transcendental::Sigmoid) y[i] = mlx_sigmoid(x[i]);
    if constexpr (F == Transcendental::Erf) y[i] = mlx_erf(x[i]);
    if constexpr (F == Transcendental::Tanh) y[i] = std::tanh(x[i]);
  }
}

template <Transcendental F>
void transcendental(const mx::array& x, float* y) {
  std::vector<float> scratch;
  const float* p = row_major(x, scratch);
  const int64_t n = static_cast<int64_t>(x.size());
  cpu_parallel_for(n, parts_for(n), [&](int64_t i0, int64_t i1) { map_mlx<F>(p + i0, y + i0, i1 - i0); });
}

template <class From, class To>
void convert(const mx::array& x, To* y) {
  std::vector<Stored<From>> scratch;
  const Stored<From>* p = row_major(x, scratch);
  for (size_t i = 0, n = x.size(); i < n; ++i) y[i] = static_cast<To>(static_cast<From>(p[i]));
}

template <class From>
bool convert_from(const mx::array& x, mx::array& out) {
  switch (out.dtype()) {
    case mx::float32: convert<From>(x, out.data<float>()); return true;
    case mx::int32: convert<From>(x, out.data<int32_t>()); return true;
    case mx::int64: convert<From>(x, out.data<int64_t>()); return true;
    case mx::bool_: convert<From>(x, out.data<bool>()); return true;
    default: return false;
  }
}

bool known_dtype(mx::Dtype t) { return t == mx::float32 || t == mx::int32 || t == mx::int64 || t == mx::bool_; }

}  // namespace

bool cpu_elementwise_on_caller(std::string_view name, const std::vector<mx::array>& inputs, mx::array& out) {
  if (out.size() == 0 || inputs.empty()) return false;
  if (name == "AsType") {
    const auto& x = inputs[0];
    if (inputs.size() != 1 || !known_dtype(x.dtype()) || !known_dtype(out.dtype()) || x.shape() != out.shape())
      return false;
    allocate_output(out);
    switch (x.dtype()) {
      case mx::float32: return convert_from<float>(x, out);
      case mx::int32: return convert_from<int32_t>(x, out);
      case mx::int64: return convert_from<int64_t>(x, out);
      default: return convert_from<bool>(x, out);
    }
  }
  for (const auto& x : inputs)
    if (x.dtype() != out.dtype() || x.shape() != out.shape()) return false;
  if (inputs.size() == 2) {
    auto run = [&](auto op, auto type) {
      using T = decltype(type);
      allocate_output(out);
      binary<T>(inputs[0], inputs[1], out.data<T>(), op);
      return true;
    };
    // Integer arithmetic too (shape computations): the operations C++ and MLX define alike.
    auto any_type = [&](auto op) {
      switch (out.dtype()) {
        case mx::float32: return run(op, float{});
        case mx::int32: return run(op, int32_t{});
        case mx::int64: return run(op, int64_t{});
        default: return false;
      }
    };
    if (name == "Add") return any_type(AddOp{});
    if (name == "Subtract") return any_type(SubtractOp{});
    if (name == "Multiply") return any_type(MultiplyOp{});
    if (name == "Maximum") return any_type(MaximumOp{});
    if (name == "Minimum") return any_type(MinimumOp{});
    if (out.dtype() != mx::float32) return false;
    if (name == "Divide") return run(DivideOp{}, float{});
    if (name == "Power") return run(PowerOp{}, float{});
    return false;
  }
  if (inputs.size() != 1) return false;
  const auto& x = inputs[0];
  if (out.dtype() == mx::int32 || out.dtype() == mx::int64) {  // index arithmetic
    if (name != "Negative" && name != "Abs") return false;
    allocate_output(out);
    auto ints = [&](auto type) {
      using T = decltype(type);
      std::vector<T> scratch;
      const T* p = row_major(x, scratch);
      T* y = out.data<T>();
      for (size_t i = 0; i < x.size(); ++i) y[i] = name == "Negative" ? -p[i] : (p[i] < 0 ? -p[i] : p[i]);
      return true;
    };
    return out.dtype() == mx::int32 ? ints(int32_t{}) : ints(int64_t{});
  }
  if (out.dtype() != mx::float32) return false;
  auto run = [&](auto f) {
    allocate_output(out);
    unary(x, out.data<float>(), f);
    return true;
  };
  auto run_map = [&](auto f) {
    allocate_output(out);
    transcendental<decltype(f)::value>(x, out.data<float>());
    return true;
  };
  if (name == "Negative") return run([](float v) { return -v; });
  if (name == "Abs") return run([](float v) { return std::fabs(v); });
  if (name == "Square") return run([](float v) { return v * v; });
  if (name == "Sqrt") return run([](float v) { return std::sqrt(v); });
  if (name == "Rsqrt") return run([](float v) { return 1.0f / std::sqrt(v); });
  if (name == "Log") return run([](float v) { return std::log(v); });
  using T = Transcendental;
  if (name == "Exp") return run_map(std::integral_constant<T, T::Exp>{});
  if (name == "Sigmoid") return run_map(std::integral_constant<T, T::Sigmoid>{});
  if (name == "Tanh") return run_map(std::integral_constant<T, T::Tanh>{});
  if (name == "Erf") return run_map(std::integral_constant<T, T::Erf>{});
  return false;
}

}  // namespace ortmlx::ops
