// MLX's own Gather and float32 Matmul computed by the walking thread (kernels/cpu/kernels.h:
// cpu_mlx_primitive_on_caller), for the evaluation in one piece (engine/caller_eval.h).
//
// Why: a VAD step's pad and state reads are Gathers, its LSTM's products Matmuls; each one the
// walk cannot run leaves all that reads it to MLX's stream, a task at a time. Both compute what
// MLX's CPU kernels compute: a gather copies elements (negative indices counted from the end, as
// MLX does), and a product makes the very cblas_sgemm calls MLX's Matmul makes (same operands,
// transposes and leading dimensions), so the results are the same bits.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <cstring>
#include <vector>

#include <mlx/primitives.h>

#include "kernels/cpu/buffers.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {
namespace {

int64_t element_offset(int64_t elem, const mx::Shape& shape, const mx::Strides& strides) {
  int64_t loc = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0 && elem > 0; --d) {
    loc += (elem % shape[d]) * strides[d];
    elem /= shape[d];
  }
  return loc;
}

template <class Idx>
bool read_indices(const mx::array& ind, int64_t axis_size, std::vector<int64_t>& out) {
  std::vector<Idx> rows(ind.size());
  copy_row_major(ind, rows.data());
  out.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    int64_t v = static_cast<int64_t>(rows[i]);
    if (v < 0) v += axis_size;
    if (v < 0 || v >= axis_size) return false;  // MLX would read outside the source: not here
    out[i] = v;
  }
  return true;
}

bool gather(const mx::Gather& g, const std::vector<mx::array>& inputs, mx::array& out) {
  const auto [axes, slice_sizes] = g.state();
  const mx::array& src = inputs[0];
  if (inputs.size() != axes.size() + 1 || slice_sizes.size() != src.ndim()) return false;
  size_t slice = 1;
  for (auto s : slice_sizes) slice *= static_cast<size_t>(s);
  if (slice == 0 || out.size() % slice) return false;
  const size_t count = out.size() / slice;
  std::vector<std::vector<int64_t>> idx(axes.size());
  for (size_t k = 0; k < axes.size(); ++k) {
    const auto& ind = inputs[k + 1];
    if (ind.size() != count) return false;
    const int64_t n = src.shape(axes[k]);
    bool ok = false;
    switch (ind.dtype()) {
      case mx::int32: ok = read_indices<int32_t>(ind, n, idx[k]); break;
      case mx::int64: ok = read_indices<int64_t>(ind, n, idx[k]); break;
      case mx::uint32: ok = read_indices<uint32_t>(ind, n, idx[k]); break;
      default: return false;
    }
    if (!ok) return false;
  }
  allocate_output(out);
  const size_t item = src.itemsize();
  const char* sp = src.data<char>();
  char* dp = out.data<char>();
  // A slice of whole trailing rows of a row-contiguous source (an embedding's rows) is one run
  // of memory: copied at once, not element by element.
  bool runs = src.flags().row_contiguous;
  for (int d = static_cast<int>(src.ndim()) - 1, partial = 0; runs && d >= 0; --d) {
    if (partial && slice_sizes[d] != 1) runs = false;
    if (slice_sizes[d] != src.shape(d)) partial = 1;
  }
  for (size_t i = 0; i < count; ++i) {
    int64_t base = 0;
    for (size_t k = 0; k < axes.size(); ++k) base += idx[k][i] * src.strides()[axes[k]];
    if (runs) {
      std::memcpy(dp, sp + base * item, slice * item);
      dp += slice * item;
      continue;
    }
    for (size_t j = 0; j < slice; ++j, dp += item)
      std::memcpy(dp, sp + (base + element_offset(static_cast<int64_t>(j), slice_sizes, src.strides())) * item, item);
  }
  return true;
}

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// MLX's check_transpose: an operand read as it lies (maybe transposed), or a row-major copy.
struct Operand {
  const float* data;
  bool transposed;
  int ld;
  mx::Shape shape;
  mx::Strides strides;
  std::vector<float> copy;
};
void prepare(const mx::array& x, Operand& o) {
  const int nd = static_cast<int>(x.ndim());
  const int64_t sx = x.strides()[nd - 2], sy = x.strides()[nd - 1];
  if (sx == x.shape(-1) && sy == 1) {
    o = {x.data<float>(), false, static_cast<int>(sx), x.shape(), x.strides(), {}};
  } else if (sx == 1 && sy == x.shape(-2)) {
    o = {x.data<float>(), true, static_cast<int>(sy), x.shape(), x.strides(), {}};
  } else {
    o.copy.resize(x.size());
    copy_row_major(x, o.copy.data());
    mx::Strides rows(nd, 1);
    for (int d = nd - 2; d >= 0; --d) rows[d] = rows[d + 1] * x.shape(d + 1);
    o.data = o.copy.data();
    o.transposed = false;
    o.ld = x.shape(-1);
    o.shape = x.shape();
    o.strides = rows;
  }
}

