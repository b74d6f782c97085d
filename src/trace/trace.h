// Timed spans and counters for profiling (Chrome trace event model: complete events and counters).
// Sinks attach while someone listens (ORT's profiler, the ORT_MLX_TRACE file); with none attached a
// span costs one relaxed atomic load. Plain C++: the engine records, the ABI layer hands over.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ortmlx::trace {

struct Event {
  std::string name;
  const char* cat = "";   // "fused_node", "phase", "op", "memory" (static strings)
  char ph = 'X';          // 'X' complete span, 'C' counter
  int64_t ts_ns = 0;      // steady clock (CLOCK_MONOTONIC on Linux), as other tools' traces
  int64_t dur_ns = 0;
  int32_t pid = 0, tid = 0;
  const void* owner = nullptr;  // the session's EP the work ran for (ScopedOwner); may be null
  std::vector<std::pair<std::string, std::string>> args;  // counters: numeric values
};

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void record(const Event& e) = 0;
};

namespace detail {
extern std::atomic<int> g_sinks;
}

// Whether anyone listens: the only cost of a span when tracing is off.
inline bool on() { return detail::g_sinks.load(std::memory_order_relaxed) > 0; }
void attach(Sink* s);
void detach(Sink* s);
void emit(Event&& e);

int64_t now_ns();
int32_t process_id();
int32_t thread_id();

// The EP a thread is running a fused node for, stamped on the events it records meanwhile, so
// one session's profiler leaves other sessions' work out.
class ScopedOwner {
 public:
  explicit ScopedOwner(const void* owner);
  ~ScopedOwner();
  ScopedOwner(const ScopedOwner&) = delete;
  ScopedOwner& operator=(const ScopedOwner&) = delete;
  static const void* current();

 private:
  const void* previous_;
};

// A timed region, recorded when it closes (if tracing was on when it opened).
class Span {
 public:
  Span(const char* cat, const char* name) : active_(on()) {
    if (active_) begin(cat, name);
  }
  ~Span() {
    if (active_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const { return active_; }
  void rename(std::string name) {
    if (active_) event_.name = std::move(name);
  }
  void arg(std::string key, std::string value) {
    if (active_) event_.args.emplace_back(std::move(key), std::move(value));
  }

 private:
  void begin(const char* cat, const char* name);
  void end();
  bool active_;
  Event event_;
};

// One sample of a counter track (Chrome's 'C' event; one track per name).
void counter(const char* name, double value);

// Chrome trace JSON of `events` (the "traceEvents" array's items, comma-separated).
std::string to_json(const Event& e);
std::string json_escape(const std::string& s);

}  // namespace ortmlx::trace
