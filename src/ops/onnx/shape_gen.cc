// Ops that make new tensors from shapes, attributes or small scalars: Shape, Size, Cast,
// CastLike, Constant, ConstantOfShape, Range, EyeLike. Part of the shape family (shape.cc
// appends this table to its own).
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/common.h"
#include "ops/lowp.h"

namespace ortmlx::ops {

namespace {

int rank_of(const mx::array& a) { return static_cast<int>(a.ndim()); }

// An MLX array holding a copy of a constant tensor's bytes (any MLX dtype; ONNX and MLX share
// the element layouts, bool included).
mx::array const_array(const graph::ConstTensor& t) {
  auto dtype = mlx_dtype(t.dtype);
  auto shape = to_shape(t.shape);
  size_t nbytes = static_cast<size_t>(t.numel()) * dtype.size();
  if (t.nbytes < nbytes || (nbytes && !t.data))
    throw TranslateError("[constant] tensor data is shorter than its shape");
  auto data = mx::allocator::malloc(std::max<size_t>(nbytes, 1));
  if (nbytes) std::memcpy(data.buffer().raw_ptr(), t.data, nbytes);
  return mx::array(std::move(data), std::move(shape), dtype);
}

mx::array int64_vector(const std::vector<int64_t>& v) {
  return mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int64);
}

// ---- Shape, Size -------------------------------------------------------------------------------

// start/end (opset 15+) slice the dims like Python, clamped to [0, rank].
Outputs translate_shape(OpContext& c) {
  const auto& x = c.in(0);
  int64_t r = rank_of(x);
  auto clampi = [&](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + r : a, 0, r); };
  int64_t start = clampi(c.node.attr_int("start", 0));
  int64_t end = c.node.has_attr("end") ? clampi(c.node.attr_int("end", r)) : r;
  std::vector<int64_t> dims;
  for (int64_t k = start; k < end; ++k) dims.push_back(x.shape(static_cast<int>(k)));
  return {int64_vector(dims)};
}

Outputs translate_size(OpContext& c) {
  return {mx::array(static_cast<int64_t>(c.in(0).size()), mx::int64)};
}

// ---- Cast, CastLike ----------------------------------------------------------------------------

// MLX's astype is a C static_cast per element, which is what ONNX (and ORT) do: float -> int
// truncates toward zero, number -> bool is x != 0 (NaN -> true), bool -> number is 0/1.
// Out-of-range float -> int is undefined in ONNX too.
// float8/float4/int4/uint4/int2/uint2 on either side go through lowp::convert (bit-level codecs, rounding
// to nearest even; `saturate`, default 1, decides what out-of-range values become in float8).
Outputs translate_cast(OpContext& c) {
  auto to = static_cast<DType>(c.node.attr_int("to", 0));
  auto from = lowp::declared_in(c, 0);
  if (lowp::is_lowp(from) || lowp::is_lowp(to))
    return {lowp::convert(c.in(0), from, to, c.node.attr_int("saturate", 1) != 0, c.s,
                          c.node.attr_string("round_mode", "up"))};
  return {cast_to(c.in(0), to, c.s)};
}

Outputs translate_cast_like(OpContext& c) {
  const auto& x = c.in(0);
  auto from = lowp::declared_in(c, 0), to = lowp::declared_in(c, 1);
  if (lowp::is_lowp(from) || lowp::is_lowp(to))
    return {lowp::convert(x, from, to, c.node.attr_int("saturate", 1) != 0, c.s,
                          c.node.attr_string("round_mode", "up"))};
  auto d = c.in(1).dtype();
  return {x.dtype() == d ? x : mx::astype(x, d, c.s)};
}

Support check_target_dtype(DType t, bool gpu, const char* what) {
  if (!to_mlx_dtype(t)) return Support::no(std::string(what) + " " + graph::dtype_name(t) +
                                           " has no MLX dtype (float8e8m0/string)");
  if (gpu && t == DType::Float64) return Support::no(std::string(what) + " float64 on the GPU");
  return Support::yes();
}