bool matmul(const std::vector<mx::array>& inputs, mx::array& out) {
  static const auto sgemm = reinterpret_cast<Sgemm>(cpu_blas_symbol("cblas_sgemm"));
  const auto& a = inputs[0];
  const auto& b = inputs[1];
  if (!sgemm || inputs.size() != 2 || a.dtype() != mx::float32 || b.dtype() != mx::float32 ||
      out.dtype() != mx::float32 || a.ndim() < 2 || a.ndim() != b.ndim())
    return false;
  const int M = a.shape(-2), K = a.shape(-1), N = b.shape(-1);
  if (M == 0 || N == 0 || K == 0) return false;
  Operand oa, ob;
  prepare(a, oa);
  prepare(b, ob);
  allocate_output(out);
  float* y = out.data<float>();
  const size_t batches = a.size() / (static_cast<size_t>(M) * K);
  for (size_t i = 0; i < batches; ++i)
    sgemm(kRowMajor, oa.transposed ? kTrans : kNoTrans, ob.transposed ? kTrans : kNoTrans, M, N, K, 1.f,
          oa.data + element_offset(static_cast<int64_t>(M) * K * i, oa.shape, oa.strides), oa.ld,
          ob.data + element_offset(static_cast<int64_t>(K) * N * i, ob.shape, ob.strides), ob.ld, 0.f,
          y + static_cast<size_t>(M) * N * i, N);
  return true;
}


// y[i] = f(a[i], b[i]) over same-shape inputs of any layout.
template <class T, class Out, class F>
void map2(const mx::array& a, const mx::array& b, Out* y, F f) {
  std::vector<Stored<T>> sa, sb;
  const auto* pa = row_major(a, sa);
  const auto* pb = row_major(b, sb);
  for (size_t i = 0, n = a.size(); i < n; ++i) y[i] = f(static_cast<T>(pa[i]), static_cast<T>(pb[i]));
}

template <class T>
bool compare(std::string_view n, const mx::array& a, const mx::array& b, bool* y) {
  if (n == "Greater") map2<T>(a, b, y, [](T u, T v) { return u > v; });
  else if (n == "GreaterEqual") map2<T>(a, b, y, [](T u, T v) { return u >= v; });
  else if (n == "Less") map2<T>(a, b, y, [](T u, T v) { return u < v; });
  else if (n == "LessEqual") map2<T>(a, b, y, [](T u, T v) { return u <= v; });
  else if (n == "Equal") map2<T>(a, b, y, [](T u, T v) { return u == v; });
  else if (n == "NotEqual") map2<T>(a, b, y, [](T u, T v) { return u != v; });
  else return false;
  return true;
}

bool is_comparison(std::string_view n) {
  return n == "Greater" || n == "GreaterEqual" || n == "Less" || n == "LessEqual" || n == "Equal" || n == "NotEqual";
}

