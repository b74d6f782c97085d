#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> recurrent_ops() { return {}; }

}  // namespace ortmlx::ops
