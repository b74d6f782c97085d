#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// CBLAS's signature, with its enums as ints (CblasRowMajor = 101, CblasNoTrans = 111,
// CblasTrans = 112): we find the function at run time instead of including a cblas.h, so the
// library builds wherever MLX does and uses the BLAS that MLX itself was linked against.
using SgemvFn = void (*)(int order, int trans, int m, int n, float alpha, const float* a, int lda,
                         const float* x, int incx, float beta, float* y, int incy);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

SgemvFn sgemv() {
  static const SgemvFn fn = reinterpret_cast<SgemvFn>(cpu_blas_symbol("cblas_sgemv"));
  return fn;
}

#ifdef ORTMLX_X86
// y[n] = w[n, :] . x (w's rows at stride ld, x contiguous), 8 lanes at a time.
__attribute__((target("avx2,fma"))) void rows_dot_avx2(const float* w, int64_t ld, const float* x,
                                                       float* y, int N, int K) {
  for (int n = 0; n < N; ++n) {
    const float* r = w + n * ld;
    __m256 acc = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(r + k), _mm256_loadu_ps(x + k), acc);
    float t = hsum8(acc);
    for (; k < K; ++k) t += r[k] * x[k];
    y[n] = t;
  }
}
// y = sum_k x[k] w[k, :] (w's rows at stride ld), 8 lanes at a time.
__attribute__((target("avx2,fma"))) void rows_axpy_avx2(const float* w, int64_t ld, const float* x,
                                                        float* y, int K, int N) {
  std::fill(y, y + N, 0.f);
  for (int k = 0; k < K; ++k) {
    const float* r = w + k * ld;
    const __m256 xk = _mm256_set1_ps(x[k]);
    int n = 0;
    for (; n + 8 <= N; n += 8) _mm256_storeu_ps(y + n, _mm256_fmadd_ps(xk, _mm256_loadu_ps(r + n), _mm256_loadu_ps(y + n)));
    for (; n < N; ++n) y[n] += x[k] * r[n];
  }
}
#endif

