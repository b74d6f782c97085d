// The CPU device's evaluation in one piece (option cpu_caller_eval).
//
// Why: MLX's CPU backend makes every primitive of a run, a view too, a task for the stream's
// thread (a closure, a lock, a queue), and the caller then waits for the last. For small models
// (a wake-word head, a VAD step) those hand-offs are most of a run. Here the run's graph is
// walked in order by one thread, which computes each array whose inputs are ready and whose
// primitive it can run exactly as MLX would: views (MLX's own eval_cpu, which only points at a
// buffer), the EP's CPU kernels (their tasks run at once: kernels/cpu/task.h) and MLX's float32
// elementwise primitives (kernels/cpu/elementwise.cc). What it cannot run (and what depends on
// that) is left to MLX's evaluation, which then sees the computed arrays as ready.
//
// Which thread walks: the caller, when no array is large and no oneDNN primitive is among them
// (nothing of the run then starts parallel work); otherwise MLX's stream thread, as one task.
// Parallel kernels run on OpenMP's threads, whose team belongs to the thread that starts them: a
// second such thread (the caller beside the stream thread) makes a second team, and with more
// OpenMP threads than cores libgomp's workers sleep between regions instead of spinning.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::engine {

// Computes what it can of `outs`' graph (stream `s`, a CPU stream); returns whether every array
// of `outs` is available afterwards (then no MLX evaluation is needed). A walk on the stream
// thread is kept awake as StreamHold does (`hold`), and waited for by polling for `poll_for`
// first.
// `stream_thread`: the walk runs on the stream thread whatever its arrays (a walk it keeps is
// still replayed where they say).
// `large`: graphs of large arrays are walked too (on the stream thread; option cpu_walk_large).
// `one_thread`: the graph's kernels were made to run on one thread (ops::WorkScope): one reading
// a large input (a one-row product's weight) may then run on the caller too.
bool evaluate_on_caller(const std::vector<mlx::core::array>& outs, mlx::core::Stream s, bool hold,
                        std::chrono::microseconds poll_for, bool stream_thread = false, bool large = false,
                        bool one_thread = false);

// A run's walk kept for its signature's later runs (option cpu_caller_replay): the graph a
// compiled call built, its primitives and arrays held, computed again over each run's
// arguments. Then a run needs neither the compiled call (which builds a graph of new arrays),
// nor the walk's graph search, nor MLX's bookkeeping of each array. Only a walk that computed
// the whole graph is kept; the intermediate arrays' buffers stay held between runs, except large
// ones (kReleaseMinBytes), which go back to MLX's cache after their last reader in each run, so
// that later steps take them (a convolutional model's activations: its working set stays that of
// a few layers, in the caches, as with MLX's own evaluation).
class KeptWalk {
 public:
  KeptWalk(std::vector<mlx::core::array> tape, std::vector<mlx::core::array> outs, bool on_caller,
           mlx::core::Stream s);
  // Points `kept_args` (the arguments of the kept run, which its graph reads) at `args` (the
  // same shapes), computes the graph again and returns arrays of its outputs; nullopt when a
  // step could not be computed (a gather's index out of range: the caller runs the compiled
  // call instead and drops this).
  std::optional<std::vector<mlx::core::array>> replay(std::vector<mlx::core::array>& kept_args,
                                                      const std::vector<mlx::core::array>& args, bool hold,
                                                      std::chrono::microseconds poll_for);
  // The same computation on the calling thread, inside a walk that reached it (a kept segment,
  // below): false when a step could not be computed.
  bool compute_here(std::vector<mlx::core::array>& kept_args, const std::vector<mlx::core::array>& args);
  bool on_caller() const { return on_caller_; }
  size_t bytes() const { return bytes_; }  // held between runs
  // The elements its steps that are MLX's own primitives (not views, not the EP's kernels)
  // compute a run: what MLX's fused kernels could take over.
  size_t mlx_elements() const { return mlx_elements_; }
  const std::vector<mlx::core::array>& tape() const { return tape_; }  // the steps, in order
  const std::vector<mlx::core::array>& outputs() const { return outs_; }  // computed again each replay
  // Arrays of their own over the outputs' present buffers (no graph behind them).
  std::vector<mlx::core::array> shared_outputs() const;
  // After shared_outputs: the outputs it computes (not an argument or a constant) small enough
  // for ORT to adopt (under device_buffers::kPoolMinBytes, as program.cc's bind_outputs has it)
  // let go of their buffers, so that what shares them is their one holder and ORT can adopt it
  // (device_buffers::adoptable) instead of copying it; the next computation takes new ones,
  // before anything reads them.
  void let_go_of_small_outputs();

 private:
  // Points the kept arguments at `args` (the same shapes and dtypes, else false).
  static bool repoint(std::vector<mlx::core::array>& kept_args, const std::vector<mlx::core::array>& args);
  std::vector<mlx::core::array> tape_, outs_;
  std::vector<uint8_t> kinds_;  // each step's kind (caller_eval.cc), looked up once
  // After each step, the large arrays it read last (step, output of that step's primitive).
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> release_after_;
  bool on_caller_;
  mlx::core::Stream stream_;
  size_t bytes_ = 0;
  size_t mlx_elements_ = 0;
};
// A shape family's segment (engine/shape_family.h) replayed from the walk one of its runs kept,
// as one array of each later run's graph (primitive "KeptSegment") in place of the graph its
// compiled function would build: the run's walk (evaluate_on_caller) reaches it once the
// eager steps before it are computed, points the kept arguments at its inputs, computes the
// kept steps again and hands out their outputs. Only a walk computes it: a run whose graph
// holds one and cannot be walked whole runs again without (KeptSegmentMiss).
struct SegmentWalk {
  std::shared_ptr<KeptWalk> walk;
  std::vector<mlx::core::array> args;  // the arguments of the kept run, which its steps read
};
std::vector<mlx::core::array> kept_segment(const std::shared_ptr<SegmentWalk>& walk,
                                           const std::vector<mlx::core::array>& inputs, mlx::core::Stream s);
// For a kept segment's output still to compute: the kept array its walk computes it into (an
// output bound to ORT's tensor is bound there: program.cc, bind_outputs).
std::optional<mlx::core::array> kept_segment_source(const mlx::core::array& a);
// evaluate_on_caller for a graph that may hold kept segments: what a walk leaves below them
// (a primitive it cannot compute, a graph over its size rule) MLX evaluates, and the walk goes
// on. False when only arrays no kept segment precedes are left (for MLX's evaluation); throws
// KeptSegmentMiss when a kept segment cannot be computed.
bool evaluate_with_kept_segments(const std::vector<mlx::core::array>& outs, mlx::core::Stream s, bool hold,
                                 std::chrono::microseconds poll_for, bool stream_thread = false);
// Thrown when a kept segment's steps could not all be computed again (or reached MLX's own
// evaluation): the run is redone through the compiled segments.
struct KeptSegmentMiss : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The calling thread's next evaluate_on_caller keeps its walk: take_kept_walk() then returns it
// (null when the walk left anything to MLX, or none ran).
void keep_next_walk();
std::shared_ptr<KeptWalk> take_kept_walk();

// Process-wide counts: runs replayed from a kept walk; arrays computed by such walks (on the caller, on the stream thread), and
// arrays they left to MLX.
uint64_t caller_eval_replays();
// Large arrays a kept walk let go of after their last reader (KeptWalk), in this process.
uint64_t caller_eval_released();
uint64_t caller_eval_arrays();
uint64_t caller_eval_stream_arrays();
uint64_t caller_eval_left();

}  // namespace ortmlx::engine
