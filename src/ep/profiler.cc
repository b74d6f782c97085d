#include "ep/profiler.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ep/error_wall.h"
#include "trace/trace.h"

namespace ortmlx::ep {

namespace {

struct ProfilingEventDeleter {
  void operator()(OrtProfilingEvent* e) const { if (e) g_ep_api->ReleaseProfilingEvent(e); }
};
using ProfilingEventPtr = std::unique_ptr<OrtProfilingEvent, ProfilingEventDeleter>;

// Collects the session's events while ORT profiles. A session's profiler takes every event its
// EP records; ORT brackets each event it profiles with StartEvent/StopEvent on the thread that
// runs it, so once it has, only events recorded inside such a bracket are taken (a profiled
// run's profiler leaves the session's concurrent unprofiled runs out).
class Profiler final : public OrtEpProfilerImpl, public trace::Sink {
 public:
  explicit Profiler(const void* ep) : OrtEpProfilerImpl{}, ep_(ep) {
    ort_version_supported = g_api_version;
    Release = ReleaseImpl;
    StartProfiling = StartProfilingImpl;
    StartEvent = StartEventImpl;
    StopEvent = StopEventImpl;
    EndProfiling = EndProfilingImpl;
  }
  ~Profiler() override { stop(); }

  void record(const trace::Event& e) override {
    if (e.owner != ep_ || e.ph != 'X') return;  // ORT's profile has no counter events
    std::lock_guard<std::mutex> lock(mu_);
    if (bracketed_) {
      auto it = open_.find(e.tid);
      if (it == open_.end() || it->second == 0) return;
    }
    events_.push_back(e);
  }

 private:
  void stop() {
    std::lock_guard<std::mutex> lock(attach_mu_);
    if (attached_) trace::detach(this);
    attached_ = false;
  }

  static void ORT_API_CALL ReleaseImpl(OrtEpProfilerImpl* self) noexcept {
    delete static_cast<Profiler*>(self);
  }
  static OrtStatus* ORT_API_CALL StartProfilingImpl(OrtEpProfilerImpl* self, int64_t offset_ns) noexcept {
    return guard("StartProfiling", [&] {
      auto* p = static_cast<Profiler*>(self);
      std::lock_guard<std::mutex> lock(p->attach_mu_);
      p->start_ns_ = trace::now_ns();
      p->offset_ns_ = offset_ns;
      if (!p->attached_) trace::attach(p);
      p->attached_ = true;
    });
  }
  static OrtStatus* ORT_API_CALL StartEventImpl(OrtEpProfilerImpl* self, uint64_t) noexcept {
    return guard("StartEvent", [&] {
      auto* p = static_cast<Profiler*>(self);
      std::lock_guard<std::mutex> lock(p->mu_);
      p->bracketed_ = true;
      ++p->open_[trace::thread_id()];
    });
  }
  static OrtStatus* ORT_API_CALL StopEventImpl(OrtEpProfilerImpl* self, uint64_t,
                                               const OrtProfilingEvent*) noexcept {
    return guard("StopEvent", [&] {
      auto* p = static_cast<Profiler*>(self);
      std::lock_guard<std::mutex> lock(p->mu_);
      if (auto it = p->open_.find(trace::thread_id()); it != p->open_.end() && it->second > 0) --it->second;
    });
  }
  static OrtStatus* ORT_API_CALL EndProfilingImpl(OrtEpProfilerImpl* self,
                                                  OrtProfilingEventsContainer* container) noexcept {
    return guard("EndProfiling", [&] {
      auto* p = static_cast<Profiler*>(self);
      p->stop();
      std::vector<trace::Event> events;
      {
        std::lock_guard<std::mutex> lock(p->mu_);
        events.swap(p->events_);
      }
      p->hand_over(events, container);
    });
  }

  void hand_over(const std::vector<trace::Event>& events, OrtProfilingEventsContainer* container) const {
    constexpr size_t kBatch = 256;
    std::vector<ProfilingEventPtr> batch;
    auto flush = [&] {
      if (batch.empty()) return;
      std::vector<const OrtProfilingEvent*> raw;
      for (const auto& e : batch) raw.push_back(e.get());
      check(g_ep_api->ProfilingEventsContainer_AddEvents(container, raw.data(), raw.size()));
      batch.clear();
    };
    for (const auto& e : events) {
      std::vector<const char*> keys{"ep", "category"}, values{kEpName, e.cat};
      for (const auto& [k, v] : e.args) {
        keys.push_back(k.c_str());
        values.push_back(v.c_str());
      }
      // ORT's timestamps count from its profiling start: ours from StartProfiling, shifted.
      const int64_t ts_us = (offset_ns_ + (e.ts_ns - start_ns_)) / 1000;
      const auto category = std::string_view(e.cat) == "op" ? OrtProfilingEventCategory_NODE
                                                            : OrtProfilingEventCategory_KERNEL;
      OrtProfilingEvent* out = nullptr;
      check(g_ep_api->CreateProfilingEvent(category, e.pid, e.tid, e.name.c_str(), ts_us,
                                           e.dur_ns / 1000, keys.data(), values.data(),
                                           keys.size(), &out));
      batch.emplace_back(out);
      if (batch.size() == kBatch) flush();
    }
    flush();
  }

  const void* ep_;
  std::mutex attach_mu_;  // StartProfiling/EndProfiling/Release (ORT may call them from any thread)
  bool attached_ = false;
  int64_t start_ns_ = 0, offset_ns_ = 0;
  std::mutex mu_;
  bool bracketed_ = false;
  std::unordered_map<int32_t, int> open_;  // thread -> ORT events open on it
  std::vector<trace::Event> events_;
};

}  // namespace

OrtEpProfilerImpl* make_profiler(const void* ep) { return new Profiler(ep); }

}  // namespace ortmlx::ep
