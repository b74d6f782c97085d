// Indexing ops: Gather, GatherElements, GatherND, Scatter/ScatterElements, ScatterND, Slice,
// OneHot, Compress, NonZero, ReverseSequence, Unique.
//
// Index safety: ONNX allows negative indices in [-n, n-1]; MLX's gather/scatter kernels wrap a
// negative index once too, but do not bounds-check. Out-of-range indices fail the run, as on
// ORT's CPU EP (OpContext::checked_indices); indices checked on the device are also clipped, so
// the kernels never read or write outside the buffer before the check's flag is read.
#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

int rank_of(const mx::array& a) { return static_cast<int>(a.ndim()); }

mx::array int32_vector(const std::vector<int32_t>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int32);
}

// An index ramp 0..n-1 laid along axis `axis` of a rank-`rank` shape (ones elsewhere).
mx::array ramp_on_axis(int n, int axis, int rank, mx::Stream s) {
  mx::Shape shape(rank, 1);
  shape[axis] = n;
  return mx::reshape(mx::arange(0, n, 1, s), shape, s);
}

Support index_dtype(const NodeQuery& q, size_t i) {
  return input_dtype_in(q, i, {DType::Int32, DType::Int64});
}

// ---- Gather family -----------------------------------------------------------------------------

Outputs translate_gather(OpContext& c) {
  const auto& x = c.in(0);
  const auto& idx = c.in(1);
  int axis = norm_axis(c.node.attr_int("axis", 0), rank_of(x));
  int n = x.shape(axis);
  if (n == 0) {
    if (idx.size() != 0) c.fail("indices into an empty axis");
    mx::Shape out(x.shape().begin(), x.shape().begin() + axis);
    out.insert(out.end(), idx.shape().begin(), idx.shape().end());
    out.insert(out.end(), x.shape().begin() + axis + 1, x.shape().end());
    return {mx::zeros(out, x.dtype(), c.s)};
  }
  return {mx::take(x, c.checked_indices(idx, {n}, true, "indices", 1), axis, c.s)};
}

Support check_gather(const NodeQuery& q) { return index_dtype(q, 1); }

// out[i][j][k] = x[idx[i][j][k]][j][k] (axis 0). The indices may be smaller than the data in the
// other dims, while MLX broadcasts them: slice the data to the indices' extent first.
Outputs translate_gather_elements(OpContext& c) {
  mx::array x = c.in(0);
  const auto& idx = c.in(1);
  int r = rank_of(x);
  if (rank_of(idx) != r) c.fail("indices rank differs from the data rank");
  int axis = norm_axis(c.node.attr_int("axis", 0), r);
  mx::Shape stop = x.shape();
  bool smaller = false;
  for (int k = 0; k < r; ++k) {
    if (k == axis) continue;
    if (idx.shape(k) > x.shape(k)) c.fail("indices are larger than the data off the axis");
    smaller |= idx.shape(k) < x.shape(k);
    stop[k] = idx.shape(k);
  }
  if (smaller) x = mx::slice(x, mx::Shape(r, 0), stop, c.s);
  if (idx.size() == 0) return {mx::zeros(idx.shape(), x.dtype(), c.s)};
  if (x.shape(axis) == 0) c.fail("indices into an empty axis");
  return {mx::take_along_axis(x, c.checked_indices(idx, {x.shape(axis)}, true, "indices", 1), axis, c.s)};
}

