// Run-time index checks (ops::OpContext::checked_indices): the flags a translation collects
// become one scalar output of the run, evaluated with the others and read on the host after the
// evaluation (no extra sync). A set flag re-translates the run eagerly with host checks, which
// name the failing node, the index and its range.
#pragma once

#include <stdexcept>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::engine::index_check {

namespace mx = mlx::core;

// An out-of-range index (ORT_INVALID_ARGUMENT); not a reason to stop compiling the program.
struct IndexError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// While one is alive on a thread, its translations check indices on the host (see above).
class Diagnose {
 public:
  Diagnose();
  ~Diagnose();
  Diagnose(const Diagnose&) = delete;
  Diagnose& operator=(const Diagnose&) = delete;

 private:
  bool was_;
};
bool diagnosing();

// Appends the flags (if any) to `outs` as one scalar bool.
void append_flag(std::vector<mx::array>& outs, const std::vector<mx::array>& flags, mx::Stream s);

// After evaluation: removes the flag output past the first `n` and says whether it was set
// (`driver_copy`: on MLX's CUDA backend read by one copy of the driver, Options::device_copies 2).
bool take_flag(std::vector<mx::array>& outs, size_t n, bool driver_copy);

}  // namespace ortmlx::engine::index_check