// y[..., 1, N] = x[..., 1, K] . w[..., K, N]: one sgemv per batch element. x and w have the same
// batch dims (the builder broadcasts them as views); any strides. `own`: products small and
// many (attention's, per head) run on this thread with the AVX2 loops above instead of BLAS,
// whose threads (OpenBLAS threads a gemv from 9,216 elements) wake for each and then spin in
// sched_yield, taking a core from the stream and the row kernels' workers.
class RowGemv : public mx::Primitive {
 public:
  explicit RowGemv(mx::Stream s, bool own = false) : mx::Primitive(s), own_(own) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    mx::array& y = outputs[0];
    begin_output(inputs, y, stream());
    const int nd = static_cast<int>(w.ndim());
    const int K = w.shape(nd - 2), N = w.shape(nd - 1);
    Batch b;
    for (int d = 0; d < nd - 2; ++d) {
      b.shape.push_back(w.shape(d));
      b.x_strides.push_back(x.strides()[d]);
      b.w_strides.push_back(w.strides()[d]);
    }
    const int64_t xs = x.strides().back();
    const int64_t ws0 = w.strides()[nd - 2], ws1 = w.strides()[nd - 1];
    // Pointers are captured raw: MLX's CPU eval keeps every input buffer alive until the
    // stream has run the dispatched task.
    dispatch_task(stream(), [fn = sgemv(), own = own_, xp = x.data<float>(), wp = w.data<float>(), yp = y.data<float>(),
                  K, N, xs, ws0, ws1, b = std::move(b)] {
      std::vector<int64_t> idx(b.shape.size(), 0);
      std::vector<float> xbuf;
      for (int64_t i = 0, count = b.count(); i < count; ++i) {
        int64_t xo = 0, wo = 0;
        for (size_t d = 0; d < idx.size(); ++d) {
          xo += idx[d] * b.x_strides[d];
          wo += idx[d] * b.w_strides[d];
        }
        one_row(fn, own, xp + xo, xs, wp + wo, ws0, ws1, yp + i * N, K, N, xbuf);
        for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {  // next batch index
          if (++idx[d] < b.shape[d]) break;
          idx[d] = 0;
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error("[RowGemv] runs on the CPU stream only");
  }

  const char* name() const override { return "RowGemv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(RowGemv) && static_cast<const RowGemv&>(other).own_ == own_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out.back() = inputs[1].shape(-1);
    return {out};
  }

 private:
  bool own_;
  struct Batch {
    std::vector<int64_t> shape, x_strides, w_strides;
    int64_t count() const {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      return n;
    }
  };

  static void one_row(SgemvFn fn, bool own, const float* xp, int64_t xs, const float* wp,
                      int64_t ws0, int64_t ws1, float* yp, int K, int N, std::vector<float>& xbuf) {
    // A broadcast x (stride 0) is not a valid BLAS increment: gather it first.
    const float* xv = xp;
    int64_t incx = xs;
    if (xs <= 0) {
      xbuf.assign(static_cast<size_t>(K), xp[0]);
      xv = xbuf.data();
      incx = 1;
    }
#ifdef ORTMLX_X86
    if (own && cpu_has_avx2_fma() && (ws1 == 1 || ws0 == 1)) {
      if (incx != 1) {  // the loops read x contiguously
        xbuf.resize(static_cast<size_t>(K));
        for (int k = 0; k < K; ++k) xbuf[static_cast<size_t>(k)] = xv[k * incx];
        xv = xbuf.data();
      }
      if (ws1 == 1)
        rows_axpy_avx2(wp, ws0, xv, yp, K, N);  // row-major [K, N]
      else
        rows_dot_avx2(wp, ws1, xv, yp, N, K);  // a transposed view of row-major [N, K]
      return;
    }
#endif
    constexpr int64_t kIntMax = 2147483647;  // BLAS takes int leading dims and increments
    const bool blas_ok = incx <= kIntMax && ws0 <= kIntMax && ws1 <= kIntMax;
    if (blas_ok && ws1 == 1 && ws0 >= std::max(N, 1)) {  // row-major [K, N]: y = w^T x
      fn(kRowMajor, kTrans, K, N, 1.f, wp, static_cast<int>(ws0), xv, static_cast<int>(incx), 0.f, yp, 1);
    } else if (blas_ok && ws0 == 1 && ws1 >= std::max(K, 1)) {  // a transposed view of row-major [N, K]
      fn(kRowMajor, kNoTrans, N, K, 1.f, wp, static_cast<int>(ws1), xv, static_cast<int>(incx), 0.f, yp, 1);
    } else {  // any other view (broadcast or strided weights): plain loops
      for (int n = 0; n < N; ++n) yp[n] = 0.f;
      for (int k = 0; k < K; ++k) {
        const float xk = xv[k * incx];
        for (int n = 0; n < N; ++n) yp[n] += xk * wp[k * ws0 + n * ws1];
      }
    }
  }
};

}  // namespace

void* cpu_blas_symbol(const char* name) {
  // libmlx's own scope first (itself and its DT_NEEDED libraries: the BLAS behind its sgemm),
  // then the global scope. ORT loads the EP with RTLD_LOCAL, so the global one may not see it.
  Dl_info info{};
  void* sym = nullptr;
  if (dladdr(reinterpret_cast<void*>(&mx::cpu::get_command_encoder), &info) && info.dli_fname) {
    if (void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      sym = dlsym(h, name);
      dlclose(h);  // RTLD_NOLOAD took a reference on an already loaded library: give it back
    }
  }
  return sym ? sym : dlsym(RTLD_DEFAULT, name);
}

bool cpu_gemv_available() { return cpu_row_kernels_enabled() && sgemv() != nullptr; }

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

namespace {
thread_local bool row_kernels_on = true;
thread_local bool avx512_on = true;

}  // namespace

bool cpu_has_avx512f() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

bool cpu_row_kernels_enabled() { return row_kernels_on; }
bool cpu_avx512_kernels() { return avx512_on && cpu_has_avx512f(); }

RowKernelsScope::RowKernelsScope(bool on, bool avx512) : prev_(row_kernels_on), prev_avx512_(avx512_on) {
  row_kernels_on = on;
  avx512_on = avx512;
}
RowKernelsScope::~RowKernelsScope() {
  row_kernels_on = prev_;
  avx512_on = prev_avx512_;
}

std::optional<mx::array> cpu_row_gemv(const mx::array& x, const mx::array& w, mx::Stream s,
                                      bool small_products) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || !sgemv()) return std::nullopt;
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32 || w.ndim() < 2 || x.ndim() < 1)
    return std::nullopt;
  const int K = w.shape(-2), N = w.shape(-1);
  if (x.shape(-1) != K || K == 0 || N == 0) return std::nullopt;
  // BLAS takes int sizes and strides: leave anything near the limit to mx::matmul.
  if (static_cast<int64_t>(K) * N >= (int64_t{1} << 31)) return std::nullopt;
  mx::array xr = x.ndim() == 1 ? mx::expand_dims(x, 0, s) : x;
  if (xr.shape(-2) != 1) return std::nullopt;  // one row per batch element
  // Batch dims: numpy broadcasting of x's and w's leading dims, as views (no copies).
  mx::Shape xb(xr.shape().begin(), xr.shape().end() - 2), wb(w.shape().begin(), w.shape().end() - 2);
  mx::Shape batch;
  try {
    batch = mx::broadcast_shapes(xb, wb);
  } catch (const std::exception&) {
    return std::nullopt;  // mx::matmul reports the mismatch
  }
  if (w.ndim() == 2 && xr.ndim() > 2) {
    // A weight matrix under a batch of rows ([B, 1, K] x [K, N] is a decode step with B = 1):
    // fold the batch into rows only when there is one row in all.
    if (xr.size() != static_cast<size_t>(K)) return std::nullopt;
  }
  mx::Shape xs = batch, ws = batch;
  xs.insert(xs.end(), {1, K});
  ws.insert(ws.end(), {K, N});
  auto xv = mx::broadcast_to(xr, xs, s), wv = mx::broadcast_to(w, ws, s);
  mx::Shape out = batch;
  out.insert(out.end(), {1, N});
  mx::array y(std::move(out), mx::float32, std::make_shared<RowGemv>(s, small_products), {xv, wv});
  if (x.ndim() == 1) return mx::squeeze(y, 0, s);
  return y;
}

}  // namespace ortmlx::ops
