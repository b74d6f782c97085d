// Reductions (Reduce*), arg-reductions, TopK, cumulative ops and the softmax family.
//
// Where ONNX (and ORT, the reference the tests compare with) differs from MLX:
//  * an empty reduction (a reduced dim of size 0) has an identity value in ONNX; MLX's max/min/
//    logsumexp throw, so such reductions are filled explicitly;
//  * integer Reduce{Mean,L2,LogSum,LogSumExp} follow ORT's integer arithmetic (sum in T, then a
//    truncating division / sqrt / log), MLX's mean would return float;
//  * noop_with_empty_axes reduces over no axes: the per-element part still applies (ReduceL1 ->
//    |x|, ReduceSumSquare -> x^2, ReduceLogSum -> log x), as ORT does.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// ---------------------------------------------------------------------------------------------
// small helpers

bool is_int(const mx::array& a) { return mx::issubdtype(a.dtype(), mx::integer); }

// Lowest (or highest) value of a dtype: the identity of max (min); -inf/+inf for floats.
mx::array type_limit(mx::Dtype d, bool lowest) {
  if (d == mx::bool_) return mx::array(!lowest);
  if (mx::issubdtype(d, mx::floating))
    return mx::array(lowest ? -INFINITY : INFINITY, d);
  mx::iinfo info(d);
  if (lowest) return mx::array(info.min, d);
  return mx::array(info.max, d);
}

// x reversed along `axis` (a gather: MLX has no flip op).
mx::array reverse_axis(const mx::array& x, int axis, mx::Stream s) {
  int n = x.shape(axis);
  return mx::take(x, mx::arange(n - 1, -1, -1, s), axis, s);
}

// trunc(log(n)) for positive integers n, exactly: the number of k >= 1 with n >= ceil(e^k).
// Matches ORT's static_cast<T>(std::log(n)) without float64 (not available on GPUs).
mx::array trunc_log_int(const mx::array& n, mx::Stream s) {
  double hi = static_cast<double>(mx::iinfo(n.dtype()).max);
  std::vector<uint64_t> thr;  // uint64: e^44 fits only there
  for (int k = 1; std::ceil(std::exp(k)) < hi; ++k)
    thr.push_back(static_cast<uint64_t>(std::ceil(std::exp(k))));
  if (thr.empty()) return mx::zeros_like(n, s);
  auto t = mx::astype(mx::array(thr.data(), {static_cast<int>(thr.size())}, mx::uint64),
                      n.dtype(), s);
  auto ge = mx::greater_equal(mx::expand_dims(n, -1, s), t, s);
  return mx::astype(mx::sum(ge, -1, false, s), n.dtype(), s);
}

// Integer division truncating toward zero (C semantics) by a positive count.
mx::array trunc_div_int(const mx::array& a, int64_t n, mx::Stream s) {
  auto d = mx::array(n, a.dtype());
  auto q = mx::floor_divide(a, d, s);
  if (!mx::issubdtype(a.dtype(), mx::signedinteger)) return q;
  auto zero = mx::array(0, a.dtype());
  auto fix = mx::logical_and(mx::less(a, zero, s),
                             mx::not_equal(mx::remainder(a, d, s), zero, s), s);
  return mx::where(fix, mx::add(q, mx::array(1, a.dtype()), s), q, s);
}

// ---------------------------------------------------------------------------------------------
// Reduce*

enum class R { Sum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp };

// The opset from which `axes` is an optional input (before: an attribute).
int axes_input_opset(R k) { return k == R::Sum ? 13 : 18; }

// Per-element part of a reduction over no axes (noop_with_empty_axes, or a rank-0 input).
mx::array reduce_none(R k, const mx::array& x, mx::Stream s) {
  switch (k) {
    case R::SumSquare: return mx::multiply(x, x, s);
    case R::L1:
    case R::L2: return mx::abs(x, s);  // sqrt(x^2)
    case R::LogSum:
      if (is_int(x))
        return mx::where(mx::greater(x, mx::array(0, x.dtype()), s), trunc_log_int(x, s),
                         type_limit(x.dtype(), true), s);
      return mx::log(x, s);
    default: return x;  // sum, mean, max, min, prod, log(exp(x))
  }
}

