#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> control_flow_ops() { return {}; }

}  // namespace ortmlx::ops
