#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> ml_ops() { return {}; }

}  // namespace ortmlx::ops