// The value of a reduction over an empty set (what ORT produces; for integer LogSum/LogSumExp
// that is x86's conversion of -inf, i.e. the type's minimum).
mx::array reduce_identity(R k, mx::Dtype d) {
  switch (k) {
    case R::Max:
    case R::LogSum:
    case R::LogSumExp: return type_limit(d, true);
    case R::Min: return type_limit(d, false);
    case R::Prod: return mx::array(1, d);
    default: return mx::array(0, d);  // sum-like; ORT's mean of nothing is 0 too
  }
}

mx::array reduce_int(R k, const mx::array& x, const std::vector<int>& axes, bool keep,
                     int64_t count, mx::Stream s) {
  auto d = x.dtype();
  auto sum_as = [&](const mx::array& v) { return mx::astype(mx::sum(v, axes, keep, s), d, s); };
  switch (k) {
    case R::Sum: return sum_as(x);
    case R::Mean: return trunc_div_int(sum_as(x), count, s);
    case R::Max: return mx::max(x, axes, keep, s);
    case R::Min: return mx::min(x, axes, keep, s);
    case R::Prod: return mx::astype(mx::prod(x, axes, keep, s), d, s);
    case R::SumSquare: return sum_as(mx::multiply(x, x, s));
    case R::L1: return sum_as(mx::abs(x, s));
    case R::L2: {
      // ORT: static_cast<T>(std::sqrt(sum)) in double (the check keeps this off GPUs).
      auto ss = mx::astype(sum_as(mx::multiply(x, x, s)), mx::float64, s);
      return mx::astype(mx::sqrt(ss, s), d, s);
    }
    case R::LogSum: {
      auto sm = sum_as(x);
      return mx::where(mx::greater(sm, mx::array(0, d), s), trunc_log_int(sm, s),
                       type_limit(d, true), s);
    }
    case R::LogSumExp: {
      // ORT accumulates static_cast<T>(exp(x - max)) in T: 1 for each maximum, 0 otherwise;
      // the result is static_cast<T>(log(n) + max) for n maxima, a truncation toward zero of
      // the sum. In integers (no float64 on the GPU): log(n) lies strictly between
      // f = floor(log n) and f + 1 when n >= 2, so the sum truncates to max + f when it is
      // >= 0 and to max + f + 1 (toward zero) when max + f < 0; n == 1 gives max.
      auto m = mx::max(x, axes, true, s);
      auto cnt = mx::astype(mx::sum(mx::equal(x, m, s), axes, keep, s), d, s);
      if (!keep) m = mx::squeeze(m, axes, s);
      auto low = mx::add(m, trunc_log_int(cnt, s), s);
      auto toward_zero = mx::logical_and(mx::greater(cnt, mx::array(1, d), s),
                                         mx::less(low, mx::array(0, d), s), s);
      return mx::add(low, mx::astype(toward_zero, d, s), s);
    }
  }
  return x;
}

mx::array reduce_float(R k, const mx::array& x, const std::vector<int>& axes, bool keep,
                       mx::Stream s) {
  switch (k) {
    case R::Sum: return mx::sum(x, axes, keep, s);
    case R::Mean: return mx::mean(x, axes, keep, s);
    case R::Max: return mx::max(x, axes, keep, s);
    case R::Min: return mx::min(x, axes, keep, s);
    case R::Prod: return mx::prod(x, axes, keep, s);
    case R::SumSquare: return mx::sum(mx::square(x, s), axes, keep, s);
    case R::L1: return mx::sum(mx::abs(x, s), axes, keep, s);
    case R::L2: return mx::sqrt(mx::sum(mx::square(x, s), axes, keep, s), s);
    case R::LogSum: return mx::log(mx::sum(x, axes, keep, s), s);
    case R::LogSumExp: return logsumexp_precise(x, axes, keep, s);
  }
  return x;
}

