#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> activation_ops() { return {}; }

}  // namespace ortmlx::ops