// indices [..., k] address the first k dims after `batch_dims` leading batch dims shared by data
// and indices. Output: indices.shape[:-1] + data.shape[b + k:]. The batch dims are flattened
// into one and addressed by a ramp, so one mx::gather does it all.
Outputs translate_gather_nd(OpContext& c) {
  const auto& x = c.in(0);
  const auto& idx = c.in(1);
  int b = static_cast<int>(c.node.attr_int("batch_dims", 0));
  int r = rank_of(x), q = rank_of(idx);
  if (q < 1 || b < 0 || b >= std::min(r, q)) c.fail("invalid batch_dims / ranks");
  int k = idx.shape(-1);
  if (k < 1 || b + k > r) c.fail("indices' last dim must be in [1, rank - batch_dims]");
  int64_t batch = 1;
  for (int d = 0; d < b; ++d) {
    if (x.shape(d) != idx.shape(d)) c.fail("batch dims of data and indices differ");
    batch *= x.shape(d);
  }
  mx::Shape out(idx.shape().begin(), idx.shape().end() - 1);
  out.insert(out.end(), x.shape().begin() + b + k, x.shape().end());
  if (idx.size() == 0 || x.size() == 0) {
    int64_t n = 1;
    for (auto d : out) n *= d;
    if (n != 0) c.fail("indices into an empty tensor");
    return {mx::zeros(out, x.dtype(), c.s)};
  }
  // data -> [batch, d_b .. d_{b+k-1}, rest...]; indices -> [batch, m, k]
  mx::Shape xs{static_cast<int>(batch)};
  xs.insert(xs.end(), x.shape().begin() + b, x.shape().end());
  auto data = mx::reshape(x, xs, c.s);
  std::vector<int64_t> dims(x.shape().begin() + b, x.shape().begin() + b + k);
  auto ind = mx::reshape(c.checked_indices(idx, dims, true, "indices", 1), {static_cast<int>(batch), -1, k}, c.s);
  std::vector<mx::array> indices{ramp_on_axis(static_cast<int>(batch), 0, 2, c.s)};
  std::vector<int> axes{0};
  mx::Shape slice(rank_of(data), 1);
  for (int j = 0; j < k; ++j) {
    indices.push_back(mx::take(ind, j, 2, c.s));
    axes.push_back(j + 1);
  }
  for (int d = k + 1; d < rank_of(data); ++d) slice[d] = data.shape(d);
  // gather -> [batch, m, 1 (batch), 1 x k, rest...]
  return {mx::reshape(mx::gather(data, indices, axes, slice, c.s), out, c.s)};
}

// ---- Scatter family ----------------------------------------------------------------------------

using ScatterFn = mx::array (*)(const mx::array&, const std::vector<mx::array>&, const mx::array&,
                                const std::vector<int>&, mx::StreamOrDevice);

ScatterFn scatter_fn(const std::string& reduction) {
  if (reduction == "add") return mx::scatter_add;
  if (reduction == "mul") return mx::scatter_prod;
  if (reduction == "max") return mx::scatter_max;
  if (reduction == "min") return mx::scatter_min;
  return mx::scatter;
}

Support check_scatter(const NodeQuery& q) {
  if (auto s = index_dtype(q, 1); !s) return s;
  // MLX's CUDA scatter rejects 64-bit data at run time ("does not yet support int64").
  const DType t = q.input_dtype(0);
  if (q.gpu && (t == DType::Int64 || t == DType::UInt64))
    return Support::no("scatter of 64-bit integers on the GPU (MLX's CUDA scatter has none)");
  auto red = q.node.attr_string("reduction", "none");
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min")
    return Support::no("reduction '" + red + "' is not supported");
  if (red != "none" && q.input_dtype(0) == DType::Bool)
    return Support::no("reductions on bool are not supported");
  return Support::yes();
}

// out[idx[i][j]][j] (op)= updates[i][j] for axis 0. Every dim gets an index array (the given
// indices on `axis`, ramps elsewhere) so one MLX scatter handles all reductions.
Outputs translate_scatter_elements(OpContext& c) {
  const auto& x = c.in(0);
  const auto& idx = c.in(1);
  const auto& upd = c.in(2);
  int r = rank_of(x);
  if (rank_of(idx) != r || upd.shape() != idx.shape())
    c.fail("indices and updates must have the data's rank and one shape");
  int axis = norm_axis(c.node.attr_int("axis", 0), r);
  for (int k = 0; k < r; ++k)
    if (k != axis && idx.shape(k) > x.shape(k)) c.fail("indices exceed the data off the axis");
  if (idx.size() == 0) return {x};
  if (x.shape(axis) == 0) c.fail("indices into an empty axis");
  std::vector<mx::array> indices;
  std::vector<int> axes(r);
  std::iota(axes.begin(), axes.end(), 0);
  const auto checked = c.checked_indices(idx, {x.shape(axis)}, true, "indices", 1);
  for (int k = 0; k < r; ++k)
    indices.push_back(k == axis ? checked
                                : ramp_on_axis(idx.shape(k), k, r, c.s));
  mx::Shape us = upd.shape();
  us.insert(us.end(), r, 1);
  auto u = mx::reshape(cast_to(upd, from_mlx_dtype(x.dtype()), c.s), us, c.s);
  return {scatter_fn(c.node.attr_string("reduction", "none"))(x, indices, u, axes, c.s)};
}

