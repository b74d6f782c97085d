#include "engine/index_check.h"

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

bool take_flag(std::vector<mx::array>& outs, size_t n) {
  if (outs.size() <= n) return false;
  const bool set = outs.back().item<bool>();
  outs.pop_back();
  return set;
}

}  // namespace ortmlx::engine::index_check
