// Low precision types (see lowp.h): the float8/float4 codecs as MLX bit operations, the int4/uint4
// narrowing, Cast's conversion routing, the ABI pack/unpack, and BitCast.
#include "ops/lowp.h"

#include <cmath>
#include <optional>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "ops/common.h"

namespace ortmlx::ops::lowp {

namespace {

// What happens at the edges of a float format.
enum class Kind {
  FN,    // e4m3fn: no Inf; NaN is S.1111.111; -0 exists
  FNUZ,  // e4m3fnuz, e5m2fnuz: no Inf, no -0; the one NaN is 0x80 (the "negative zero" code)
  IEEE,  // e5m2: Inf is S.11111.00, NaN S.11111.xx (xx != 0), like IEEE half precision
  None,  // e2m1: no Inf, no NaN; always saturates
};

struct Format {
  uint32_t e, m;     // exponent and mantissa bits (the sign bit sits just above them)
  uint32_t bias;
  uint32_t max_mag;  // magnitude code (sign excluded) of the largest finite value
  Kind kind;
};

Format format_of(DType t) {
  switch (t) {
    case DType::Float8E4M3FN: return {4, 3, 7, 0x7E, Kind::FN};       // max 448
    case DType::Float8E4M3FNUZ: return {4, 3, 8, 0x7F, Kind::FNUZ};   // max 240
    case DType::Float8E5M2: return {5, 2, 15, 0x7B, Kind::IEEE};      // max 57344
    case DType::Float8E5M2FNUZ: return {5, 2, 16, 0x7F, Kind::FNUZ};  // max 57344
    case DType::Float4E2M1: return {2, 1, 1, 0x7, Kind::None};        // max 6
    default:
      throw std::invalid_argument(std::string("[lowp] not a float8/float4 type: ") +
                                  graph::dtype_name(t));
  }
}

mx::array u32(uint32_t v) { return mx::array(v, mx::uint32); }

// float64 -> float32 rounded to odd: truncate toward zero, then set the last bit when the
// conversion was inexact. A value rounded to odd with 2+ more bits than the target format and
// then rounded to nearest-even gives the same result as one direct rounding, so float64 ->
// float8/float4 through float32 rounds once, as a direct conversion would (float32 has 24
// significant bits, float8 at most 4).
mx::array f64_to_f32_odd(const mx::array& x, mx::Stream s) {
  auto y = mx::astype(x, mx::float32, s);  // round to nearest even
  auto yd = mx::astype(y, mx::float64, s);
  auto bits = mx::view(y, mx::uint32, s);
  // |y| > |x|: step the magnitude one ulp back toward zero (bits - 1; Inf becomes FLT_MAX).
  bits = mx::where(mx::greater(mx::abs(yd, s), mx::abs(x, s), s),
                   mx::subtract(bits, u32(1), s), bits, s);
  auto inexact = mx::logical_and(mx::not_equal(yd, x, s), mx::logical_not(mx::isnan(x, s), s), s);
  bits = mx::where(inexact, mx::bitwise_or(bits, u32(1), s), bits, s);
  return mx::view(bits, mx::float32, s);
}

}  // namespace

bool is_lowp_float(DType t) {
  return t == DType::Float8E4M3FN || t == DType::Float8E4M3FNUZ || t == DType::Float8E5M2 ||
         t == DType::Float8E5M2FNUZ || t == DType::Float4E2M1;
}
bool is_lowp_int(DType t) {
  return t == DType::Int4 || t == DType::UInt4 || t == DType::Int2 || t == DType::UInt2;
}
bool is_lowp(DType t) { return is_lowp_float(t) || is_lowp_int(t) || t == DType::Float8E8M0; }
int bits(DType t) {
  if (t == DType::Int2 || t == DType::UInt2) return 2;
  if (t == DType::Int4 || t == DType::UInt4 || t == DType::Float4E2M1) return 4;
  return 8;
}

mx::Dtype storage(DType t) {
  if (!is_lowp(t))
    throw std::invalid_argument(std::string("[lowp] not a low precision type: ") +
                                graph::dtype_name(t));
  return t == DType::Int4 || t == DType::Int2 ? mx::int8 : mx::uint8;
}

// Code -> float32 bits, field by field: a normal code (exponent field e != 0) is
// 2^(e - bias) * 1.m, so its float32 has exponent e - bias + 127 and the mantissa bits moved to
// the top; a subnormal (e == 0) is m * 2^(1 - bias - M), exact as a float32 product.
mx::array decode(const mx::array& codes, DType t, mx::Stream s) {
  const Format f = format_of(t);
  auto c = mx::astype(codes, mx::uint32, s);
  auto sign = mx::bitwise_and(mx::right_shift(c, u32(f.e + f.m), s), u32(1), s);
  auto mag = mx::bitwise_and(c, u32((1u << (f.e + f.m)) - 1), s);
  auto e = mx::right_shift(mag, u32(f.m), s);
  auto m = mx::bitwise_and(mag, u32((1u << f.m) - 1), s);
  auto normal = mx::bitwise_or(mx::left_shift(mx::add(e, u32(127 - f.bias), s), u32(23), s),
                               mx::left_shift(m, u32(23 - f.m), s), s);
  auto unit = std::ldexp(1.0f, 1 - static_cast<int>(f.bias) - static_cast<int>(f.m));
  auto subnormal = mx::view(mx::multiply(mx::astype(m, mx::float32, s), mx::array(unit), s),
                            mx::uint32, s);
  auto sign_bit = mx::left_shift(sign, u32(31), s);
  auto bits = mx::bitwise_or(mx::where(mx::equal(e, u32(0), s), subnormal, normal, s), sign_bit, s);
  auto nan = mx::bitwise_or(u32(0x7FC00000), sign_bit, s);
  switch (f.kind) {
    case Kind::FN:
      bits = mx::where(mx::equal(mag, u32(f.max_mag + 1), s), nan, bits, s);
      break;
    case Kind::FNUZ:
      bits = mx::where(mx::equal(c, u32(0x80), s), u32(0x7FC00000), bits, s);
      break;
    case Kind::IEEE: {
      auto inf = mx::bitwise_or(u32(0x7F800000), sign_bit, s);
      bits = mx::where(mx::equal(e, u32((1u << f.e) - 1), s),
                       mx::where(mx::equal(m, u32(0), s), inf, nan, s), bits, s);
      break;
    }
    case Kind::None: break;
  }
  return mx::view(bits, mx::float32, s);
}

// float32 -> code. With the float32 fields (biased exponent e32, mantissa m32, and the implicit
// bit giving mm = 1.m32 * 2^23 for normals), the target's biased exponent is
// e8 = e32 - 127 + bias. Kept unsigned as t = e32 + bias (e8 >= 1 iff t >= 128):
//   normal (e8 >= 1):  code = ((e8 - 1) << M) + (mm >> (23 - M))     (the implicit bit of mm
//                      lands on the exponent field, adding the missing 1)
//   subnormal (e8 < 1): code = mm >> (23 - M + 1 - e8)                 (value / 2^(1-bias-M))
// and the shifted-out bits decide round-to-nearest-even. A carry out of the mantissa moves to
// the next exponent (or from the largest subnormal to the smallest normal) by itself, and a
// magnitude past max_mag is the overflow case. float32 subnormals (e32 == 0) are read with
// exponent 1 and no implicit bit; they are far below any float8 subnormal and round to zero.
mx::array encode(const mx::array& x, DType t, bool saturate, mx::Stream s) {
  const Format f = format_of(t);
  auto xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, s);
  auto b = mx::view(xf, mx::uint32, s);
  auto sign = mx::right_shift(b, u32(31), s);
  auto a = mx::bitwise_and(b, u32(0x7FFFFFFF), s);
  auto e32 = mx::right_shift(a, u32(23), s);
  auto m32 = mx::bitwise_and(a, u32(0x7FFFFF), s);
  auto mm = mx::where(mx::greater(e32, u32(0), s), mx::bitwise_or(m32, u32(0x800000), s), m32, s);
  auto tt = mx::add(mx::maximum(e32, u32(1), s), u32(f.bias), s);
  auto sub = mx::less(tt, u32(128), s);
  // (Both branches of a where are computed; the unsigned wrap-around of the unused one is
  // harmless.)
  auto base = mx::where(sub, u32(0), mx::left_shift(mx::subtract(tt, u32(128), s), u32(f.m), s), s);
  auto shift = mx::where(sub, mx::subtract(u32(23 - f.m + 128), tt, s), u32(23 - f.m), s);
  shift = mx::minimum(shift, u32(31), s);  // mm < 2^24: any shift >= 25 rounds to 0 the same way
  auto q = mx::right_shift(mm, shift, s);
  auto rem = mx::bitwise_and(mm, mx::subtract(mx::left_shift(u32(1), shift, s), u32(1), s), s);
  auto half = mx::left_shift(u32(1), mx::subtract(shift, u32(1), s), s);
  auto odd = mx::equal(mx::bitwise_and(q, u32(1), s), u32(1), s);
  auto up = mx::logical_or(mx::greater(rem, half, s),
                           mx::logical_and(mx::equal(rem, half, s), odd, s), s);
  auto mag = mx::add(mx::add(base, q, s), mx::astype(up, mx::uint32, s), s);

