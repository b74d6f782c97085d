// Control flow in the engine without ORT: bodies translated through the run_subgraph hook,
// outer-scope values, and which host reads keep a program compiled (keyed on small inputs,
// or not data-dependent at all) versus eager.
#include <gtest/gtest.h>

#include "engine/program.h"
#include "graph_builders.h"
#include "partition/partition.h"

using namespace ortmlx;
namespace mx = mlx::core;
using graph::DType;
using test::floats;
using test::host;
using test::int_attr;
using test::node;

namespace {

void add_graph_attr(graph::Node& n, const std::string& name, graph::Graph g) {
  graph::Attribute a;
  a.type = graph::AttrType::Graph;
  g.is_subgraph = true;
  a.g = std::make_shared<const graph::Graph>(std::move(g));
  n.attrs[name] = a;
}

void set_info(graph::Graph& g, const std::string& name, DType t) {
  graph::ValueInfo v;
  v.name = name;
  v.dtype = t;
  g.values[name] = v;
}

// Keeps the bytes alive for as long as the test (Program copies them at construction anyway).
template <typename T>
graph::ConstTensor scalar_const(T v, DType t) {
  return graph::ConstTensor::from_bytes(t, {}, &v, sizeof(T));
}


// y = If(k > 0) then x + 1 else x * 2; x is read from the outer scope by both branches.
graph::Graph if_graph() {
  graph::Graph then_g, else_g, g;
  then_g.nodes.push_back(node("Add", {"x", "one"}, {"ty"}));
  then_g.constants["one"] = scalar_const(1.f, DType::Float32);
  then_g.outputs = {"ty"};
  else_g.nodes.push_back(node("Mul", {"x", "two"}, {"ey"}));
  else_g.constants["two"] = scalar_const(2.f, DType::Float32);
  else_g.outputs = {"ey"};
  g.nodes.push_back(node("Greater", {"k", "zero"}, {"c"}));
  g.constants["zero"] = scalar_const(int64_t{0}, DType::Int64);
  auto n = node("If", {"c"}, {"y"});
  add_graph_attr(n, "then_branch", then_g);
  add_graph_attr(n, "else_branch", else_g);
  n.implicit_inputs = {"x"};
  g.nodes.push_back(n);
  set_info(g, "y", DType::Float32);
  return g;
}

}  // namespace

TEST(ControlFlow, IfOnSmallInputIsKeyedAndCompiledPerBranch) {
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program p("p", if_graph(), {"k", "x"}, {"y"}, opt);
  std::vector<float> x = {1, 2, 3};
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t k : {5, -5}) {
      std::vector<int64_t> kv = {k};
      auto out = p.run({host(DType::Int64, kv, {}), host(DType::Float32, x, {3})});
      EXPECT_EQ(floats(out[0]), k > 0 ? (std::vector<float>{2, 3, 4}) : (std::vector<float>{2, 4, 6}));
    }
  // One probe per branch (k is keyed by value), compiled replays afterwards.
  EXPECT_EQ(p.stats().eager_runs.load(), 2u);
  EXPECT_EQ(p.stats().compiled_runs.load(), 4u);
}

TEST(ControlFlow, IfOnLargeDataStaysEager) {
  graph::Graph g = if_graph();
  // k becomes ReduceMax(big): a 5000-element input decides the branch.
  g.nodes.insert(g.nodes.begin(), node("ReduceMax", {"big"}, {"k"}));
  int_attr(g.nodes[0], "keepdims", 0);
  engine::Program p("p", g, {"big", "x"}, {"y"}, {});
  std::vector<float> x = {1, 2, 3};
  for (int rep = 0; rep < 3; ++rep)
    for (float v : {1.f, -1.f}) {
      std::vector<float> big(5000, v);
      auto out = p.run({host(DType::Float32, big, {5000}), host(DType::Float32, x, {3})});
      EXPECT_EQ(floats(out[0]), v > 0 ? (std::vector<float>{2, 3, 4}) : (std::vector<float>{2, 4, 6}));
    }
  EXPECT_EQ(p.stats().compiled_runs.load(), 0u);
}

