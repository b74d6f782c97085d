#include "trace/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <shared_mutex>

#include <sys/syscall.h>
#include <unistd.h>

namespace ortmlx::trace {

namespace detail {
std::atomic<int> g_sinks{0};
}

namespace {
std::shared_mutex& sinks_mu() {
  static std::shared_mutex mu;
  return mu;
}
std::vector<Sink*>& sinks() {
  static std::vector<Sink*> s;
  return s;
}
thread_local const void* tl_owner = nullptr;
}  // namespace

void attach(Sink* s) {
  std::unique_lock lock(sinks_mu());
  sinks().push_back(s);
  detail::g_sinks.store(static_cast<int>(sinks().size()), std::memory_order_relaxed);
}

void detach(Sink* s) {
  std::unique_lock lock(sinks_mu());
  auto& v = sinks();
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  detail::g_sinks.store(static_cast<int>(v.size()), std::memory_order_relaxed);
}

void emit(Event&& e) {
  std::shared_lock lock(sinks_mu());
  for (Sink* s : sinks()) s->record(e);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int32_t process_id() { return static_cast<int32_t>(::getpid()); }

int32_t thread_id() {
  thread_local const int32_t tid = static_cast<int32_t>(::syscall(SYS_gettid));
  return tid;
}

ScopedOwner::ScopedOwner(const void* owner) : previous_(tl_owner) { tl_owner = owner; }
ScopedOwner::~ScopedOwner() { tl_owner = previous_; }
const void* ScopedOwner::current() { return tl_owner; }

void Span::begin(const char* cat, const char* name) {
  event_.cat = cat;
  event_.name = name;
  event_.ts_ns = now_ns();
}

void Span::end() {
  event_.dur_ns = now_ns() - event_.ts_ns;
  event_.pid = process_id();
  event_.tid = thread_id();
  event_.owner = tl_owner;
  emit(std::move(event_));
}

void counter(const char* name, double value) {
  if (!on()) return;
  Event e;
  e.cat = "memory";
  e.ph = 'C';
  e.name = name;
  e.ts_ns = now_ns();
  e.pid = process_id();
  e.tid = thread_id();
  e.owner = tl_owner;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", value);
  e.args.emplace_back("value", buf);
  emit(std::move(e));
}

std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    if (static_cast<unsigned char>(c) < 0x20) { o += ' '; continue; }
    o += c;
  }
  return o;
}

std::string to_json(const Event& e) {
  char num[96];
  std::string o = "{\"name\":\"" + json_escape(e.name) + "\",\"cat\":\"" + e.cat + "\",\"ph\":\"";
  o += e.ph;
  // Chrome's trace format counts microseconds; three decimals keep the nanoseconds.
  std::snprintf(num, sizeof num, "\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d", e.ts_ns / 1e3, e.pid, e.tid);
  o += num;
  if (e.ph == 'X') {
    std::snprintf(num, sizeof num, ",\"dur\":%.3f", e.dur_ns / 1e3);
    o += num;
  }
  o += ",\"args\":{";
  for (size_t i = 0; i < e.args.size(); ++i) {
    if (i) o += ",";
    o += "\"" + json_escape(e.args[i].first) + "\":";
    // Counter values are numbers (Chrome plots them); span arguments are strings.
    if (e.ph == 'C') o += e.args[i].second;
    else o += "\"" + json_escape(e.args[i].second) + "\"";
  }
  o += "}}";
  return o;
}

}  // namespace ortmlx::trace
