#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> shape_ops() { return {}; }

}  // namespace ortmlx::ops
