// Trace events (trace/trace.h): spans reach attached sinks only, carry real ids and their
// owner, and the trace file is Chrome trace JSON with the slowest-ops summary.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trace/trace.h"
#include "trace/trace_file.h"

namespace trace = ortmlx::trace;

namespace {

struct Collect : trace::Sink {
  std::vector<trace::Event> events;
  void record(const trace::Event& e) override { events.push_back(e); }
};

trace::Event op_event(const std::string& node, const std::string& op, int64_t dur_ns) {
  trace::Event e;
  e.cat = "op";
  e.name = op;
  e.dur_ns = dur_ns;
  e.args = {{"node", node}};
  return e;
}

}  // namespace

TEST(Trace, SpansReachOnlyAttachedSinks) {
  ASSERT_FALSE(trace::on());
  { trace::Span unheard("phase", "evaluate"); EXPECT_FALSE(unheard.active()); }
  Collect sink;
  trace::attach(&sink);
  int owner = 0;
  {
    const trace::ScopedOwner scope(&owner);
    trace::Span span("phase", "evaluate");
    span.arg("arrays", "3");
    EXPECT_TRUE(span.active());
  }
  trace::counter("mlx_active_bytes", 4096);
  trace::detach(&sink);
  { trace::Span after("phase", "evaluate"); }
  ASSERT_EQ(sink.events.size(), 2u);
  const auto& span = sink.events[0];
  EXPECT_EQ(span.name, "evaluate");
  EXPECT_EQ(span.ph, 'X');
  EXPECT_EQ(span.owner, &owner);
  EXPECT_GE(span.dur_ns, 0);
  EXPECT_GT(span.pid, 0);
  EXPECT_GT(span.tid, 0);
  EXPECT_EQ(sink.events[1].ph, 'C');
  EXPECT_EQ(sink.events[1].owner, nullptr);  // outside the scope
  EXPECT_EQ(trace::to_json(sink.events[1]).find("\"args\":{\"value\":4096}") != std::string::npos, true)
      << trace::to_json(sink.events[1]);
}

TEST(Trace, JsonEscapesAndKeepsNanoseconds) {
  trace::Event e;
  e.cat = "op";
  e.name = "a\"b\\c\nd";
  e.ts_ns = 1234567;
  e.dur_ns = 1500;
  e.args = {{"node", "x\ty"}};
  const auto j = trace::to_json(e);
  EXPECT_NE(j.find("\"name\":\"a\\\"b\\\\c\\nd\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"ts\":1234.567"), std::string::npos) << j;
  EXPECT_NE(j.find("\"dur\":1.500"), std::string::npos) << j;
  EXPECT_NE(j.find("\"node\":\"x y\""), std::string::npos) << j;
}

TEST(Trace, SummaryRanksNodesByTotalTime) {
  std::vector<trace::Event> events = {op_event("a", "MatMul", 3'000'000), op_event("b", "Add", 1'000'000),
                                      op_event("a", "MatMul", 2'000'000), op_event("c", "Relu", 4'000'000)};
  const auto text = trace::TraceFile::summary(events, 2);
  const auto a = text.find("MatMul (a)"), c = text.find("Relu (c)");
  ASSERT_NE(a, std::string::npos) << text;
  ASSERT_NE(c, std::string::npos) << text;
  EXPECT_LT(a, c) << text;  // 5 ms over two calls before 4 ms
  EXPECT_EQ(text.find("Add (b)"), std::string::npos) << text;  // only the top 2
  EXPECT_NE(text.find("graph building only"), std::string::npos) << text;
}

TEST(Trace, FileHoldsTheEventsAndTheSummary) {
  const std::string path = ::testing::TempDir() + "/ortmlx_trace_test.json";
  {
    trace::TraceFile file(path);
    { trace::Span span("op", "MatMul"); span.arg("node", "mm"); span.arg("evaluated", "1"); }
    file.flush();
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const auto text = ss.str();
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", 0), 0u) << text;
  EXPECT_NE(text.find("\"name\":\"MatMul\",\"cat\":\"op\",\"ph\":\"X\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"name\":\"slowest_ops\",\"ph\":\"M\""), std::string::npos) << text;
  EXPECT_NE(text.find("MatMul (mm)"), std::string::npos) << text;
  EXPECT_NE(text.find("each evaluated on its own"), std::string::npos) << text;
  EXPECT_EQ(text.substr(text.size() - 3), "]}\n");
  std::remove(path.c_str());
  EXPECT_FALSE(trace::on());  // the file detached itself
}

TEST(Trace, UnwritablePathIsAnError) {
  EXPECT_THROW(trace::TraceFile("/nonexistent-dir/trace.json"), std::runtime_error);
  EXPECT_FALSE(trace::on());
}
