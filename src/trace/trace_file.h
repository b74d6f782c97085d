// The ORT_MLX_TRACE file: every event of the process in Chrome's trace JSON (Perfetto and
// chrome://tracing open it), rewritten whole at each flush, with a slowest-ops summary.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "trace/trace.h"

namespace ortmlx::trace {

class TraceFile : public Sink {
 public:
  // Throws std::runtime_error naming the path when it cannot be written.
  explicit TraceFile(std::string path);
  ~TraceFile() override;
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  void record(const Event& e) override;
  // Writes the file (the events so far, then the summary as a metadata event) and returns the
  // summary's text.
  std::string flush();
  const std::string& path() const { return path_; }

  // The `top` ONNX nodes with the most time in "op" spans, as a table.
  static std::string summary(const std::vector<Event>& events, size_t top = 10);

 private:
  std::string path_;
  std::mutex mu_;
  std::vector<Event> events_;
  size_t dropped_ = 0;
};

}  // namespace ortmlx::trace
