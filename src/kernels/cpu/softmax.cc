// The last-axis softmax of kernels/cpu/kernels.h (cpu_softmax_last_axis), and what the CPU
// kernels share: their pool (cpu_row_pool, cpu_parallel_for) and their inputs' row-major reads
// (RowMajorInput).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <exception>
#include <future>
#include <limits>
#include <stdexcept>
#include <thread>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>
#include <mlx/threadpool.h>

#include "kernels/cpu/dnnl_library.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// The kernels' workers: one fewer than the cores (the stream thread takes a share itself).
ThreadPool& cpu_row_pool() {
  static ThreadPool pool(std::max(2u, std::thread::hardware_concurrency()) - 1);
  return pool;
}

}  // namespace

int cpu_threads() {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

void cpu_parallel_split(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn) {
  parts = static_cast<int>(std::clamp<int64_t>(parts, 1, std::max<int64_t>(n, 1)));
  if (parts == 1) return fn(0, n);
  if (openmp_parallel_for(n, parts, fn)) return;
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::future<void>> done;
  for (int p = 1; p < parts; ++p) {
    const int64_t b = p * per, e = std::min(n, b + per);
    if (b < e) done.push_back(cpu_row_pool().enqueue([&fn, b, e] { fn(b, e); }));
  }
  // The pool's tasks hold `fn` by reference: wait for all of them before anything propagates.
  std::exception_ptr error;
  try {
    fn(0, std::min(n, per));
  } catch (...) {
    error = std::current_exception();
  }
  for (auto& f : done) {
    try {
      f.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

namespace {

// exp(x - m) / sum over one row, scalar: the reference semantics (also for non-finite maxima).
void softmax_row_scalar(const float* x, float* y, int n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  if (nan) m = std::numeric_limits<float>::quiet_NaN();
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (y[i] = std::exp(x[i] - m));
  for (int i = 0; i < n; ++i) y[i] /= sum;
}

#ifdef ORTMLX_X86
__attribute__((target("avx2,fma"))) void softmax_row_avx2(const float* x, float* y, int n) {
  __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int i = 0;
  for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vm);
  float m = lanes[0];
  for (int k = 1; k < 8; ++k) m = std::max(m, lanes[k]);
  for (; i < n; ++i) m = std::max(m, x[i]);
  if (!std::isfinite(m)) return softmax_row_scalar(x, y, n);  // -inf/+inf/NaN rows: as defined
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  bool nan = false;
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = nan || _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256 e = exp_avx2(_mm256_sub_ps(v, vmax));
    _mm256_storeu_ps(y + i, e);
    vs = _mm256_add_ps(vs, e);
  }
  if (nan) return softmax_row_scalar(x, y, n);  // max() skipped a NaN: let it propagate
  _mm256_store_ps(lanes, vs);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return softmax_row_scalar(x, y, n);
    sum += (y[i] = x[i] - m < -87.3f ? 0.f : std::exp(x[i] - m));
  }
  const __m256 inv = _mm256_set1_ps(1.f / sum);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), inv));
  for (; i < n; ++i) y[i] *= 1.f / sum;
}
#endif

using SoftmaxRow = void (*)(const float*, float*, int);

SoftmaxRow pick_softmax_row() {
#ifdef ORTMLX_X86
  if (cpu_has_avx2_fma()) return softmax_row_avx2;
#endif
  return softmax_row_scalar;
}

}  // namespace

void softmax_row(const float* x, float* y, int n) {
  static const SoftmaxRow row = pick_softmax_row();
  row(x, y, n);
}

namespace {

class RowSoftmax : public mx::UnaryPrimitive {
 public:
  explicit RowSoftmax(mx::Stream s) : mx::UnaryPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    begin_output(inputs, out, stream());
    const int n = x.shape(-1);
    const int64_t rows = n ? static_cast<int64_t>(x.size()) / n : 0;
    dispatch_task(stream(), [in = RowMajorInput(x), yp = out.data<float>(), n, rows] {
      static const SoftmaxRow row = pick_softmax_row();
      const float* xp = in.rows();
      auto run = [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) row(xp + r * n, yp + r * n, n);
      };
      const int parts = rows * n >= (int64_t{1} << 16) ? cpu_threads() : 1;
      cpu_parallel_for(rows, parts, run);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[RowSoftmax] runs on the CPU stream only");
  }
  const char* name() const override { return "RowSoftmax"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(RowSoftmax);
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

}  // namespace

RowMajorInput::RowMajorInput(const mx::array& x) : src_(x.data<char>()), item_(x.itemsize()) {
  if (x.flags().row_contiguous) return;
  scratch_ = std::make_shared<std::vector<char>>();
  shape_ = x.shape();
  strides_ = x.strides();
}

namespace {
template <class T>
void gather_rows(const T* src, const mx::Shape& shape, const mx::Strides& strides, T* dst) {
  const int nd = static_cast<int>(shape.size());
  int64_t total = 1;
  for (auto d : shape) total *= d;
  const int64_t inner = shape[nd - 1], step = strides[nd - 1];
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t done = 0; done < total; done += inner, dst += inner) {
    int64_t off = 0;
    for (int k = 0; k + 1 < nd; ++k) off += idx[k] * strides[k];
    const T* p = src + off;
    if (step == 1)
      std::memcpy(dst, p, static_cast<size_t>(inner) * sizeof(T));
    else
      for (int64_t j = 0; j < inner; ++j) dst[j] = p[j * step];
    for (int k = nd - 2; k >= 0; --k) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}
struct Bytes16 { char b[16]; };
}  // namespace

namespace {
void gather_bytes(const char* src, size_t item, const mx::Shape& shape, const mx::Strides& strides, void* dst) {
  switch (item) {
    case 1: gather_rows(reinterpret_cast<const uint8_t*>(src), shape, strides, static_cast<uint8_t*>(dst)); break;
    case 2: gather_rows(reinterpret_cast<const uint16_t*>(src), shape, strides, static_cast<uint16_t*>(dst)); break;
    case 4: gather_rows(reinterpret_cast<const uint32_t*>(src), shape, strides, static_cast<uint32_t*>(dst)); break;
    case 8: gather_rows(reinterpret_cast<const uint64_t*>(src), shape, strides, static_cast<uint64_t*>(dst)); break;
    case 16: gather_rows(reinterpret_cast<const Bytes16*>(src), shape, strides, static_cast<Bytes16*>(dst)); break;
    default: throw std::logic_error("[RowMajorInput] unsupported element size");
  }
}
}  // namespace

const void* RowMajorInput::bytes() const {
  if (!scratch_) return src_;
  auto& out = *scratch_;
  if (!out.empty()) return out.data();
  size_t total = item_;
  for (auto d : shape_) total *= static_cast<size_t>(d);
  out.resize(std::max<size_t>(total, 1));
  if (shape_.empty() || total == 0) return out.data();  // (a 0-d array is always row-contiguous)
  gather_bytes(src_, item_, shape_, strides_, out.data());
  return out.data();
}

void copy_row_major(const mx::array& x, void* dst) {
  if (x.size() == 0) return;
  if (x.flags().row_contiguous || x.ndim() == 0) {
    std::memcpy(dst, x.data<char>(), x.nbytes());
    return;
  }
  gather_bytes(x.data<char>(), x.itemsize(), x.shape(), x.strides(), dst);
}

std::optional<mx::array> cpu_softmax_last_axis(const mx::array& x, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 ||
      x.ndim() < 1 || x.size() == 0)
    return std::nullopt;
  return mx::array(x.shape(), mx::float32, std::make_shared<RowSoftmax>(s), {x});
}

}  // namespace ortmlx::ops