// Comparisons (to bool), logical and bitwise and/or of bools, Select: exact whatever the order.
bool boolean(std::string_view n, const std::vector<mx::array>& in, mx::array& out) {
  if (is_comparison(n) && in.size() == 2 && out.dtype() == mx::bool_ && in[0].dtype() == in[1].dtype()) {
    const auto t = in[0].dtype();
    if (t != mx::float32 && t != mx::int32 && t != mx::int64 && t != mx::bool_) return false;
    allocate_output(out);
    bool* y = out.data<bool>();
    if (t == mx::float32) return compare<float>(n, in[0], in[1], y);
    if (t == mx::int32) return compare<int32_t>(n, in[0], in[1], y);
    if (t == mx::int64) return compare<int64_t>(n, in[0], in[1], y);
    return compare<bool>(n, in[0], in[1], y);
  }
  const bool all_bool = out.dtype() == mx::bool_ && std::all_of(in.begin(), in.end(), [](const mx::array& x) { return x.dtype() == mx::bool_; });
  if (all_bool && in.size() == 2 && (n == "LogicalAnd" || n == "LogicalOr" || n == "BitwiseAnd" || n == "BitwiseOr")) {
    allocate_output(out);
    const bool conj = n == "LogicalAnd" || n == "BitwiseAnd";
    map2<bool>(in[0], in[1], out.data<bool>(), [conj](bool u, bool v) { return conj ? (u && v) : (u || v); });
    return true;
  }
  if (all_bool && in.size() == 1 && n == "LogicalNot") {
    allocate_output(out);
    std::vector<uint8_t> s;
    const uint8_t* p = row_major(in[0], s);
    bool* y = out.data<bool>();
    for (size_t i = 0; i < out.size(); ++i) y[i] = !p[i];
    return true;
  }
  if (n == "Select" && in.size() == 3 && in[0].dtype() == mx::bool_ && in[1].dtype() == out.dtype() &&
      in[2].dtype() == out.dtype() && (out.itemsize() == 4 || out.itemsize() == 8 || out.itemsize() == 1)) {
    allocate_output(out);
    const size_t item = out.itemsize();
    std::vector<uint8_t> sc;
    std::vector<char> s1(in[1].flags().row_contiguous ? 0 : in[1].nbytes()), s2(in[2].flags().row_contiguous ? 0 : in[2].nbytes());
    const uint8_t* c = row_major(in[0], sc);
    const char* a = in[1].flags().row_contiguous ? in[1].data<char>() : (copy_row_major(in[1], s1.data()), s1.data());
    const char* b = in[2].flags().row_contiguous ? in[2].data<char>() : (copy_row_major(in[2], s2.data()), s2.data());
    char* y = out.data<char>();
    for (size_t i = 0; i < out.size(); ++i) std::memcpy(y + i * item, (c[i] ? a : b) + i * item, item);
    return true;
  }
  return false;
}

