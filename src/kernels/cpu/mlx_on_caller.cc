// MLX's own Gather and float32 Matmul computed by the walking thread (kernels/cpu/kernels.h:
// cpu_mlx_primitive_on_caller), for the evaluation in one piece (engine/caller_eval.h).
//
// Why: a VAD step's pad and state reads are Gathers, its LSTM's products Matmuls; each one the
// walk cannot run leaves all that reads it to MLX's stream, a task at a time. Both compute what
// MLX's CPU kernels compute: a gather copies elements (negative indices counted from the end, as
// MLX does), and a product makes the very cblas_sgemm calls MLX's Matmul makes (same operands,
// transposes and leading dimensions), so the results are the same bits.
#include <cstdint>
#include <cstring>
#include <vector>

#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"

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
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const size_t item = src.itemsize();
  const char* sp = src.data<char>();
  char* dp = out.data<char>();
  for (size_t i = 0; i < count; ++i) {
    int64_t base = 0;
    for (size_t k = 0; k < axes.size(); ++k) base += idx[k][i] * src.strides()[axes[k]];
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
  o.shape = x.shape();
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
  out.set_data(mx::allocator::malloc(out.nbytes()));
  float* y = out.data<float>();
  const size_t batches = a.size() / (static_cast<size_t>(M) * K);
  for (size_t i = 0; i < batches; ++i)
    sgemm(kRowMajor, oa.transposed ? kTrans : kNoTrans, ob.transposed ? kTrans : kNoTrans, M, N, K, 1.f,
          oa.data + element_offset(static_cast<int64_t>(M) * K * i, oa.shape, oa.strides), oa.ld,
          ob.data + element_offset(static_cast<int64_t>(K) * N * i, ob.shape, ob.strides), ob.ld, 0.f,
          y + static_cast<size_t>(M) * N * i, N);
  return true;
}

}  // namespace

bool cpu_mlx_primitive_on_caller(mx::Primitive& p, const std::vector<mx::array>& inputs,
                                 std::vector<mx::array>& outputs) {
  if (outputs.size() != 1 || outputs[0].size() == 0) return false;
  const std::string_view name = p.name();
  if (name == "Gather") return gather(static_cast<const mx::Gather&>(p), inputs, outputs[0]);
  if (name == "Matmul") return matmul(inputs, outputs[0]);
  return cpu_elementwise_on_caller(name, inputs, outputs[0]);
}

}  // namespace ortmlx::ops