// indices [..., k] address the first k dims; updates = indices.shape[:-1] + data.shape[k:].
Outputs translate_scatter_nd(OpContext& c) {
  const auto& x = c.in(0);
  const auto& idx = c.in(1);
  const auto& upd = c.in(2);
  int r = rank_of(x), q = rank_of(idx);
  if (q < 1) c.fail("indices must have rank >= 1");
  int k = idx.shape(-1);
  if (k < 1 || k > r) c.fail("indices' last dim must be in [1, rank]");
  mx::Shape want(idx.shape().begin(), idx.shape().end() - 1);
  want.insert(want.end(), x.shape().begin() + k, x.shape().end());
  if (upd.shape() != want) c.fail("updates shape does not match indices and data");
  if (idx.size() == 0) return {x};
  std::vector<mx::array> indices;
  std::vector<int> axes;
  const auto checked = c.checked_indices(idx, std::vector<int64_t>(x.shape().begin(), x.shape().begin() + k),
                                         true, "indices", 1);
  for (int j = 0; j < k; ++j) {
    if (x.shape(j) == 0) c.fail("indices into an empty axis");
    indices.push_back(mx::take(checked, j, -1, c.s));
    axes.push_back(j);
  }
  // MLX wants updates = index shape + one slice of the data's full rank (size 1 on the k axes).
  mx::Shape us(idx.shape().begin(), idx.shape().end() - 1);
  us.insert(us.end(), k, 1);
  us.insert(us.end(), x.shape().begin() + k, x.shape().end());
  auto u = mx::reshape(cast_to(upd, from_mlx_dtype(x.dtype()), c.s), us, c.s);
  return {scatter_fn(c.node.attr_string("reduction", "none"))(x, indices, u, axes, c.s)};
}

// ---- Slice -------------------------------------------------------------------------------------

// starts/ends/axes/steps: attributes before opset 10, inputs after. Negative starts/ends count
// from the end; then they are clamped to [0, dim] (step > 0) or [-1, dim - 1] (step < 0), so
// INT64_MAX/INT64_MIN sentinels work. MLX slices with positive strides only (and reads a
// negative stop as "from the end"), so a negative step slices the same elements ascending and
// flips the axis.
Outputs translate_slice(OpContext& c) {
  mx::array x = c.in(0);
  const int r = rank_of(x);
  std::vector<int64_t> starts, ends, axes_in, steps;
  if (c.node.since_version < 10) {
    starts = c.node.attr_ints("starts");
    ends = c.node.attr_ints("ends");
    axes_in = c.node.attr_ints("axes");
  } else {
    starts = c.host_ints(1);
    ends = c.host_ints(2);
    if (c.has(3)) axes_in = c.host_ints(3);
    if (c.has(4)) steps = c.host_ints(4);
  }
  if (ends.size() != starts.size()) c.fail("starts and ends differ in length");
  if (axes_in.empty() && !(c.node.since_version >= 10 && c.has(3))) {
    axes_in.resize(starts.size());
    std::iota(axes_in.begin(), axes_in.end(), 0);
  }
  if (steps.empty() && !(c.node.since_version >= 10 && c.has(4))) steps.assign(starts.size(), 1);
  if (axes_in.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");

  mx::Shape lo(r, 0), hi = x.shape(), stride(r, 1);
  std::vector<int> flips;
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int a = norm_axis(axes_in[i], r);
    if (seen[a]) c.fail("duplicate axis");
    seen[a] = true;
    int64_t dim = x.shape(a), step = steps[i];
    if (step == 0) c.fail("step is 0");
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t len;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      len = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      len = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    if (len == 0) {
      lo[a] = hi[a] = 0;
      continue;
    }
    if (step > 0) {
      lo[a] = static_cast<int>(s);
      hi[a] = static_cast<int>(s + (len - 1) * step + 1);
      stride[a] = static_cast<int>(std::min<int64_t>(step, dim));
    } else {
      lo[a] = static_cast<int>(s + (len - 1) * step);
      hi[a] = static_cast<int>(s + 1);
      stride[a] = static_cast<int>(std::min<int64_t>(-step, dim));
      if (len > 1) flips.push_back(a);
    }
  }
  x = mx::slice(x, lo, hi, stride, c.s);
  if (!flips.empty()) x = mx::flip(x, flips, c.s);
  return {x};
}