// Integer and bool reductions (Sum, Prod, Min, Max, And, Or), whose results do not depend on
// the order of the operations, and float32 sums over one axis, each output's elements added in
// order from 0 as MLX's CPU reductions add them on x86 (one lane; over several axes MLX's order
// is its own); other float reductions stay MLX's.
template <class T>
void reduce_into(const mx::array& x, const std::vector<int>& axes, mx::Reduce::ReduceType type, T* y, size_t n_out) {
  T init{};
  switch (type) {
    case mx::Reduce::Sum: case mx::Reduce::Or: init = T(0); break;
    case mx::Reduce::Prod: case mx::Reduce::And: init = T(1); break;
    case mx::Reduce::Min: init = std::numeric_limits<T>::max(); break;
    case mx::Reduce::Max: init = std::numeric_limits<T>::lowest(); break;
  }
  std::fill(y, y + n_out, init);
  std::vector<Stored<T>> scratch;
  const auto* p = row_major(x, scratch);
  const int nd = static_cast<int>(x.ndim());
  if (axes.size() == 1 && type == mx::Reduce::Sum) {
    // One axis: [outer, len, inner], each output's elements still added in order (a row of
    // inner sums at a time, which the compiler vectorizes across the row).
    const int axis = axes[0] < 0 ? axes[0] + nd : axes[0];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape(d);
    for (int d = axis + 1; d < nd; ++d) inner *= x.shape(d);
    const int64_t len = x.shape(axis);
    for (int64_t o = 0; o < outer; ++o) {
      T* row = y + o * inner;
      for (int64_t k = 0; k < len; ++k) {
        const auto* in = p + (o * len + k) * inner;
        int64_t j = 0;
#ifdef ORTMLX_X86
        if constexpr (std::is_same_v<T, float>)  // (SSE: every x86-64 CPU; GCC's -O2 leaves it scalar)
          for (; j + 4 <= inner; j += 4) _mm_storeu_ps(row + j, _mm_add_ps(_mm_loadu_ps(row + j), _mm_loadu_ps(in + j)));
#endif
        for (; j < inner; ++j) row[j] = row[j] + static_cast<T>(in[j]);
      }
    }
    return;
  }
  std::vector<bool> reduced(nd, false);
  for (int a : axes) reduced[a < 0 ? a + nd : a] = true;
  std::vector<int64_t> out_stride(nd, 0);
  for (int d = nd - 1, st = 1; d >= 0; --d) {
    out_stride[d] = reduced[d] ? 0 : st;
    if (!reduced[d]) st *= x.shape(d);
  }
  std::vector<int> idx(nd, 0);
  int64_t o = 0;
  for (size_t i = 0, n = x.size(); i < n; ++i) {
    const T v = static_cast<T>(p[i]);
    T& r = y[o];
    switch (type) {
      case mx::Reduce::Sum: r = r + v; break;
      case mx::Reduce::Prod: r = r * v; break;
      case mx::Reduce::Min: r = v < r ? v : r; break;
      case mx::Reduce::Max: r = v > r ? v : r; break;
      case mx::Reduce::And: r = r && v; break;
      case mx::Reduce::Or: r = r || v; break;
    }
    for (int d = nd - 1; d >= 0; --d) {
      o += out_stride[d];
      if (++idx[d] < x.shape(d)) break;
      o -= out_stride[d] * x.shape(d);
      idx[d] = 0;
    }
  }
}

bool reduce(const mx::Reduce& r, const std::vector<mx::array>& in, mx::array& out) {
  const auto [type, axes] = r.state();
  const auto& x = in[0];
  if (in.size() != 1 || x.dtype() != out.dtype() || x.size() == 0 || out.ndim() != x.ndim()) return false;
  allocate_output(out);
  switch (x.dtype()) {
    case mx::int32: reduce_into(x, axes, type, out.data<int32_t>(), out.size()); return true;
    case mx::int64: reduce_into(x, axes, type, out.data<int64_t>(), out.size()); return true;
    case mx::bool_: reduce_into(x, axes, type, out.data<bool>(), out.size()); return true;
    case mx::float32: reduce_into(x, axes, type, out.data<float>(), out.size()); return true;
    default: return false;  // (out's data is dropped with it: MLX allocates again)
  }
}

}  // namespace

bool cpu_mlx_primitive_on_caller(mx::Primitive& p, const std::vector<mx::array>& inputs,
                                 std::vector<mx::array>& outputs) {
  if (outputs.size() != 1 || outputs[0].size() == 0) return false;
  const std::string_view name = p.name();
  if (name == "Gather") return gather(static_cast<const mx::Gather&>(p), inputs, outputs[0]);
  if (name == "Matmul") return matmul(inputs, outputs[0]);
  if (name == "Sum" || name == "Prod" || name == "Min" || name == "Max" || name == "And" || name == "Or") {
    const auto t = inputs[0].dtype();
    // A float32 sum added in MLX's order (on x86 its reductions take one element at a time).
    const bool float_sum = t == mx::float32 && name == "Sum" && static_cast<const mx::Reduce&>(p).state().second.size() == 1;
    if (t != mx::int32 && t != mx::int64 && t != mx::bool_ && !float_sum) return false;
    return reduce(static_cast<const mx::Reduce&>(p), inputs, outputs[0]);
  }
  if (boolean(name, inputs, outputs[0])) return true;
  return cpu_elementwise_on_caller(name, inputs, outputs[0]);
}

}  // namespace ortmlx::ops
