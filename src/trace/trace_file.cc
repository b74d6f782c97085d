#include "trace/trace_file.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace ortmlx::trace {

namespace {
// A bound on memory for a trace left on over a long serving run; what is dropped is counted.
constexpr size_t kMaxEvents = 4'000'000;

std::string arg_of(const Event& e, const std::string& key) {
  for (const auto& [k, v] : e.args)
    if (k == key) return v;
  return {};
}
}  // namespace

TraceFile::TraceFile(std::string path) : path_(std::move(path)) {
  std::ofstream f(path_, std::ios::trunc);
  if (!f) throw std::runtime_error("ORT_MLX_TRACE: cannot write '" + path_ + "'");
  f << "{\"traceEvents\":[]}\n";
  attach(this);
}

TraceFile::~TraceFile() { detach(this); }

void TraceFile::record(const Event& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

std::string TraceFile::summary(const std::vector<Event>& events, size_t top) {
  struct Row {
    int64_t ns = 0, max_ns = 0;
    size_t calls = 0;
    std::string op;
  };
  std::map<std::string, Row> by_node;
  bool evaluated = false;
  for (const auto& e : events) {
    if (e.ph != 'X' || std::string_view(e.cat) != "op") continue;
    auto& r = by_node[arg_of(e, "node")];
    r.ns += e.dur_ns;
    r.max_ns = std::max(r.max_ns, e.dur_ns);
    ++r.calls;
    r.op = e.name;
    evaluated |= arg_of(e, "evaluated") == "1";
  }
  std::vector<std::pair<std::string, Row>> rows(by_node.begin(), by_node.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::ostringstream o;
  o << "slowest ONNX nodes ("
    << (evaluated ? "each evaluated on its own: profile_ops=1"
                  : "graph building only; profile_ops=1 times each node's evaluation")
    << "):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %10s %8s %10s  %s\n", "total ms", "calls", "max ms", "op (node)");
  o << line;
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const auto& [node, r] = rows[i];
    std::snprintf(line, sizeof line, "  %10.3f %8zu %10.3f  ", r.ns / 1e6, r.calls, r.max_ns / 1e6);
    o << line << r.op << " (" << node << ")\n";
  }
  if (rows.empty()) o << "  (no ONNX node was translated while tracing)\n";
  return o.str();
}

std::string TraceFile::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string text = summary(events_);
  std::ofstream f(path_, std::ios::trunc);
  if (!f) throw std::runtime_error("ORT_MLX_TRACE: cannot write '" + path_ + "'");
  f << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  for (const auto& e : events_) f << to_json(e) << ",\n";
  // Names the process's track in the viewer, and carries the summary.
  f << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << process_id()
    << ",\"tid\":0,\"args\":{\"name\":\"onnxruntime-mlx\"}},\n";
  f << "{\"name\":\"slowest_ops\",\"ph\":\"M\",\"pid\":" << process_id() << ",\"tid\":0,\"args\":{"
    << "\"summary\":\"" << json_escape(text) << "\",\"dropped_events\":" << dropped_ << "}}\n";
  f << "]}\n";
  if (!f) throw std::runtime_error("ORT_MLX_TRACE: writing '" + path_ + "' failed");
  return text;
}

}  // namespace ortmlx::trace
