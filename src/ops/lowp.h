// The ONNX element types MLX has no dtype for: the four float8 formats, float4e2m1, int4, uint4,
// int2 and uint2 ("low precision" below), and float8e8m0 (the OCP microscaling formats' scale:
// a power of two 2^(e - 127), no sign, no mantissa; 0xFF is NaN), which only Cast, CastLike,
// BitCast and the data-movement ops take.
//
// How they live in MLX: float8 values are uint8 arrays holding the raw codes; the sub-byte types
// are stored UNPACKED, one element per byte: int4/int2 as int8 (in [-8, 7] / [-2, 1]),
// uint4/uint2 as uint8 (in [0, 15] / [0, 3]), float4e2m1 as uint8 codes in [0, 15]. Only the ABI
// boundary packs and unpacks ORT's layout: 8 / bits elements per byte, the first in the lowest
// bits (4-bit: element 2k in the low nibble of byte k, 2k+1 in the high nibble).
//
// Because a uint8 array could be a float8 code or a plain byte, no generic op may see these
// arrays: the partitioner declines the dtypes except for ops whose registry entry opts in
// (OpEntry::lowp), and those translators read the declared ONNX dtype (declared_in) rather than
// the MLX dtype. Conversions are MLX integer/bit ops (view, shifts, masks, where), so they run
// inside compiled graphs on every backend.
#pragma once

#include <cstddef>
#include <string>

#include "ops/op_context.h"

namespace ortmlx::ops::lowp {

bool is_lowp(DType t);        // float8 x4, float4e2m1, int4, uint4, int2, uint2, float8e8m0
bool is_lowp_float(DType t);  // float8 x4, float4e2m1 (sign, exponent and mantissa: not e8m0)
bool is_lowp_int(DType t);    // int4, uint4, int2, uint2
int bits(DType t);            // 8 (float8), 4 (int4, uint4, float4e2m1), 2 (int2, uint2)
mx::Dtype storage(DType t);   // int8 for int4/int2, uint8 for the others

// Device codecs (MLX ops).
// Codes -> float32, exact (every float8/float4 value is a float32).
mx::array decode(const mx::array& codes, DType t, mx::Stream s);
// float32 -> codes with round-to-nearest-even. `saturate` clamps out-of-range values (Inf
// included) to the largest finite value; otherwise they become Inf (float8e5m2) or NaN (the
// FN/FNUZ formats) as ONNX's Cast table says. float4e2m1 has no Inf/NaN and always saturates.
mx::array encode(const mx::array& x, DType t, bool saturate, mx::Stream s);
// Integers (any MLX integer dtype, or int32 after a float truncation) -> int4/uint4/int2/uint2
// storage, keeping the low 4 or 2 bits (ONNX's rule for fixed point narrowing: discard the
// higher bits and reinterpret in two's complement).
mx::array wrap_int(const mx::array& ints, DType t, mx::Stream s);

// Cast `x` (declared ONNX dtype `from`, in its MLX storage) to `to`. Conversions that involve a
// low precision type go through float32 (see lowp.cc for why that is exact). `round_mode`
// applies to float8e8m0 results only.
mx::array convert(const mx::array& x, DType from, DType to, bool saturate, mx::Stream s,
                  const std::string& round_mode = "up");

// The declared ONNX dtype of node input i (its value info), else the MLX dtype's.
DType declared_in(const OpContext& c, size_t i);
DType declared_out(const OpContext& c, size_t i);

// ABI boundary (host memory in ORT's layout).
size_t host_nbytes(DType t, size_t numel);
// An MLX array owning an unpacked copy of `data` (ORT layout).
mx::array from_host(DType t, const mx::Shape& shape, const void* data);
// Writes an evaluated, row-contiguous storage array into `dst` in ORT's layout.
void to_host(const mx::array& a, DType t, void* dst);

}  // namespace ortmlx::ops::lowp