  auto is_nan = mx::greater(a, u32(0x7F800000), s);
  auto over = mx::greater(mag, u32(f.max_mag), s);  // Inf lands here too (e32 = 255)
  const bool sat = saturate || f.kind == Kind::None;
  // Not saturating: e5m2 overflows to Inf (0x7C); e4m3fn to its NaN (0x7F); FNUZ: below.
  uint32_t over_mag = sat ? f.max_mag : (f.kind == Kind::IEEE ? 0x7C : f.max_mag + 1);
  mag = mx::where(over, u32(over_mag), mag, s);
  auto sign_code = mx::left_shift(sign, u32(f.e + f.m), s);
  auto code = mx::bitwise_or(sign_code, mag, s);
  switch (f.kind) {
    case Kind::FN:  // NaN keeps its sign: S.1111.111
      code = mx::where(is_nan, mx::bitwise_or(sign_code, u32(0x7F), s), code, s);
      break;
    case Kind::IEEE:  // S.11111.10, the code ONNX's reference (ml_dtypes) produces
      code = mx::where(is_nan, mx::bitwise_or(sign_code, u32(0x7E), s), code, s);
      break;
    case Kind::FNUZ: {
      code = mx::where(mx::equal(mag, u32(0), s), u32(0), code, s);  // -0 -> 0
      auto bad = sat ? is_nan : mx::logical_or(is_nan, over, s);
      code = mx::where(bad, u32(0x80), code, s);
      break;
    }
    case Kind::None:
      // e2m1 has no NaN. ONNX's float4 page says NaN -> 6, but its reference implementation and
      // the backend test data (test_cast_FLOAT_to_FLOAT4E2M1) give a zero; we follow the data.
      code = mx::where(is_nan, u32(0), code, s);
      break;
  }
  return mx::astype(code, mx::uint8, s);
}

