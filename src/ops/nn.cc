#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> nn_ops() { return {}; }

}  // namespace ortmlx::ops
