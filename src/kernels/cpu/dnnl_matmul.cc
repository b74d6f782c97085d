// The CPU device's float32 products of several rows through oneDNN's sgemm (kernels.h:
// cpu_dnnl_matmul), with the library loaded at run time (dnnl_library.h). Without oneDNN's
// headers at build time, or the library at run time, cpu_dnnl_matmul says no and the
// translators keep MLX's matmul.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

#include <atomic>

#ifdef ORTMLX_HAVE_DNNL

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/dnnl_library.h"

namespace ortmlx::ops {

namespace {

std::atomic<uint64_t> g_runs{0}, g_failures{0};

// How sgemm reads one row-major operand of `rows` x `cols` (each batch element's, or all rows
// taken flat): element (r, c) at p[r * ld + c] (trans 'N') or p[c * ld + r] (trans 'T'). A view
// that is neither (broadcast or strided rows, a batch of transposed rows taken flat) is gathered
// into a plain buffer first.
struct Operand {
  const float* p = nullptr;
  char trans = 'N';
  int64_t ld = 0;
  bool gather = false;
  mx::Shape shape;  // the view's, for the gather and the batch offsets
  mx::Strides strides;

  // The offset of batch element `idx` (the leading dims) once the operand is as sgemm reads it.
  int64_t offset(const std::vector<int64_t>& idx, int64_t rows, int64_t cols) const {
    int64_t off = 0, plain = rows * cols;
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      off += idx[d] * (gather ? plain : strides[d]);
      plain *= shape[d];
    }
    return off;
  }
};

// flat: all of a's rows as one matrix (a 2-D weight); else the last two dims, per batch element.
Operand describe(const mx::array& a, int64_t rows, int64_t cols, bool flat) {
  Operand o;
  o.p = a.data<float>();
  o.ld = cols;
  o.shape = a.shape();
  o.strides = a.strides();
  if (flat && a.flags().row_contiguous) return o;
  if (!flat || a.ndim() == 2) {
    const int64_t s0 = o.strides[a.ndim() - 2], s1 = o.strides[a.ndim() - 1];
    if ((cols == 1 || s1 == 1) && s0 >= std::max<int64_t>(cols, 1)) {
      o.ld = s0;
      return o;
    }
    if ((rows == 1 || s0 == 1) && s1 >= std::max<int64_t>(rows, 1)) {  // a transposed view
      o.trans = 'T';
      o.ld = s1;
      return o;
    }
  }
  o.gather = true;
  return o;
}

// The view's elements in row-major order into `dst`.
void gather(const Operand& o, float* dst) {
  const size_t nd = o.shape.size();
  const int64_t inner = o.shape.back(), step = o.strides.back();
  int64_t total = 1;
  for (auto d : o.shape) total *= d;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0; i < total; i += inner) {
    int64_t off = 0;
    for (size_t d = 0; d + 1 < nd; ++d) off += idx[d] * o.strides[d];
    for (int64_t j = 0; j < inner; ++j) dst[i + j] = o.p[off + j * step];
    for (int d = static_cast<int>(nd) - 2; d >= 0; --d) {  // next row
      if (++idx[d] < o.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// CBLAS's sgemm with its enums as ints (CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112).
using SgemmFn = void (*)(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);

// After oneDNN refused a product (counted): the same product through the BLAS MLX links, or,
// without one or past its int sizes, NaN in every output (never a plausible value).
void fall_back(const Operand& a, const float* ap, const Operand& b, const float* bp, float* yp, int64_t M,
               int64_t N, int64_t K) {
  static const auto sgemm = reinterpret_cast<SgemmFn>(cpu_blas_symbol("cblas_sgemm"));
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (sgemm && std::max({M, N, K, a.ld, b.ld}) <= kIntMax) {
    sgemm(101, a.trans == 'T' ? 112 : 111, b.trans == 'T' ? 112 : 111, static_cast<int>(M), static_cast<int>(N),
          static_cast<int>(K), 1.f, ap, static_cast<int>(a.ld), bp, static_cast<int>(b.ld), 0.f, yp,
          static_cast<int>(N));
    return;
  }
  std::fill(yp, yp + M * N, std::numeric_limits<float>::quiet_NaN());
}

// y [..., N] = x [..., K] @ w [K, N], x's rows taken flat, in one sgemm call on the stream
// thread (oneDNN splits it over its OpenMP threads); or, w with batch dims, y [B.., M, N] =
// x [B.., M, K] @ w [B.., K, N] (both broadcast to the batch by the builder), one call per batch
// element (attention's products).
class DnnlGemm : public mx::UnaryPrimitive {
 public:
  DnnlGemm(mx::Stream s, bool flat) : mx::UnaryPrimitive(s), flat_(flat) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    begin_output(inputs, out, stream());
    const int nd = static_cast<int>(w.ndim());
    const int64_t K = w.shape(nd - 2), N = w.shape(nd - 1);
    const int64_t M = flat_ ? static_cast<int64_t>(out.size()) / N : out.shape(-2);
    mx::Shape batch(w.shape().begin(), w.shape().end() - 2);
    // Pointers are captured raw: MLX's CPU eval keeps every input buffer alive until the
    // stream has run the dispatched task.
    dispatch_task(stream(), [a = describe(x, M, K, flat_), b = describe(w, K, N, flat_), yp = out.data<float>(), M, N, K,
                  batch = std::move(batch)] {
      // Gathered operands in buffers kept for the stream thread's next product.
      thread_local std::vector<float> buffers[2];
      int64_t count = 1;
      for (auto d : batch) count *= d;
      const float* ap = a.p;
      const float* bp = b.p;
      if (a.gather) {
        buffers[0].resize(static_cast<size_t>(count * M * K));
        gather(a, buffers[0].data());
        ap = buffers[0].data();
      }
      if (b.gather) {
        buffers[1].resize(static_cast<size_t>(count * K * N));
        gather(b, buffers[1].data());
        bp = buffers[1].data();
      }
      std::vector<int64_t> idx(batch.size(), 0);
      bool all = true;
      for (int64_t i = 0; i < count; ++i) {
        const float* ai = ap + a.offset(idx, M, K);
        const float* bi = bp + b.offset(idx, K, N);
        float* yi = yp + i * M * N;
        if (dnnl_lib().sgemm(a.trans, b.trans, M, N, K, 1.f, ai, a.ld, bi, b.ld, 0.f, yi, N) != dnnl_success) {
          g_failures.fetch_add(1, std::memory_order_relaxed);
          fall_back(a, ai, b, bi, yi, M, N, K);
          all = false;
        }
        for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {  // next batch index
          if (++idx[d] < batch[d]) break;
          idx[d] = 0;
        }
      }
      if (all) g_runs.fetch_add(1, std::memory_order_relaxed);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[DnnlGemm] runs on the CPU stream only");
  }
  const char* name() const override { return "DnnlGemm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(DnnlGemm) && static_cast<const DnnlGemm&>(other).flat_ == flat_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out.back() = inputs[1].shape(-1);
    return {out};
  }

 private:
  bool flat_;
};

}  // namespace

uint64_t cpu_dnnl_matmul_runs() { return g_runs.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_matmul_failures() { return g_failures.load(std::memory_order_relaxed); }

std::optional<mx::array> cpu_dnnl_matmul(const mx::array& x, const mx::array& w, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_dnnl_available()) return std::nullopt;
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32 || w.ndim() < 2 || x.ndim() < 2) return std::nullopt;
  const int K = w.shape(-2), N = w.shape(-1);
  if (x.shape(-1) != K || K == 0 || N == 0) return std::nullopt;
  if (w.ndim() == 2) {  // a matrix: all of x's rows at once
    if (x.size() / K < 2) return std::nullopt;
    mx::Shape out = x.shape();
    out.back() = N;
    return mx::array(std::move(out), mx::float32, std::make_shared<DnnlGemm>(s, true), {x, w});
  }
  // Batch dims: numpy broadcasting of x's and w's leading dims, as views (no copies).
  const int M = x.shape(-2);
  if (M < 2) return std::nullopt;  // one row per batch element: the gemv path's
  mx::Shape batch;
  try {
    batch = mx::broadcast_shapes(mx::Shape(x.shape().begin(), x.shape().end() - 2),
                                 mx::Shape(w.shape().begin(), w.shape().end() - 2));
  } catch (const std::exception&) {
    return std::nullopt;  // mx::matmul reports the mismatch
  }
  for (auto d : batch)
    if (d == 0) return std::nullopt;
  mx::Shape xs = batch, ws = batch, out = batch;
  xs.insert(xs.end(), {M, K});
  ws.insert(ws.end(), {K, N});
  out.insert(out.end(), {M, N});
  return mx::array(std::move(out), mx::float32, std::make_shared<DnnlGemm>(s, false),
                   {mx::broadcast_to(x, xs, s), mx::broadcast_to(w, ws, s)});
}

}  // namespace ortmlx::ops

#else  // no oneDNN headers at build time

namespace ortmlx::ops {

uint64_t cpu_dnnl_matmul_runs() { return 0; }
uint64_t cpu_dnnl_matmul_failures() { return 0; }
std::optional<mx::array> cpu_dnnl_matmul(const mx::array&, const mx::array&, mx::Stream) { return std::nullopt; }

}  // namespace ortmlx::ops

#endif
