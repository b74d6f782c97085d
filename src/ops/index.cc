#include "ops/common.h"

namespace ortmlx::ops {

std::span<const OpEntry> index_ops() { return {}; }

}  // namespace ortmlx::ops
