// How the EP's CPU kernels hand their work to MLX: as a task of the CPU stream's thread (MLX's
// way), or, inside an evaluation on the calling thread (engine/caller_eval.h), run at once by
// the caller, whose inputs are then already computed.
#pragma once

#include <string_view>
#include <utility>

#include <mlx/backend/cpu/encoder.h>

namespace ortmlx::ops {

// Whether the calling thread runs the kernels' tasks itself (inside a CallerTasksScope).
bool cpu_tasks_on_caller();
class CallerTasksScope {
 public:
  CallerTasksScope();
  ~CallerTasksScope();
  CallerTasksScope(const CallerTasksScope&) = delete;
  CallerTasksScope& operator=(const CallerTasksScope&) = delete;

 private:
  bool prev_;
};

// Every CPU kernel's eval_cpu ends here with its work, for stream `s`. (The encoder is looked
// up only to dispatch: MLX keeps one per stream and thread, and a walk may run on the stream's
// own thread.)
template <class F>
void dispatch_task(mlx::core::Stream s, F&& task) {
  if (cpu_tasks_on_caller()) {
    task();
    return;
  }
  mlx::core::cpu::get_command_encoder(s).dispatch(std::forward<F>(task));
}

// Whether an MLX primitive of this name is one of the EP's CPU kernels (all of which dispatch
// through dispatch_task). By name: libmlx's primitives carry no RTTI the EP can rely on.
bool is_cpu_kernel(std::string_view primitive_name);

}  // namespace ortmlx::ops
