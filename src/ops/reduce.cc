#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> reduce_ops() { return {}; }

}  // namespace ortmlx::ops