namespace {

// float8e8m0 codes -> float32 (exact: 2^(e - 127), 0xFF -> NaN), and float32 -> codes as ONNX's
// Cast (opset 24) defines it: the exponent field of x (its sign dropped), NaN/Inf -> 0xFF, then
// rounded by `round_mode` ("up": any mantissa bit rounds up; "down": truncates; "nearest": by the
// guard bit, ties up), where `saturate` keeps 0xFE from rounding up to the NaN code.
mx::array decode_e8m0(const mx::array& codes, mx::Stream s) {
  auto e = mx::astype(codes, mx::uint32, s);
  // Code e >= 1 is the float32 with exponent field e and no mantissa; code 0 is 2^-127, a
  // float32 subnormal (mantissa bit 22).
  auto bits = mx::where(mx::equal(e, u32(0), s), u32(0x00400000), mx::left_shift(e, u32(23), s), s);
  bits = mx::where(mx::equal(e, u32(0xFF), s), u32(0x7FC00000), bits, s);
  return mx::view(bits, mx::float32, s);
}

mx::array encode_e8m0(const mx::array& x, bool saturate, const std::string& round_mode, mx::Stream s) {
  auto xf = x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, s);
  auto b = mx::view(xf, mx::uint32, s);
  auto e = mx::bitwise_and(mx::right_shift(b, u32(23), s), u32(0xFF), s);
  auto special = mx::equal(e, u32(0xFF), s);  // NaN or Inf
  std::optional<mx::array> up;
  if (round_mode == "up") {
    up = mx::greater(mx::bitwise_and(b, u32(0x7FFFFF), s), u32(0), s);
  } else if (round_mode == "nearest") {
    // Guard bit set, and the round or sticky bits, or a nonzero exponent (ONNX's rule).
    auto guard = mx::greater(mx::bitwise_and(b, u32(0x400000), s), u32(0), s);
    auto rest = mx::greater(mx::bitwise_and(b, u32(0x3FFFFF), s), u32(0), s);
    up = mx::logical_and(guard, mx::logical_or(rest, mx::greater(e, u32(0), s), s), s);
  } else if (round_mode != "down") {
    throw TranslateError("[Cast] unknown round_mode '" + round_mode + "'");
  }
  if (up) {
    if (saturate) up = mx::logical_and(*up, mx::not_equal(e, u32(0xFE), s), s);
    e = mx::add(e, mx::astype(*up, mx::uint32, s), s);  // 0xFE + 1 = 0xFF (NaN) unsaturated
  }
  e = mx::where(special, u32(0xFF), e, s);
  return mx::astype(e, mx::uint8, s);
}

}  // namespace

