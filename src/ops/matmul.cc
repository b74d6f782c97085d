#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> matmul_ops() { return {}; }

}  // namespace ortmlx::ops
