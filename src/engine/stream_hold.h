#pragma once
// Keeping MLX's CPU stream thread awake through short runs.
//
// MLX's CPU device runs every primitive as a task on one stream thread, which sleeps on a
// condition variable whenever its queue runs dry. A small run's caller queues a task, the
// thread wakes, finishes it before the next is queued and sleeps again: a futex wake-up a
// primitive (tens of µs on a virtual machine), more than the arithmetic. StreamHold queues,
// ahead of a run's tasks, one that spins until the caller has queued them all, and after
// them one that spins until the next run begins (or a deadline passes). Both only delay the
// stream thread, never change what it computes, and both end by a deadline.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include <mlx/stream.h>

namespace ortmlx::engine {

class StreamHold {
 public:
  // Before the run's tasks are queued on stream `s` (a CPU stream).
  StreamHold(mlx::core::Stream s, std::chrono::microseconds window);
  // After they are queued: lets the stream thread run them (also on an exception), and, if
  // lingering paid off lately, queues the spin that waits for the next run.
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  // Process-wide counts: runs held, lingers queued, and lingers that the next run ended (hits,
  // counted as they end; the others ended by their deadline).
  static uint64_t held_runs();
  static uint64_t lingers();
  static uint64_t linger_hits();
  // A run that queues nothing on the stream began (engine/caller_eval.h): ends a linger.
  static void note_run_begun();

 private:
  mlx::core::Stream stream_;
  std::chrono::microseconds window_;
  std::shared_ptr<std::atomic<bool>> queued_;
};

}  // namespace ortmlx::engine