// The reduced axes (sorted, unique); empty = reduce over nothing.
std::vector<int> reduce_axes(R k, OpContext& c, int rank) {
  std::vector<int64_t> raw;
  bool noop = false;
  if (c.node.since_version >= axes_input_opset(k)) {
    if (c.has(1)) raw = c.host_ints(1);
    noop = c.node.attr_int("noop_with_empty_axes", 0) != 0;
  } else {
    raw = c.node.attr_ints("axes");
  }
  std::vector<int> axes;
  if (raw.empty()) {
    if (noop) return {};
    for (int i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (auto a : raw) axes.push_back(norm_axis(a, rank, "axes"));
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());  // ORT accepts [1, -1]
  return axes;
}

template <R K>
Outputs translate_reduce(OpContext& c) {
  mx::array x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  const auto axes = rank == 0 ? std::vector<int>{} : reduce_axes(K, c, rank);
  const bool keep = c.node.attr_int("keepdims", 1) != 0;
  const auto dtype = x.dtype();
  if (axes.empty()) return {mx::astype(reduce_none(K, x, c.s), dtype, c.s)};

  int64_t count = 1;
  mx::Shape out_shape;
  for (int i = 0, j = 0; i < rank; ++i) {
    bool reduced = j < static_cast<int>(axes.size()) && axes[j] == i;
    if (reduced) {
      count *= x.shape(i);
      ++j;
      if (keep) out_shape.push_back(1);
    } else {
      out_shape.push_back(x.shape(i));
    }
  }
  // An empty reduction gives the identity; with an empty kept dim the output is empty too
  // (MLX's max/min/logsumexp reject empty arrays either way).
  if (x.size() == 0) return {mx::full(out_shape, reduce_identity(K, dtype), dtype, c.s)};

  if (is_int(x)) return {reduce_int(K, x, axes, keep, count, c.s)};
  if (dtype == mx::bool_) return {reduce_float(K, x, axes, keep, c.s)};  // Max/Min only
  // Half inputs compute in float32 on the CPU backend, so intermediates neither overflow nor
  // round in half precision; on GPUs only where x^2 could overflow fp16.
  bool half = dtype == mx::float16 || dtype == mx::bfloat16;
  bool up = K != R::Max && K != R::Min &&
            (compute_half_in_f32(x, c.s) || (half && (K == R::SumSquare || K == R::L2)));
  if (up) x = mx::astype(x, mx::float32, c.s);
  return {mx::astype(reduce_float(K, x, axes, keep, c.s), dtype, c.s)};
}

template <R K>
Support check_reduce(const NodeQuery& q) {
  DType t = q.input_dtype(0);
  if ((K == R::Max || K == R::Min) && t == DType::Bool) return Support::yes();
  if (auto ok = numeric_input(q, 0); !ok) return ok;
  if (auto ok = flag_attr_0_or_1(q, "keepdims"); !ok) return ok;
  if (auto ok = flag_attr_0_or_1(q, "noop_with_empty_axes"); !ok) return ok;
  if (K == R::L2 && q.gpu && graph::is_integer(t))
    return Support::no("integer ReduceL2 computes its sqrt in float64 (CPU only)");
  return Support::yes();
}

// ---------------------------------------------------------------------------------------------
// ArgMax / ArgMin

template <bool Max>
Outputs translate_arg(OpContext& c) {
  mx::array x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank == 0) c.fail("input must have rank >= 1");
  int axis = norm_axis(c.node.attr_int("axis", 0), rank);
  bool keep = c.node.attr_int("keepdims", 1) != 0;
  bool last = c.node.attr_int("select_last_index", 0) != 0;
  int n = x.shape(axis);
  if (n == 0) c.fail("cannot reduce over an empty axis");
  if (x.size() == 0) {  // an empty non-reduced dim: empty output (MLX rejects empty arrays)
    auto shape = x.shape();
    if (keep) shape[axis] = 1;
    else shape.erase(shape.begin() + axis);
    return {mx::zeros(shape, mx::int64, c.s)};
  }
  // MLX returns the first extremum (like ORT); the last one is the first of the reversed axis.
  if (last) x = reverse_axis(x, axis, c.s);
  auto idx = Max ? mx::argmax(x, axis, keep, c.s) : mx::argmin(x, axis, keep, c.s);
  idx = mx::astype(idx, mx::int64, c.s);
  if (last) idx = mx::subtract(mx::array(int64_t{n - 1}), idx, c.s);
  return {idx};
}

