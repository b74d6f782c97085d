#include "engine/memory_guard.h"

#include <algorithm>
#include <unordered_set>

#include <mlx/memory.h>

#include "engine/device_buffers.h"

namespace ortmlx::engine {

namespace mx = mlx::core;

namespace {

std::string mib(long double bytes) {
  auto m = static_cast<unsigned long long>(bytes / (1024.0L * 1024.0L) + 0.5L);
  return std::to_string(m) + " MiB";
}

// The element count from the shape, in long double: MLX's own size() is a product of int32
// dims that a hostile shape (65536 x 65536 x 4) can overflow.
long double bytes_of(const mx::array& a) {
  long double n = a.itemsize();
  for (int d : a.shape()) n *= d < 0 ? 0 : d;
  return n;
}

void check(long double needed, const std::string& what) {
  const size_t limit = mx::get_memory_limit();
  if (limit == 0) return;  // no limit known (a backend without memory accounting)
  size_t held = mx::get_active_memory();
  auto over = [&] { return static_cast<long double>(held) + needed > static_cast<long double>(limit); };
  // Freed buffers the EP's device allocator keeps for reuse count as held: given back first.
  if (over() && device_buffers::drop_pool()) held = mx::get_active_memory();
  if (over())
    throw MemoryLimitError(what + " needs " + mib(needed) + " with " + mib(held) +
                           " already held by MLX, above MLX's memory limit of " + mib(limit) +
                           " (the EP option memory_limit_mb sets it)");
}

}  // namespace

void check_allocation(size_t nbytes, const std::string& what) {
  check(static_cast<long double>(nbytes), what);
}

size_t check_evaluation(const std::vector<mx::array>& outputs, const std::string& where) {
  long double largest = 0;
  size_t pending = 0;
  std::vector<mx::array> stack(outputs.begin(), outputs.end());
  std::unordered_set<std::uintptr_t> seen;
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    // Arrays with data are already counted in the active memory, and so is what they hold.
    if (!seen.insert(a.id()).second || a.is_available()) continue;
    largest = std::max(largest, bytes_of(a));
    ++pending;
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  if (largest > 0) check(largest, where + ": one of the buffers of this run");
  return pending;
}

}  // namespace ortmlx::engine