// float8e8m0 results: the three rounding modes ONNX defines.
Support check_e8m0_round_mode(const NodeQuery& q, DType to) {
  if (to != DType::Float8E8M0) return Support::yes();
  auto mode = q.node.attr_string("round_mode", "up");
  if (mode != "up" && mode != "down" && mode != "nearest")
    return Support::no("unknown round_mode '" + mode + "'");
  return Support::yes();
}

Support check_cast(const NodeQuery& q) {
  auto to = static_cast<DType>(q.node.attr_int("to", 0));
  if (lowp::is_lowp(to)) return check_e8m0_round_mode(q, to);  // stored as bytes (lowp.h)
  return check_target_dtype(to, q.gpu, "Cast to");
}

Support check_cast_like(const NodeQuery& q) {
  auto t = q.input_dtype(1);  // unknown here: MLX has the dtype of whatever arrives
  if (t == DType::Undefined) return Support::yes();
  if (lowp::is_lowp(t)) return check_e8m0_round_mode(q, t);
  return check_target_dtype(t, q.gpu, "CastLike to");
}

// ---- Constant, ConstantOfShape -------------------------------------------------------------------

Outputs translate_constant(OpContext& c) {
  const auto& n = c.node;
  if (auto* a = n.attr("value"); a && a->t) return {const_array(*a->t)};
  if (n.has_attr("value_float")) return {mx::array(n.attr_float("value_float", 0.f), mx::float32)};
  if (n.has_attr("value_int")) return {mx::array(n.attr_int("value_int", 0), mx::int64)};
  if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    return {mx::array(v.begin(), {static_cast<int>(v.size())}, mx::float32)};
  }
  if (n.has_attr("value_ints")) return {int64_vector(n.attr_ints("value_ints"))};
  c.fail("no supported value attribute");
}

Support check_constant(const NodeQuery& q) {
  const auto& n = q.node;
  if (auto* a = n.attr("value")) {
    if (!a->t) return Support::no("Constant value is not a tensor");
    return check_target_dtype(a->t->dtype, q.gpu, "Constant of");
  }
  for (auto name : {"value_float", "value_int", "value_floats", "value_ints"})
    if (n.has_attr(name)) return Support::yes();
  return Support::no("Constant with sparse_value or strings is not supported");
}

// A tensor of `shape` (input 0, 1-D int64) filled with the one-element `value` attribute
// (default float32 0).
Outputs translate_constant_of_shape(OpContext& c) {
  auto shape = to_shape(c.host_ints(0));
  auto* a = c.node.attr("value");
  mx::array v = a && a->t ? mx::reshape(const_array(*a->t), {}, c.s) : mx::array(0.f);
  return {mx::full(std::move(shape), v, c.s)};
}

Support check_constant_of_shape(const NodeQuery& q) {
  if (auto* a = q.node.attr("value")) {
    if (!a->t || a->t->numel() != 1) return Support::no("value must be a one-element tensor");
    return check_target_dtype(a->t->dtype, q.gpu, "ConstantOfShape of");
  }
  return Support::yes();
}

// ---- Range, EyeLike ----------------------------------------------------------------------------