// acc = Loop(M, "", acc0) { row = Slice(x, [i], [i+1]); acc = acc + row; scan = acc }
graph::Graph loop_slice_graph() {
  graph::Graph body, g;
  body.inputs = {"i", "cond_in", "acc_in"};
  body.nodes.push_back(node("Identity", {"cond_in"}, {"cond_out"}));
  body.nodes.push_back(node("Unsqueeze", {"i", "ax"}, {"st"}));
  body.nodes.push_back(node("Add", {"i", "one"}, {"e"}));
  body.nodes.push_back(node("Unsqueeze", {"e", "ax"}, {"en"}));
  body.nodes.push_back(node("Slice", {"x", "st", "en"}, {"row"}));
  body.nodes.push_back(node("Add", {"acc_in", "row"}, {"acc_out"}));
  body.nodes.push_back(node("Identity", {"acc_out"}, {"scan"}));
  std::vector<int64_t> zero = {0};
  body.constants["ax"] = graph::ConstTensor::from_bytes(DType::Int64, {1}, zero.data(), 8);
  body.constants["one"] = scalar_const(int64_t{1}, DType::Int64);
  body.outputs = {"cond_out", "acc_out", "scan"};
  set_info(body, "scan", DType::Float32);  // no shape: a zero-trip stack is [0], as in ORT
  auto n = node("Loop", {"M", "", "acc0"}, {"acc", "scans"});
  add_graph_attr(n, "body", body);
  n.implicit_inputs = {"x"};
  g.nodes.push_back(n);
  return g;
}

TEST(ControlFlow, LoopCounterReadsStayCompiledOnLargeData) {
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program p("p", loop_slice_graph(), {"M", "x", "acc0"}, {"acc", "scans"}, opt);
  const int rows = 2000, cols = 4;  // x has 8000 elements: too large to key on
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  std::vector<float> acc0(cols, 0.f);
  std::vector<int64_t> m = {3};
  for (int rep = 0; rep < 3; ++rep) {
    auto out = p.run({host(DType::Int64, m, {}), host(DType::Float32, x, {rows, cols}),
                      host(DType::Float32, acc0, {1, cols})});
    // rows 0..2 summed
    std::vector<float> want(cols, 0.f);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < cols; ++c) want[c] += x[r * cols + c];
    EXPECT_EQ(floats(out[0]), want);
    EXPECT_EQ(out[1].shape(), (mx::Shape{3, 1, cols}));
  }
  // The slice bounds come from the iteration counter (host-known), not from x's data.
  EXPECT_EQ(p.stats().eager_runs.load(), 1u);
  EXPECT_EQ(p.stats().compiled_runs.load(), 2u);
}

TEST(ControlFlow, LoopZeroIterationsPassesStateThrough) {
  engine::Program p("p", loop_slice_graph(), {"M", "x", "acc0"}, {"acc", "scans"}, {});
  std::vector<float> x(8, 1.f), acc0 = {5, 6, 7, 8};
  std::vector<int64_t> m = {0};
  auto out = p.run({host(DType::Int64, m, {}), host(DType::Float32, x, {2, 4}),
                    host(DType::Float32, acc0, {1, 4})});
  EXPECT_EQ(floats(out[0]), acc0);
  EXPECT_EQ(out[1].shape()[0], 0);
}

TEST(ControlFlow, PartitionDeclinesAControlFlowNodeWithAnUnsupportedBodyNode) {
  graph::Graph g = if_graph();
  graph::Graph bad;
  bad.nodes.push_back(node("NoSuchOp", {"x"}, {"z"}));
  bad.outputs = {"z"};
  add_graph_attr(g.nodes[1], "else_branch", bad);
  auto r = partition::partition(g, {});
  ASSERT_EQ(r.declined.size(), 1u);
  EXPECT_EQ(r.declined[0].node, 1u);
  EXPECT_NE(r.declined[0].reason.find("NoSuchOp"), std::string::npos) << r.declined[0].reason;
  EXPECT_NE(r.declined[0].reason.find("else_branch"), std::string::npos) << r.declined[0].reason;
}

TEST(ControlFlow, ImplicitInputsOrderTheGroups) {
  // a -> [declined] -> b, and an If reading b only inside its body: the If may not be fused
  // with a node before the declined one into one group (the group would not be convex).
  graph::Graph g;
  g.nodes.push_back(node("Relu", {"in"}, {"a"}));
  g.nodes.push_back(node("NoSuchOp", {"a"}, {"b"}));
  graph::Graph then_g, else_g;
  then_g.nodes.push_back(node("Neg", {"b"}, {"t"}));
  then_g.outputs = {"t"};
  else_g.nodes.push_back(node("Abs", {"b"}, {"e"}));
  else_g.outputs = {"e"};
  auto n = node("If", {"c"}, {"y"});
  add_graph_attr(n, "then_branch", then_g);
  add_graph_attr(n, "else_branch", else_g);
  n.implicit_inputs = {"b"};
  g.nodes.push_back(n);
  g.nodes.push_back(node("Add", {"y", "a"}, {"z"}));
  auto r = partition::partition(g, {});
  for (const auto& grp : r.groups) {
    bool has_relu = std::find(grp.begin(), grp.end(), 0u) != grp.end();
    bool has_if = std::find(grp.begin(), grp.end(), 2u) != grp.end();
    EXPECT_FALSE(has_relu && has_if);
  }
}