mx::array wrap_int(const mx::array& ints, DType t, mx::Stream s) {
  if (!is_lowp_int(t)) throw std::invalid_argument("[lowp] wrap_int wants int4/uint4/int2/uint2");
  const int b = bits(t);
  auto v = ints.dtype() == mx::int32 ? ints : mx::astype(ints, mx::int32, s);  // keeps low bits
  auto n = mx::bitwise_and(v, mx::array((1 << b) - 1, mx::int32), s);
  if (t == DType::Int4 || t == DType::Int2) {
    // Sign-extend: (n ^ half) - half maps 0..half-1 to themselves and half..2*half-1 to
    // -half..-1 (int4: 8..15 -> -8..-1).
    auto half = mx::array(1 << (b - 1), mx::int32);
    return mx::astype(mx::subtract(mx::bitwise_xor(n, half, s), half, s), mx::int8, s);
  }
  return mx::astype(n, mx::uint8, s);
}

// Routing (ONNX Cast semantics):
// * from float8/float4: decode to float32 (exact), then on as a float32 would go;
// * from int4/uint4/int2/uint2: the storage already holds the values (int8/uint8);
// * to float8/float4: through float32. From float16/bfloat16 that is exact; from float64 it
//   rounds to odd first (f64_to_f32_odd) so there is a single rounding; from integers and bool
//   it is exact up to 2^24, and anything larger overflows every float8/float4 format anyway, so
//   an int -> float32 rounding cannot change the result;
// * to int4/uint4/int2/uint2: floats truncate toward zero like every float -> integer Cast
//   (ONNX leaves out-of-range values undefined; ORT's CPU EP rounds int4 to nearest instead),
//   integers keep their low bits (ONNX: "discard higher bits and reinterpret").
mx::array convert(const mx::array& x, DType from, DType to, bool saturate, mx::Stream s,
                  const std::string& round_mode) {
  if (is_lowp(from) && x.dtype() != storage(from))
    throw TranslateError(std::string("[Cast] a ") + graph::dtype_name(from) +
                         " value arrived in the wrong storage dtype");
  if (from == to) return x;
  mx::array v = x;
  if (from == DType::Float8E8M0) {
    v = decode_e8m0(x, s);
    from = DType::Float32;
  } else if (is_lowp_float(from)) {
    v = decode(x, from, s);
    from = DType::Float32;
  } else if (is_lowp_int(from)) {
    from = storage(from) == mx::int8 ? DType::Int8 : DType::UInt8;
  }
  if (to == DType::Float8E8M0) {
    // From any type through float32 (a plain rounding, not round-to-odd): ONNX's reference reads
    // the input as float32 first, and ORT's CPU EP does the same, so a float64 just under a
    // power of two that rounds onto it takes that power's exponent.
    return encode_e8m0(v, saturate, round_mode, s);
  }
  if (is_lowp_float(to)) {
    if (v.dtype() == mx::float64) v = f64_to_f32_odd(v, s);
    return encode(v, to, saturate, s);
  }
  if (is_lowp_int(to)) {
    if (mx::issubdtype(v.dtype(), mx::floating)) v = mx::astype(v, mx::int32, s);  // truncates
    return wrap_int(v, to, s);
  }
  return cast_to(v, to, s);
}

DType declared_in(const OpContext& c, size_t i) {
  if (c.node.has_input(i))
    if (auto* v = c.graph.info(c.node.inputs[i]); v && is_lowp(v->dtype)) return v->dtype;
  return from_mlx_dtype(c.in(i).dtype());
}

DType declared_out(const OpContext& c, size_t i) { return c.out_dtype(i); }

size_t host_nbytes(DType t, size_t numel) {
  if (is_lowp(t)) return (numel * bits(t) + 7) / 8;
  return numel * graph::dtype_size(t);
}

