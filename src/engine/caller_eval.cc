#include "engine/caller_eval.h"

#include <atomic>
#include <string_view>
#include <unordered_set>
#include <utility>

#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

namespace ortmlx::engine {
namespace {

namespace mx = mlx::core;

std::atomic<uint64_t> g_arrays{0}, g_left{0};

bool pending(const mx::array& a) { return a.status() == mx::array::Status::unscheduled && a.has_primitive(); }
bool ready(const mx::array& a) { return a.status() == mx::array::Status::available || a.is_available(); }

// MLX's view primitives whose eval_cpu only points the output at the input's buffer, on the
// calling thread (no task): what MLX's Reshape and Contiguous do depends on the input's layout.
bool shares_buffer(std::string_view n, const std::vector<mx::array>& in, const std::vector<mx::array>& out) {
  if (n == "Broadcast" || n == "BroadcastAxes" || n == "ExpandDims" || n == "Squeeze" || n == "Transpose" ||
      n == "Slice" || n == "AsStrided" || n == "StopGradient" || n == "Split" || n == "Copy")
    return true;
  if (n == "Reshape" || n == "Flatten" || n == "Unflatten")
    return in[0].size() == 0 || in[0].flags().row_contiguous;
  if (n == "Contiguous")  // MLX's own test: a row-contiguous input not much larger than the output
    return in[0].flags().row_contiguous && in[0].buffer_size() <= out[0].nbytes() + 16384;
  return false;
}

// The copying forms of those (an input of another layout): the elements in row-major order, as
// MLX's copy would leave them.
bool copies(std::string_view n) {
  return n == "Reshape" || n == "Flatten" || n == "Unflatten" || n == "Contiguous";
}

bool compute(mx::array& a) {
  auto& prim = a.primitive();
  const std::string_view n = prim.name();
  auto& inputs = a.inputs();
  std::vector<mx::array> outputs = a.outputs();
  if (shares_buffer(n, inputs, outputs)) {
    prim.eval_cpu(inputs, outputs);
    return true;
  }
  if (copies(n) && outputs.size() == 1 && inputs.size() == 1 && inputs[0].dtype() == outputs[0].dtype()) {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    ops::copy_row_major(inputs[0], out.data<void>());
    return true;
  }
  if (ops::is_cpu_kernel(n)) {
    ops::CallerTasksScope on_caller;
    prim.eval_cpu(inputs, outputs);
    return true;
  }
  return outputs.size() == 1 && ops::cpu_elementwise_on_caller(n, inputs, outputs[0]);
}

}  // namespace

bool evaluate_on_caller(const std::vector<mx::array>& outs) {
  // The arrays still to compute, inputs before the arrays that read them (siblings, the other
  // outputs of one primitive, once).
  std::vector<mx::array> tape;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<mx::array, bool>> stack;
  for (const auto& o : outs) stack.emplace_back(o, false);
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (expanded) {
      tape.push_back(std::move(a));
      continue;
    }
    if (!pending(a) || !seen.insert(a.id()).second) continue;
    for (const auto& s : a.siblings()) seen.insert(s.id());
    stack.emplace_back(a, true);
    for (const auto& in : a.inputs())
      if (pending(in) && !seen.count(in.id())) stack.emplace_back(in, false);
  }
  uint64_t done = 0, left = 0;
  for (auto& a : tape) {
    bool inputs_ready = true;
    for (const auto& in : a.inputs()) inputs_ready = inputs_ready && ready(in);
    if (!inputs_ready || !compute(a)) {
      ++left;
      continue;
    }
    for (auto& o : a.outputs()) o.set_status(mx::array::Status::available);
    a.detach();
    ++done;
  }
  g_arrays.fetch_add(done, std::memory_order_relaxed);
  g_left.fetch_add(left, std::memory_order_relaxed);
  if (left) return false;
  for (const auto& o : outs)
    if (!ready(o)) return false;
  return true;
}

uint64_t caller_eval_arrays() { return g_arrays.load(std::memory_order_relaxed); }
uint64_t caller_eval_left() { return g_left.load(std::memory_order_relaxed); }

}  // namespace ortmlx::engine