// The length max(ceil((limit - start) / delta), 0) depends on the input values, so they are read
// on the host; the values themselves are start + i * delta computed on the device.
Outputs translate_range(OpContext& c) {
  auto dtype = c.in(0).dtype();
  int64_t n = 0;
  mx::array idx = mx::array(0);
  if (mx::issubdtype(dtype, mx::integer)) {
    int64_t start = c.host_int(0), limit = c.host_int(1), delta = c.host_int(2);
    if (delta == 0) c.fail("delta is 0");
    int64_t diff = limit - start;
    if (delta > 0 && diff > 0) n = (diff + delta - 1) / delta;
    if (delta < 0 && diff < 0) n = (-diff + -delta - 1) / -delta;
    auto steps = mx::arange(0.0, static_cast<double>(n), 1.0, dtype, c.s);
    return {mx::add(mx::multiply(steps, c.in(2), c.s), c.in(0), c.s)};
  }
  double start = c.host_float(0), limit = c.host_float(1), delta = c.host_float(2);
  if (delta == 0) c.fail("delta is 0");
  // ORT subtracts in the input type, then divides in double: match it for float32.
  double diff = dtype == mx::float64 ? limit - start
                                     : static_cast<double>(static_cast<float>(limit) -
                                                           static_cast<float>(start));
  double len = std::ceil(diff / delta);
  if (!std::isfinite(len)) c.fail("the range length is not finite");
  n = len > 0 ? static_cast<int64_t>(len) : 0;
  if (n > INT32_MAX) c.fail("the range is longer than MLX's int32 dims");
  // fp16/bf16 (opset 27) accumulate in float32 (stash_type=1, the default).
  auto work = dtype == mx::float64 ? mx::float64 : mx::float32;
  auto steps = mx::arange(0.0, static_cast<double>(n), 1.0, work, c.s);
  auto y = mx::add(mx::multiply(steps, mx::astype(c.in(2), work, c.s), c.s),
                   mx::astype(c.in(0), work, c.s), c.s);
  return {y.dtype() == dtype ? y : mx::astype(y, dtype, c.s)};
}

Support check_range(const NodeQuery& q) {
  auto t = q.input_dtype(0);
  if ((t == DType::Float16 || t == DType::BFloat16) && q.node.attr_int("stash_type", 1) != 1)
    return Support::no("Range in half precision with stash_type != 1");
  return Support::yes();
}

// A 2-D tensor like the input with ones on diagonal k; dtype attribute or the input's dtype.
Outputs translate_eye_like(OpContext& c) {
  const auto& x = c.in(0);
  if (rank_of(x) != 2) c.fail("input must be 2-D");
  auto dtype = c.node.has_attr("dtype")
                   ? mlx_dtype(static_cast<DType>(c.node.attr_int("dtype", 1)))
                   : x.dtype();
  int rows = x.shape(0), cols = x.shape(1);
  int64_t k = std::clamp<int64_t>(c.node.attr_int("k", 0), -rows - 1, cols + 1);
  if (rows == 0 || cols == 0) return {mx::zeros({rows, cols}, dtype, c.s)};
  // col - row == k as a comparison, not mx::eye (a scatter, which MLX's CUDA backend lacks for
  // 64-bit types).
  auto diff = mx::subtract(mx::reshape(mx::arange(cols, mx::int32, c.s), {1, cols}, c.s),
                           mx::reshape(mx::arange(rows, mx::int32, c.s), {rows, 1}, c.s), c.s);
  return {mx::astype(mx::equal(diff, mx::array(static_cast<int>(k)), c.s), dtype, c.s)};
}

Support check_eye_like(const NodeQuery& q) {
  if (q.node.has_attr("dtype"))
    return check_target_dtype(static_cast<DType>(q.node.attr_int("dtype", 1)), q.gpu,
                              "EyeLike of");
  return Support::yes();
}

const OpEntry kOps[] = {
    {"", "Shape", 1, kAnyOpset, nullptr, translate_shape},
    {"", "Size", 1, kAnyOpset, nullptr, translate_size},
    {"", "Cast", 1, kAnyOpset, check_cast, translate_cast,
     "float8/float4e2m1/int4/uint4/int2/uint2 through bit-level codecs (RNE, saturate per "
     "ONNX's table; float8e8m0 by its round_mode); no string", /*lowp=*/true},
    {"", "CastLike", 15, kAnyOpset, check_cast_like, translate_cast_like,
     "as Cast; no string", /*lowp=*/true},
    {"", "Constant", 1, kAnyOpset, check_constant, translate_constant,
     "no sparse_value/value_string(s)"},
    {"", "ConstantOfShape", 9, kAnyOpset, check_constant_of_shape, translate_constant_of_shape},
    {"", "Range", 11, kAnyOpset, check_range, translate_range,
     "length is data-dependent: the inputs are read on the host"},
    {"", "EyeLike", 9, kAnyOpset, check_eye_like, translate_eye_like},
};

}  // namespace

std::span<const OpEntry> shape_gen_ops() { return kOps; }

}  // namespace ortmlx::ops