Support check_numeric(const NodeQuery& q) { return numeric_input(q, 0); }
Support check_arg(const NodeQuery& q) {
  if (auto ok = numeric_input(q, 0); !ok) return ok;
  return flag_attr_0_or_1(q, "keepdims");
}
Support check_float(const NodeQuery& q) { return float_input(q, 0); }

// ---------------------------------------------------------------------------------------------
// TopK

// Sorting keys whose ascending stable order is the wanted order: equal values keep their index
// order, so the lower index comes first, as ONNX and ORT require. NaN order is unspecified by
// ONNX (ORT's depends on its selection algorithm); MLX sorts NaN last.
mx::array descending_key(const mx::array& x, mx::Stream s) {
  if (mx::issubdtype(x.dtype(), mx::floating)) return mx::negative(x, s);
  return mx::bitwise_invert(x, s);  // order-reversing for signed and unsigned, no overflow
}

Outputs translate_topk(OpContext& c) {
  const mx::array& x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank == 0) c.fail("input must have rank >= 1");
  int axis = norm_axis(c.node.attr_int("axis", -1), rank);
  int64_t k = c.node.since_version >= 10 ? c.host_int(1) : c.node.attr_int("k", -1);
  int n = x.shape(axis);
  if (k < 0 || k > n)
    c.fail("k = " + std::to_string(k) + " is outside [0, " + std::to_string(n) + "]");
  // ORT tests largest == 1: any other value (2 included) asks for the smallest k.
  bool largest = c.node.since_version < 11 || c.node.attr_int("largest", 1) == 1;
  // `sorted = 0` leaves the order unspecified; sorted output is a valid answer.
  mx::array idx = mx::array(0);
  if (k == 1) {
    // First occurrence of the extremum, like the sorted path below.
    idx = largest ? mx::argmax(x, axis, true, c.s) : mx::argmin(x, axis, true, c.s);
  } else {
    idx = mx::argsort(largest ? descending_key(x, c.s) : x, axis, c.s);
    if (k < n) {
      mx::Shape start(rank, 0), stop = x.shape();
      stop[axis] = static_cast<int>(k);
      idx = mx::slice(idx, start, stop, c.s);
    }
  }
  auto values = mx::take_along_axis(x, idx, axis, c.s);
  return {values, mx::astype(idx, mx::int64, c.s)};
}

// ---------------------------------------------------------------------------------------------
// CumSum / CumProd

template <bool Prod>
Outputs translate_cumulative(OpContext& c) {
  mx::array x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank == 0) c.fail("input must have rank >= 1");
  int axis = norm_axis(c.host_int(1), rank);
  bool exclusive = c.node.attr_int("exclusive", 0) != 0;
  bool reverse = c.node.attr_int("reverse", 0) != 0;
  const auto dtype = x.dtype();
  if (x.size() == 0) return {x};
  // MLX's scan accumulates fp16 in fp16 (a running sum stalls at 2048): use float32.
  if (dtype == mx::float16 || dtype == mx::bfloat16) x = mx::astype(x, mx::float32, c.s);
  auto r = Prod ? mx::cumprod(x, axis, reverse, !exclusive, c.s)
                : mx::cumsum(x, axis, reverse, !exclusive, c.s);
  return {mx::astype(r, dtype, c.s)};  // MLX widens small ints; ONNX keeps T
}

Support check_cumulative(const NodeQuery& q) {
  if (!q.has_input(1)) return Support::no("axis input is missing");
  return numeric_input(q, 0);
}

// ---------------------------------------------------------------------------------------------
// Softmax / LogSoftmax / Hardmax

enum class Soft { Softmax, LogSoftmax, Hardmax };

