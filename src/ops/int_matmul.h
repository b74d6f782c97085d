// Exact integer products through float matmuls (matmul.cc), shared with the integer
// convolutions of conv_extra.cc.
#pragma once

#include "ops/op_context.h"

namespace ortmlx::ops {

// a @ b (rank >= 2, numpy batch broadcasting) for integer-valued arrays with |a|, |b| < 2^bits,
// returned exactly as int64: K is cut into chunks whose partial sums fit the mantissa of the
// float type used (float64 on the CPU, float32 elsewhere).
mx::array exact_matmul(mx::array a, mx::array b, int bits, mx::Stream s);

}  // namespace ortmlx::ops
