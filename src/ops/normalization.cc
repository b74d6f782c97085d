#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> normalization_ops() { return {}; }

}  // namespace ortmlx::ops