Support check_slice(const NodeQuery& q) {
  if (q.node.since_version >= 10) {
    for (size_t i = 1; i < 5; ++i)
      if (auto s = index_dtype(q, i); !s) return s;
  }
  return Support::yes();
}

// ---- OneHot, Compress, NonZero -------------------------------------------------------------------

// out = values[1] where index == position on the new axis, values[0] elsewhere. Negative
// indices count from depth; out-of-range ones give an all-off row.
Outputs translate_one_hot(OpContext& c) {
  mx::array idx = c.in(0);
  const auto& values = c.in(2);
  int64_t depth = c.host_int(1);
  if (depth < 1 || depth > INT32_MAX) c.fail("depth must be in [1, 2^31)");
  if (values.size() != 2) c.fail("values must hold [off, on]");
  int out_rank = rank_of(idx) + 1;
  int axis = norm_axis(c.node.attr_int("axis", -1), out_rank);
  // Float indices are truncated like a C cast (what ORT does).
  idx = mx::astype(idx, mx::int64, c.s);
  idx = mx::where(mx::less(idx, mx::array(0, mx::int64), c.s),
                  mx::add(idx, mx::array(depth, mx::int64), c.s), idx, c.s);
  auto pos = mx::astype(ramp_on_axis(static_cast<int>(depth), axis, out_rank, c.s), mx::int64, c.s);
  auto hot = mx::equal(mx::expand_dims(idx, axis, c.s), pos, c.s);
  auto flat = mx::reshape(values, {2}, c.s);
  auto off = mx::reshape(mx::slice(flat, {0}, {1}, c.s), {}, c.s);
  auto on = mx::reshape(mx::slice(flat, {1}, {2}, c.s), {}, c.s);
  return {mx::where(hot, on, off, c.s)};
}

Support check_one_hot(const NodeQuery& q) {
  return input_dtype_in(q, 0, kFloat, kSignedInt, kUnsignedInt);
}

// The selected count depends on the condition's values: read on the host.
Outputs translate_compress(OpContext& c) {
  mx::array x = c.in(0);
  auto cond = c.host_ints(1);
  int axis = 0;
  if (c.node.has_attr("axis")) {
    axis = norm_axis(c.node.attr_int("axis", 0), rank_of(x));
  } else {
    x = mx::reshape(x, {-1}, c.s);
  }
  int64_t dim = x.shape(axis);
  std::vector<int32_t> keep;
  // Entries past the axis length are ignored (ORT does the same).
  for (int64_t i = 0; i < std::min<int64_t>(static_cast<int64_t>(cond.size()), dim); ++i)
    if (cond[i]) keep.push_back(static_cast<int32_t>(i));
  return {mx::take(x, int32_vector(keep), axis, c.s)};
}

Support check_compress(const NodeQuery& q) { return input_dtype_in(q, 1, {DType::Bool}); }

