// The CPU device's evaluation on the calling thread (option cpu_caller_eval).
//
// Why: MLX's CPU backend makes every primitive of a run, a view too, a task for the stream's
// thread (a closure, a lock, a queue), and the caller then waits for the last. For small models
// (a wake-word head, a VAD step) those hand-offs are most of a run. Here the caller walks the
// run's graph itself, in order, and computes each array whose inputs are ready and whose
// primitive it can run exactly as MLX would: views (MLX's own eval_cpu, which only shares a
// buffer), the EP's CPU kernels (their tasks run at once: kernels/cpu/task.h) and MLX's float32
// elementwise primitives (kernels/cpu/elementwise.cc). What it cannot run (and what depends on
// that) is left for MLX's evaluation, which then sees the computed arrays as ready.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::engine {

// Computes what it can of `outs`' graph on the calling thread; returns whether every array of
// `outs` is available afterwards (then no MLX evaluation is needed).
bool evaluate_on_caller(const std::vector<mlx::core::array>& outs);

// Process-wide counts: arrays computed on the caller, and arrays left to MLX by such passes.
uint64_t caller_eval_arrays();
uint64_t caller_eval_left();

}  // namespace ortmlx::engine
