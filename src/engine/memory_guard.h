// Enforces MLX's memory limit (mx::set_memory_limit, the EP's memory_limit_mb option) before
// memory is taken. MLX's CPU allocator records the limit but never checks it, and an allocation
// the machine cannot back ends in a SIGSEGV inside an MLX kernel or the kernel's OOM killer,
// not in an exception: the EP must refuse such work itself, with a message saying why.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <mlx/array.h>

namespace ortmlx::engine {

// Raised when work would exceed the memory limit. The EP reports it as a runtime error (not an
// EP failure, which ORT's Python wrapper answers by silently re-running on the CPU EP).
class MemoryLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Before copying `nbytes` into a new MLX buffer (a constant initializer, an input): the bytes
// already held plus these must fit under the limit. `what` names the buffer in the message.
void check_allocation(size_t nbytes, const std::string& what);

// Before mx::eval(outputs): every buffer the evaluation must create (the unevaluated arrays of
// the graph) is at least as large as its largest one; that one plus the bytes already held must
// fit under the limit. A lower bound of the peak, so it never refuses work that would fit;
// intermediates are freed as MLX goes, so the sum of all of them would over-count.
// Returns the number of arrays the evaluation will compute (MLX primitives to run).
size_t check_evaluation(const std::vector<mlx::core::array>& outputs, const std::string& where);

}  // namespace ortmlx::engine