// Coordinates of the non-zero elements, [rank, count] in row-major order; the count depends on
// the data, so the input is read on the host (the program stays eager for large inputs).
Outputs translate_non_zero(OpContext& c) {
  const auto& x = c.in(0);
  auto v = c.host_floats(0);  // exact for zero-ness of every dtype (NaN counts as non-zero)
  // ORT treats a scalar as a 1-element vector: output [1, count].
  int r = std::max(rank_of(x), 1);
  std::vector<int64_t> nz;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0) nz.push_back(static_cast<int64_t>(i));
  std::vector<int64_t> out(static_cast<size_t>(r) * nz.size());
  for (size_t j = 0; j < nz.size(); ++j) {
    int64_t rem = nz[j];
    for (int d = r - 1; d >= 0; --d) {
      int64_t n = rank_of(x) == 0 ? 1 : x.shape(d);
      out[d * nz.size() + j] = rem % n;
      rem /= n;
    }
  }
  return {mx::array(out.begin(), {r, static_cast<int>(nz.size())}, mx::int64)};
}

// ---- ReverseSequence ---------------------------------------------------------------------------

// Reverses the first seq_len[b] steps of each batch entry along time_axis. One gather along the
// time axis with index t' = (t < len ? len - 1 - t : t), per batch entry.
Outputs translate_reverse_sequence(OpContext& c) {
  const auto& x = c.in(0);
  int r = rank_of(x);
  if (r < 2) c.fail("input rank must be at least 2");
  int ta = norm_axis(c.node.attr_int("time_axis", 0), r);
  int ba = norm_axis(c.node.attr_int("batch_axis", 1), r);
  if (ta == ba || ta > 1 || ba > 1) c.fail("time_axis and batch_axis must be 0 and 1");
  int T = x.shape(ta), B = x.shape(ba);
  if (c.in(1).size() != static_cast<size_t>(B)) c.fail("sequence_lens must have batch entries");
  if (T == 0 || B == 0) return {x};
  auto t = ramp_on_axis(T, ta, r, c.s);
  mx::Shape ls(r, 1);
  ls[ba] = B;
  // A length past the time axis is an error (ORT: "Invalid sequence length").
  auto len = mx::reshape(mx::astype(c.checked_indices(c.in(1), {T + 1}, false, "sequence_lens", 1),
                                    mx::int32, c.s), ls, c.s);
  auto src = mx::where(mx::less(t, len, c.s),
                       mx::subtract(mx::subtract(len, mx::array(1), c.s), t, c.s), t, c.s);
  return {mx::take_along_axis(x, src, ta, c.s)};
}

Support check_reverse_sequence(const NodeQuery& q) { return index_dtype(q, 1); }

// ---- Unique --------------------------------------------------------------------------------------

// Groups equal rows (slices along the axis, compared lexicographically) of host keys. Returns the
// first-occurrence row of each group in output order, each row's group position, and counts.
template <typename K>
void unique_rows(const std::vector<K>& v, int64_t outer, int64_t n, int64_t inner, bool sorted,
                 std::vector<int64_t>& first, std::vector<int64_t>& inverse,
                 std::vector<int64_t>& counts) {
  auto at = [&](int64_t row, int64_t j) { return v[((j / inner) * n + row) * inner + j % inner]; };
  const int64_t len = outer * inner;
  // A strict weak order even with NaN: NaNs are equal to each other and sort last (numpy).
  auto lt = [](K x, K y) {
    if constexpr (std::is_floating_point_v<K>) {
      if (std::isnan(x) || std::isnan(y)) return !std::isnan(x);
    }
    return x < y;
  };
  auto less = [&](int64_t a, int64_t b) {
    for (int64_t j = 0; j < len; ++j) {
      K x = at(a, j), y = at(b, j);
      if (lt(x, y)) return true;
      if (lt(y, x)) return false;
    }
    return false;
  };
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);  // equal rows keep index order
  std::vector<int64_t> group(n);
  std::vector<int64_t> group_first;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || less(order[k - 1], order[k])) group_first.push_back(order[k]);
    group[order[k]] = static_cast<int64_t>(group_first.size()) - 1;
  }
  // Output position of each group: sorted order, or order of first occurrence.
  std::vector<int64_t> pos(group_first.size());
  std::iota(pos.begin(), pos.end(), 0);
  if (!sorted) {
    std::vector<int64_t> by_first(group_first.size());
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(),
              [&](int64_t a, int64_t b) { return group_first[a] < group_first[b]; });
    for (size_t k = 0; k < by_first.size(); ++k) pos[by_first[k]] = static_cast<int64_t>(k);
  }
  first.assign(group_first.size(), 0);
  counts.assign(group_first.size(), 0);
  for (size_t g = 0; g < group_first.size(); ++g) first[pos[g]] = group_first[g];
  inverse.resize(n);
  for (int64_t r = 0; r < n; ++r) {
    inverse[r] = pos[group[r]];
    ++counts[inverse[r]];
  }
}