mx::array from_host(DType t, const mx::Shape& shape, const void* data) {
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  auto buf = mx::allocator::malloc(std::max<size_t>(n, 1));
  auto* dst = static_cast<uint8_t*>(buf.buffer().raw_ptr());
  const auto* src = static_cast<const uint8_t*>(data);
  if (n && !src) throw std::invalid_argument("[lowp] no data for a non-empty tensor");
  const int b = bits(t);
  if (b == 8) {
    if (n) std::memcpy(dst, src, n);
  } else {
    const size_t per = 8 / b;  // elements per byte, the first in the lowest bits
    const int mask = (1 << b) - 1, half = 1 << (b - 1);
    const bool sign = storage(t) == mx::int8;
    for (size_t i = 0; i < n; ++i) {
      int v = (src[i / per] >> ((i % per) * b)) & mask;
      // int4/int2 are stored as int8: sign-extend (two's complement field).
      dst[i] = static_cast<uint8_t>(sign ? static_cast<int8_t>((v ^ half) - half) : v);
    }
  }
  return mx::array(std::move(buf), shape, storage(t));
}

void to_host(const mx::array& a, DType t, void* dst) {
  if (a.dtype() != storage(t))
    throw std::logic_error(std::string("[engine] a ") + graph::dtype_name(t) +
                           " output is not in its storage dtype");
  if (a.size() == 0 || !dst) return;
  if (!a.flags().row_contiguous) throw std::logic_error("[engine] output is not row-contiguous");
  const auto* src = a.data<uint8_t>();
  auto* out = static_cast<uint8_t*>(dst);
  const int b = bits(t);
  if (b == 8) {
    std::memcpy(out, src, a.size());
    return;
  }
  const size_t per = 8 / b;
  std::memset(out, 0, host_nbytes(t, a.size()));  // unused fields of the last byte stay 0
  for (size_t i = 0; i < a.size(); ++i)
    out[i / per] |= static_cast<uint8_t>((src[i] & ((1 << b) - 1)) << ((i % per) * b));
}

}  // namespace ortmlx::ops::lowp

// ---- BitCast (opset 26) ------------------------------------------------------------------------

namespace ortmlx::ops {

namespace {

size_t bit_width(DType t) {
  if (lowp::is_lowp(t)) return lowp::bits(t);
  return graph::dtype_size(t) * 8;
}

Support check_bitcast(const NodeQuery& q) {
  auto to = static_cast<DType>(q.node.attr_int("to", 0));
  auto from = q.input_dtype(0);
  if (!lowp::is_lowp(to) && !to_mlx_dtype(to))
    return Support::no(std::string("BitCast to ") + graph::dtype_name(to) + " (no MLX dtype)");
  if (q.gpu && to == DType::Float64) return Support::no("BitCast to float64 on the GPU");
  if (from == DType::Undefined) return Support::no("BitCast of an input of unknown dtype");
  if (bit_width(from) == 0 || bit_width(from) != bit_width(to))
    return Support::no(std::string("BitCast between different widths (") +
                       graph::dtype_name(from) + " -> " + graph::dtype_name(to) + ")");
  if (to == DType::Bool && from != DType::Bool)
    return Support::no("BitCast to bool from another type (bytes other than 0/1 are not bools)");
  return Support::yes();
}

// Same-width reinterpretation. 8..64-bit types (float8 included: its storage is the raw byte)
// are an mx::view. The 4-bit and 2-bit types are stored one per byte, so their bit pattern is
// the low bits: re-derive the target's storage from them (sign-extended for int4/int2).
Outputs translate_bitcast(OpContext& c) {
  auto to = static_cast<DType>(c.node.attr_int("to", 0));
  auto from = lowp::declared_in(c, 0);
  const auto& x = c.in(0);
  if (from == to) return {x};
  if (lowp::bits(from) < 8 && lowp::is_lowp(from)) {
    const auto mask = static_cast<uint8_t>((1 << lowp::bits(from)) - 1);
    auto field = mx::bitwise_and(mx::view(x, mx::uint8, c.s), mx::array(mask), c.s);
    return {lowp::is_lowp_int(to) ? lowp::wrap_int(field, to, c.s) : field};
  }
  auto td = lowp::is_lowp(to) ? lowp::storage(to) : mlx_dtype(to);
  if (td.size() != x.dtype().size()) c.fail("input and output widths differ");
  return {x.dtype() == td ? x : mx::view(x, td, c.s)};
}

const OpEntry kOps[] = {
    {"", "BitCast", 26, kAnyOpset, check_bitcast, translate_bitcast,
     "same-width types (float8/float8e8m0/float4/int4/uint4/int2/uint2 included); not to bool "
     "from other types",
     /*lowp=*/true},
};

}  // namespace

std::span<const OpEntry> lowp_ops() { return kOps; }

}  // namespace ortmlx::ops
