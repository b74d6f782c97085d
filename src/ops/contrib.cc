#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> contrib_ops() { return {}; }

}  // namespace ortmlx::ops