template <Soft K>
Outputs translate_softmax(OpContext& c) {
  mx::array x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  const bool legacy = c.node.since_version < 13;
  int axis = norm_axis(c.node.attr_int("axis", legacy ? 1 : -1), rank);
  if (x.size() == 0) return {x};
  const auto shape = x.shape();
  const auto dtype = x.dtype();
  if (legacy) {
    // Opset < 13: coerce to 2-D [prod(dims[:axis]), prod(dims[axis:])], normalise each row.
    int64_t outer = 1;
    for (int i = 0; i < axis; ++i) outer *= shape[i];
    x = mx::reshape(x, {static_cast<int>(outer), static_cast<int>(x.size() / outer)}, c.s);
    axis = 1;
  }
  bool up = compute_half_in_f32(x, c.s);
  if (up) x = mx::astype(x, mx::float32, c.s);
  mx::array y = x;
  if constexpr (K == Soft::Softmax) {
    y = softmax_precise(x, axis, c.s);
  } else if constexpr (K == Soft::LogSoftmax) {
    y = mx::subtract(x, logsumexp_precise(x, {axis}, true, c.s), c.s);
  } else {
    // One-hot of the first maximum (ORT picks the first on ties).
    auto idx = mx::argmax(x, axis, true, c.s);
    mx::Shape ishape(x.ndim(), 1);
    ishape[axis] = x.shape(axis);
    auto pos = mx::reshape(mx::arange(x.shape(axis), mx::uint32, c.s), ishape, c.s);
    y = mx::astype(mx::equal(pos, idx, c.s), x.dtype(), c.s);
  }
  if (legacy) y = mx::reshape(y, shape, c.s);
  return {mx::astype(y, dtype, c.s)};
}

constexpr std::string_view kIntReduceNote =
    "integer Mean/L2/LogSum/LogSumExp follow ORT's integer arithmetic; an empty reduction gives "
    "the identity (max: lowest value, min: highest, logsum: -inf or the int minimum)";

const OpEntry kOps[] = {
    {"", "ReduceSum", 1, kAnyOpset, check_reduce<R::Sum>, translate_reduce<R::Sum>},
    {"", "ReduceMean", 1, kAnyOpset, check_reduce<R::Mean>, translate_reduce<R::Mean>,
     kIntReduceNote},
    {"", "ReduceMax", 1, kAnyOpset, check_reduce<R::Max>, translate_reduce<R::Max>},
    {"", "ReduceMin", 1, kAnyOpset, check_reduce<R::Min>, translate_reduce<R::Min>},
    {"", "ReduceProd", 1, kAnyOpset, check_reduce<R::Prod>, translate_reduce<R::Prod>},
    {"", "ReduceSumSquare", 1, kAnyOpset, check_reduce<R::SumSquare>,
     translate_reduce<R::SumSquare>},
    {"", "ReduceL1", 1, kAnyOpset, check_reduce<R::L1>, translate_reduce<R::L1>},
    {"", "ReduceL2", 1, kAnyOpset, check_reduce<R::L2>, translate_reduce<R::L2>,
     "integer inputs: CPU only (float64 sqrt, like ORT)"},
    {"", "ReduceLogSum", 1, kAnyOpset, check_reduce<R::LogSum>, translate_reduce<R::LogSum>,
     kIntReduceNote},
    {"", "ReduceLogSumExp", 1, kAnyOpset, check_reduce<R::LogSumExp>,
     translate_reduce<R::LogSumExp>, kIntReduceNote},
    {"", "ArgMax", 1, kAnyOpset, check_arg, translate_arg<true>},
    {"", "ArgMin", 1, kAnyOpset, check_arg, translate_arg<false>},
    {"", "TopK", 1, kAnyOpset, check_numeric, translate_topk,
     "ties: lower index first; NaN order unspecified (sorted last)"},
    {"", "CumSum", 11, kAnyOpset, check_cumulative, translate_cumulative<false>},
    {"", "CumProd", 26, kAnyOpset, check_cumulative, translate_cumulative<true>},
    {"", "Softmax", 1, kAnyOpset, check_float, translate_softmax<Soft::Softmax>},
    {"", "LogSoftmax", 1, kAnyOpset, check_float, translate_softmax<Soft::LogSoftmax>},
    {"", "Hardmax", 1, kAnyOpset, check_float, translate_softmax<Soft::Hardmax>},
};

}  // namespace

std::span<const OpEntry> reduce_ops() { return kOps; }

}  // namespace ortmlx::ops
