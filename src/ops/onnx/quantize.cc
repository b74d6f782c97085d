// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.
//
// Arithmetic follows ORT's CPU kernels (MLAS), which are the reference: quantization divides in
// float32 (also for fp16/bf16 inputs), rounds half to even and saturates; dequantization computes
// float32((x - zero_point) * scale) and casts to the output type. int4/uint4 saturate like the
// 8/16-bit integers; float8 and float4e2m1 outputs are x / scale (+ zero point) in float32 encoded
// with round-to-nearest-even (lowp::encode; `saturate` applies to float8, float4 always
// saturates), and float8/float4 inputs are decoded exactly to float32. These types live in MLX as
// bytes (see lowp.h); int2/uint2 like int4/uint4.
#include <cmath>

#include "ops/common.h"
#include "ops/lowp.h"

namespace ortmlx::ops {

namespace {

struct QRange {
  float lo, hi;
};

std::optional<QRange> qrange(DType t) {
  switch (t) {
    case DType::UInt8: return QRange{0.f, 255.f};
    case DType::Int8: return QRange{-128.f, 127.f};
    case DType::UInt16: return QRange{0.f, 65535.f};
    case DType::Int16: return QRange{-32768.f, 32767.f};
    case DType::UInt4: return QRange{0.f, 15.f};
    case DType::Int4: return QRange{-8.f, 7.f};
    case DType::UInt2: return QRange{0.f, 3.f};
    case DType::Int2: return QRange{-2.f, 1.f};
    default: return std::nullopt;
  }
}

// Brings a scale or zero point into a shape that broadcasts against x, for the three layouts
// ONNX defines (decided, as ORT does, by the parameter's shape):
//   per tensor: a scalar or a 1-element 1-D tensor;
//   per axis:   1-D of length x.shape[axis];
//   blocked:    rank(x), equal to x.shape except ceil(D/block_size) on `axis`.
mx::array layout(const OpContext& c, const mx::array& p, const mx::array& x) {
  const int64_t block = c.node.attr_int("block_size", 0);
  if (p.size() == 1 && p.ndim() <= 1) {
    if (block > 0) c.fail("block_size must be 0 for per-tensor quantization");
    return mx::reshape(p, {}, c.s);
  }
  const int rank = static_cast<int>(x.ndim());
  const int axis = norm_axis(c.node.attr_int("axis", 1), rank);
  const int d = x.shape(axis);
  if (block <= 0) {
    if (p.ndim() != 1 || p.shape(0) != d)
      c.fail("per-axis scale/zero point must be 1-D of length " + std::to_string(d));
    mx::Shape shape(rank, 1);
    shape[axis] = d;
    return mx::reshape(p, shape, c.s);
  }
  if (static_cast<int>(p.ndim()) != rank) c.fail("blocked scale/zero point must have x's rank");
  for (int i = 0; i < rank; ++i) {
    const int64_t want = i == axis ? (d + block - 1) / block : x.shape(i);
    if (p.shape(i) != want)
      c.fail("blocked scale/zero point dim " + std::to_string(i) + " must be " + std::to_string(want));
  }
  // Repeat every entry block_size times along the axis and cut the tail of the last block.
  if (block > INT32_MAX) c.fail("block_size is too large");
  auto r = mx::repeat(p, static_cast<int>(block), axis, c.s);
  if (r.shape(axis) == d) return r;
  mx::Shape start(rank, 0), stop = r.shape();
  stop[axis] = d;
  return mx::slice(r, start, stop, c.s);
}

// ---- QuantizeLinear ------------------------------------------------------------------------

// The output type: y_zero_point's dtype, else the output_dtype attribute (opset 21+), else uint8.
DType quantize_out(const NodeQuery& q) {
  if (q.has_input(2)) return q.input_dtype(2);
  if (auto t = q.node.attr_int("output_dtype", 0)) return static_cast<DType>(t);
  return DType::UInt8;
}

Support check_quantize(const NodeQuery& q) {
  // int32 x (opsets 10-21 tie it to an int32 scale) has no reference kernel in ORT.
  if (auto r = input_dtype_in(q, 0, {DType::Float32, DType::Float16, DType::BFloat16}); !r) return r;
  // ORT divides in float32 for every input type, also where opset 23+ says the scale's type
  // (or `precision`) sets the division precision. Take the cases where x and the scale share a
  // type (so no x rounding to a narrower scale type is implied) and precision is unset/float32.
  DType st = q.input_dtype(1);
  if (st != DType::Undefined && q.input_dtype(0) != DType::Undefined && st != q.input_dtype(0))
    return Support::no("scale dtype differs from x (division precision)");
  if (auto p = q.node.attr_int("precision", 0); p && p != static_cast<int64_t>(DType::Float32))
    return Support::no("precision other than float32");
  DType out = quantize_out(q);
  if (out != DType::Undefined && !qrange(out) && !lowp::is_lowp_float(out))
    return Support::no(std::string("output type ") + graph::dtype_name(out));
  return Support::yes();
}

// y = saturate(round_half_even(x / scale) + zero_point), in float32. NaN maps to the lowest
// value, as MLAS's vector path does (a NaN cast to an integer is undefined in C++).
mx::array quantize(const mx::array& x, const mx::array& scale, const std::optional<mx::array>& zp,
                   QRange r, mx::Dtype out, mx::Stream s) {
  auto v = mx::round(mx::divide(mx::astype(x, mx::float32, s), mx::astype(scale, mx::float32, s), s),
                     0, s);
  if (zp) v = mx::add(v, mx::astype(*zp, mx::float32, s), s);
  v = mx::clip(v, mx::array(r.lo), mx::array(r.hi), s);
  v = mx::where(mx::isnan(v, s), mx::array(r.lo), v, s);
  return mx::astype(v, out, s);
}

Outputs translate_quantize(OpContext& c) {
  const auto& x = c.in(0);
  DType out = DType::UInt8;
  std::optional<mx::array> zp;
  if (c.has(2)) {
    out = lowp::declared_in(c, 2);  // int4/int2 are stored as int8: the declared type has the range
    zp = layout(c, c.in(2), x);
  } else if (auto t = c.node.attr_int("output_dtype", 0)) {
    out = static_cast<DType>(t);
  }
  auto scale = layout(c, c.in(1), x);
  if (lowp::is_lowp_float(out)) {
    // y = encode(x / scale + zero_point): the zero point is decoded to its float value (ONNX
    // requires it to be 0 for float8; the formula keeps float4's reference behaviour).
    auto v = mx::divide(mx::astype(x, mx::float32, c.s), mx::astype(scale, mx::float32, c.s), c.s);
    if (zp) v = mx::add(v, lowp::decode(*zp, out, c.s), c.s);
    return {lowp::encode(v, out, c.node.attr_int("saturate", 1) != 0, c.s)};
  }
  auto r = qrange(out);
  if (!r) c.fail(std::string("unsupported output type ") + graph::dtype_name(out));
  auto dtype = lowp::is_lowp(out) ? lowp::storage(out) : mlx_dtype(out);
  return {quantize(x, scale, zp, *r, dtype, c.s)};
}

// ---- DequantizeLinear ----------------------------------------------------------------------

// The output type: the output_dtype attribute (opset 23+), else the scale's dtype.
DType dequantize_out(const NodeQuery& q) {
  if (auto t = q.node.attr_int("output_dtype", 0)) return static_cast<DType>(t);
  return q.input_dtype(1);
}

Support check_dequantize(const NodeQuery& q) {
  if (auto r = input_dtype_in(q, 0, {DType::Int8, DType::UInt8, DType::Int16, DType::UInt16,
                                     DType::Int32, DType::Int4, DType::UInt4, DType::Int2,
                                     DType::UInt2},
                              {DType::Float8E4M3FN, DType::Float8E4M3FNUZ, DType::Float8E5M2,
                               DType::Float8E5M2FNUZ, DType::Float4E2M1});
      !r)
    return r;
  if (auto r = input_dtype_in(q, 1, {DType::Float32, DType::Float16, DType::BFloat16}); !r)
    return r;
  DType out = dequantize_out(q);
  if (out != DType::Undefined && !in_set(out, {DType::Float32, DType::Float16, DType::BFloat16}))
    return Support::no(std::string("output type ") + graph::dtype_name(out));
  return Support::yes();
}

Outputs translate_dequantize(OpContext& c) {
  const auto& x = c.in(0);
  DType out = c.in_dtype(1);
  if (auto t = c.node.attr_int("output_dtype", 0)) out = static_cast<DType>(t);
  auto scale = mx::astype(layout(c, c.in(1), x), mx::float32, c.s);
  if (auto xt = lowp::declared_in(c, 0); lowp::is_lowp_float(xt)) {
    // float8/float4: (decode(x) - decode(zero_point)) * scale, all exact up to the product.
    auto v = lowp::decode(x, xt, c.s);
    if (c.has(2)) v = mx::subtract(v, lowp::decode(layout(c, c.in(2), x), xt, c.s), c.s);
    return {cast_to(mx::multiply(v, scale, c.s), out, c.s)};
  }
  // (x - zp) in int32 is exact for every input type (4-/2-bit storage holds the values);
  // float32 of it rounds like ORT's static_cast<float> (only int32 inputs beyond 2^24 can round).
  auto v = mx::astype(x, mx::int32, c.s);
  if (c.has(2)) v = mx::subtract(v, mx::astype(layout(c, c.in(2), x), mx::int32, c.s), c.s);
  return {cast_to(mx::multiply(mx::astype(v, mx::float32, c.s), scale, c.s), out, c.s)};
}

// ---- DynamicQuantizeLinear -----------------------------------------------------------------

Support check_dynamic_quantize(const NodeQuery& q) {
  return input_dtype_in(q, 0, {DType::Float32});
}

// ORT's GetQuantizationParameter: the range is widened to include 0; scale = (max - min) / 255
// (1 when the range is empty, where the ONNX formula would divide by zero); zero point =
// round_half_even(clamp(-min / scale, 0, 255)).
Outputs translate_dynamic_quantize(OpContext& c) {
  const auto& x = c.in(0);
  const auto s = c.s;
  if (x.size() == 0)
    return {mx::zeros(x.shape(), mx::uint8, s), mx::array(1.f), mx::array(uint8_t{0})};
  auto zero = mx::array(0.f);
  auto lo = mx::minimum(mx::min(x, s), zero, s), hi = mx::maximum(mx::max(x, s), zero, s);
  auto scale = mx::where(mx::equal(hi, lo, s), mx::array(1.f),
                         mx::divide(mx::subtract(hi, lo, s), mx::array(255.f), s), s);
  auto zpf = mx::round(mx::clip(mx::negative(mx::divide(lo, scale, s), s), zero, mx::array(255.f), s),
                       0, s);
  auto y = quantize(x, scale, zpf, {0.f, 255.f}, mx::uint8, s);
  return {y, scale, mx::astype(zpf, mx::uint8, s)};
}

const OpEntry kOps[] = {
    {"", "QuantizeLinear", 10, kAnyOpset, check_quantize, translate_quantize,
     "x float32/fp16/bf16 with a scale of the same type, divided in float32 as ORT does; "
     "outputs int8/uint8/int16/uint16/int4/uint4/int2/uint2/float8/float4e2m1", /*lowp=*/true},
    {"", "DequantizeLinear", 10, kAnyOpset, check_dequantize, translate_dequantize,
     "inputs int8/uint8/int16/uint16/int32/int4/uint4/int2/uint2/float8/float4e2m1",
     /*lowp=*/true},
    {"", "DynamicQuantizeLinear", 11, kAnyOpset, check_dynamic_quantize,
     translate_dynamic_quantize},
};

}  // namespace

std::span<const OpEntry> quantize_ops() { return kOps; }

}  // namespace ortmlx::ops
