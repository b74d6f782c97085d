#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> math_ops() { return {}; }

}  // namespace ortmlx::ops
