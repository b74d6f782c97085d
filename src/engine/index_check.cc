#include "engine/index_check.h"

#include "kernels/cuda/device_copy.h"

namespace ortmlx::engine::index_check {

namespace {
thread_local bool tl_diagnosing = false;
}  // namespace

Diagnose::Diagnose() : was_(tl_diagnosing) { tl_diagnosing = true; }
Diagnose::~Diagnose() { tl_diagnosing = was_; }
bool diagnosing() { return tl_diagnosing; }

void append_flag(std::vector<mx::array>& outs, const std::vector<mx::array>& flags, mx::Stream s) {
  if (flags.empty()) return;
  mx::array any = flags[0];
  for (size_t i = 1; i < flags.size(); ++i) any = mx::logical_or(any, flags[i], s);
  outs.push_back(any);
}

bool take_flag(std::vector<mx::array>& outs, size_t n, bool driver_copy) {
  if (outs.size() <= n) return false;
  const mx::array& flag = outs.back();
  // MLX's CUDA backend keeps buffers of 8 bytes or less in a few shared managed pages: a host
  // read of the flag moves its page to the host, and the next run's first kernels that touch a
  // scalar there (an index, a sum of the mask) stall on the GPU's page faults. A copy by the
  // driver leaves the page where it is.
  unsigned char byte = 0;
  const bool set = driver_copy && flag.dtype() == mx::bool_ && flag.nbytes() == 1 &&
                           kernels::cuda::copy_to_host(flag, &byte, /*unified=*/true)
                       ? byte != 0
                       : flag.item<bool>();
  outs.pop_back();
  return set;
}

}  // namespace ortmlx::engine::index_check
