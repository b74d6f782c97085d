#include "engine/stream_hold.h"

#include <thread>

#include <mlx/scheduler.h>

namespace ortmlx::engine {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<uint64_t> g_runs_begun{0};
std::atomic<uint64_t> g_held{0}, g_lingers{0}, g_hits{0};
// Whether the last linger ended by the next run's start; a missed one stops lingering until
// every kProbeEvery-th run tries again (the caller's rhythm may have changed).
std::atomic<bool> g_last_linger_hit{true};
std::atomic<uint64_t> g_since_miss{0};
constexpr uint64_t kProbeEvery = 16;

inline void relax() { std::this_thread::yield(); }  // another thread may need this core

}  // namespace

StreamHold::StreamHold(mlx::core::Stream s, std::chrono::microseconds window)
    : stream_(s), window_(window), queued_(std::make_shared<std::atomic<bool>>(false)) {
  const auto deadline = Clock::now() + window_;
  mlx::core::scheduler::enqueue(stream_, [queued = queued_, deadline] {
    while (!queued->load(std::memory_order_acquire) && Clock::now() < deadline) relax();
  });
  g_runs_begun.fetch_add(1, std::memory_order_release);  // after the hold is queued: see ~StreamHold
  g_held.fetch_add(1, std::memory_order_relaxed);
}

StreamHold::~StreamHold() {
  const bool linger = g_last_linger_hit.load(std::memory_order_relaxed) ||
                      g_since_miss.fetch_add(1, std::memory_order_relaxed) % kProbeEvery == 0;
  if (linger) {
    // Ends when any later run has queued its hold (so the queue is not empty when it returns).
    const uint64_t begun = g_runs_begun.load(std::memory_order_acquire);
    const auto window = window_;
    try {
      mlx::core::scheduler::enqueue(stream_, [begun, window] {
        const auto deadline = Clock::now() + window;
        bool hit = false;
        while (!(hit = g_runs_begun.load(std::memory_order_acquire) != begun) && Clock::now() < deadline) relax();
        g_last_linger_hit.store(hit, std::memory_order_relaxed);
        if (hit) g_hits.fetch_add(1, std::memory_order_relaxed);
      });
      g_lingers.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      // A stopped stream: nothing to keep awake.
    }
  }
  queued_->store(true, std::memory_order_release);
}

void StreamHold::note_run_begun() { g_runs_begun.fetch_add(1, std::memory_order_release); }

uint64_t StreamHold::held_runs() { return g_held.load(); }
uint64_t StreamHold::linger_hits() { return g_hits.load(); }
uint64_t StreamHold::lingers() { return g_lingers.load(); }

}  // namespace ortmlx::engine