// Unique values (or slices along `axis`) with first indices, inverse indices and counts. The
// result size depends on the data, so the input is read on the host (exactly: integers as int64,
// uint64 with its order kept, floats as double); Y is a gather of the input.
Outputs translate_unique(OpContext& c) {
  mx::array x = c.in(0);
  bool sorted = c.node.attr_int("sorted", 1) != 0;
  int axis = 0;
  if (c.node.has_attr("axis")) {
    axis = norm_axis(c.node.attr_int("axis", 0), rank_of(x));
  } else {
    x = mx::reshape(x, {-1}, c.s);
  }
  const int64_t n = x.shape(axis);
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < rank_of(x); ++k)
    if (k < axis) outer *= x.shape(k);
    else if (k > axis) inner *= x.shape(k);
  std::vector<int64_t> first, inverse, counts;
  if (mx::issubdtype(x.dtype(), mx::floating)) {
    unique_rows(c.host_floats(0), outer, n, inner, sorted, first, inverse, counts);
  } else {
    auto v = c.host_ints(0);
    if (x.dtype() == mx::uint64)  // flip the sign bit: signed order == unsigned order
      for (auto& e : v) e ^= INT64_MIN;
    unique_rows(v, outer, n, inner, sorted, first, inverse, counts);
  }
  auto vec = [](const std::vector<int64_t>& v) {
    return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int64);
  };
  auto idx = vec(first);
  return {mx::take(x, idx, axis, c.s), idx, vec(inverse), vec(counts)};
}

const OpEntry kOps[] = {
    {"", "Gather", 1, kAnyOpset, check_gather, translate_gather,
     "out-of-range indices fail the run"},
    {"", "GatherElements", 11, kAnyOpset, check_gather, translate_gather_elements,
     "out-of-range indices fail the run"},
    {"", "GatherND", 11, kAnyOpset, check_gather, translate_gather_nd,
     "out-of-range indices fail the run"},
    {"", "Scatter", 9, 10, check_scatter, translate_scatter_elements},
    {"", "ScatterElements", 11, kAnyOpset, check_scatter, translate_scatter_elements,
     "out-of-range indices fail the run; duplicate indices with reduction=none "
     "pick an unspecified update (as in ONNX)"},
    {"", "ScatterND", 11, kAnyOpset, check_scatter, translate_scatter_nd,
     "out-of-range indices fail the run"},
    {"", "Slice", 1, kAnyOpset, check_slice, translate_slice},
    {"", "OneHot", 9, kAnyOpset, check_one_hot, translate_one_hot},
    {"", "Compress", 9, kAnyOpset, check_compress, translate_compress,
     "data-dependent: the condition is read on the host"},
    {"", "NonZero", 9, kAnyOpset, nullptr, translate_non_zero,
     "data-dependent: the input is read on the host"},
    {"", "ReverseSequence", 10, kAnyOpset, check_reverse_sequence, translate_reverse_sequence},
    {"", "Unique", 11, kAnyOpset, nullptr, translate_unique,
     "data-dependent: the input is read on the host; NaNs are one value sorted last (numpy), "
     "where ORT's CPU EP merges everything into a NaN"},
};

}  // namespace

std::span<const OpEntry> index_ops() { return kOps; }

}  // namespace ortmlx::ops
