// Sequences and optionals in the engine and the partitioner, without ORT: sequence values in
// value slots and across Loop bodies, sequence/none inputs to a program (keyed by length),
// host-read positions keying compiled replays, and the rule that keeps sequences inside groups.
#include <gtest/gtest.h>

#include <algorithm>

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

void seq_info(graph::Graph& g, const std::string& name, DType elem = DType::Float32) {
  graph::ValueInfo v;
  v.name = name;
  v.is_tensor = false;
  v.kind = graph::ValueInfo::Kind::Sequence;
  v.dtype = elem;
  g.values[name] = v;
}


}  // namespace

TEST(Sequence, SplitThenSequenceAtIsKeyedOnThePosition) {
  graph::Graph g;
  auto split = node("SplitToSequence", {"x"}, {"s"});
  int_attr(split, "keepdims", 0);
  g.nodes.push_back(split);
  g.nodes.push_back(node("SequenceAt", {"s", "p"}, {"y"}));
  seq_info(g, "s");
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program prog("p", g, {"x", "p"}, {"y"}, opt);
  std::vector<float> x = {0, 1, 2, 3, 4, 5};  // [3, 2]
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t p : {0, 2, -2}) {
      std::vector<int64_t> pv = {p};
      auto out = prog.run({host(DType::Float32, x, {3, 2}), host(DType::Int64, pv, {})});
      int64_t row = p < 0 ? p + 3 : p;
      EXPECT_EQ(floats(out[0]), (std::vector<float>{x[2 * row], x[2 * row + 1]}));
      EXPECT_EQ(out[0].shape(), (mx::Shape{2}));
    }
  // p is a small input read on the host: keyed by value, one probe each, then compiled.
  EXPECT_EQ(prog.stats().eager_runs.load(), 3u);
  EXPECT_EQ(prog.stats().compiled_runs.load(), 6u);
}

TEST(Sequence, OutOfRangePositionFails) {
  graph::Graph g;
  g.nodes.push_back(node("SplitToSequence", {"x"}, {"s"}));
  g.nodes.push_back(node("SequenceAt", {"s", "p"}, {"y"}));
  engine::Program prog("p", g, {"x", "p"}, {"y"}, {});
  std::vector<float> x = {1, 2};
  std::vector<int64_t> p = {2};
  EXPECT_THROW(prog.run({host(DType::Float32, x, {2}), host(DType::Int64, p, {})}),
               std::invalid_argument);
}

TEST(Sequence, SequenceInputsAreKeyedByLength) {
  graph::Graph g;
  auto cat = node("ConcatFromSequence", {"s"}, {"y"});
  int_attr(cat, "axis", 0);
  int_attr(cat, "new_axis", 1);
  g.nodes.push_back(cat);
  g.nodes.push_back(node("SequenceLength", {"s"}, {"n"}));
  seq_info(g, "s");
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program prog("p", g, {"s"}, {"y", "n"}, opt);
  std::vector<float> a = {1, 2}, b = {3, 4}, c = {5, 6};
  for (int rep = 0; rep < 2; ++rep)
    for (size_t len : {3u, 1u}) {
      engine::HostTensor s;
      s.kind = engine::HostTensor::Kind::Sequence;
      const std::vector<float>* parts[] = {&a, &b, &c};
      std::vector<float> want;
      for (size_t k = 0; k < len; ++k) {
        s.items.push_back(host(DType::Float32, *parts[k], {2}));
        want.insert(want.end(), parts[k]->begin(), parts[k]->end());
      }
      auto out = prog.run({s});
      EXPECT_EQ(out[0].shape(), (mx::Shape{static_cast<int>(len), 2}));
      EXPECT_EQ(floats(out[0]), want);
      EXPECT_EQ(floats(out[1]), (std::vector<float>{static_cast<float>(len)}));
    }
  EXPECT_EQ(prog.stats().eager_runs.load(), 2u);
  EXPECT_EQ(prog.stats().compiled_runs.load(), 2u);
}

TEST(Sequence, EmptyOptionalInput) {
  graph::Graph g;
  g.nodes.push_back(node("OptionalHasElement", {"o"}, {"h"}));
  engine::Program prog("p", g, {"o"}, {"h"}, {});
  engine::HostTensor none;
  none.kind = engine::HostTensor::Kind::None;
  auto out = prog.run({none});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{0.f}));
  std::vector<float> v = {7};
  out = prog.run({host(DType::Float32, v, {1})});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{1.f}));
}

// seq = []; Loop M times: seq.insert(x + i); y = ConcatFromSequence(seq, axis 0)
TEST(Sequence, LoopCarriesASequence) {
  graph::Graph body, g;
  body.inputs = {"i", "cond_in", "seq_in"};
  body.nodes.push_back(node("Identity", {"cond_in"}, {"cond_out"}));
  auto cast = node("Cast", {"i"}, {"fi"});
  int_attr(cast, "to", static_cast<int64_t>(DType::Float32));
  body.nodes.push_back(cast);
  body.nodes.push_back(node("Add", {"x", "fi"}, {"t"}));
  body.nodes.push_back(node("SequenceInsert", {"seq_in", "t"}, {"seq_out"}));
  body.outputs = {"cond_out", "seq_out"};
  seq_info(body, "seq_in");
  seq_info(body, "seq_out");
  auto empty = node("SequenceEmpty", {}, {"e"});
  g.nodes.push_back(empty);
  auto loop = node("Loop", {"M", "", "e"}, {"s"});
  graph::Attribute a;
  a.type = graph::AttrType::Graph;
  body.is_subgraph = true;
  a.g = std::make_shared<const graph::Graph>(body);
  loop.attrs["body"] = a;
  loop.implicit_inputs = {"x"};
  g.nodes.push_back(loop);
  auto cat = node("ConcatFromSequence", {"s"}, {"y"});
  int_attr(cat, "axis", 0);
  g.nodes.push_back(cat);
  seq_info(g, "e");
  seq_info(g, "s");
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program prog("p", g, {"M", "x"}, {"y"}, opt);
  std::vector<float> x = {10, 20};
  for (int rep = 0; rep < 2; ++rep)
    for (int64_t m : {3, 1}) {
      std::vector<int64_t> mv = {m};
      auto out = prog.run({host(DType::Int64, mv, {}), host(DType::Float32, x, {2})});
      std::vector<float> want;
      for (int64_t i = 0; i < m; ++i) {
        want.push_back(10.f + static_cast<float>(i));
        want.push_back(20.f + static_cast<float>(i));
      }
      EXPECT_EQ(floats(out[0]), want);
    }
  EXPECT_EQ(prog.stats().compiled_runs.load(), 2u);
  // The whole chain is claimable as one group: the sequences never leave it.
  auto r = partition::partition(g, {});
  EXPECT_TRUE(r.declined.empty()) << r.declined[0].reason;
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].size(), 3u);
}

TEST(Sequence, PartitionKeepsSequencesInsideGroups) {
  // x -> SplitToSequence -> s -> SequenceLength (claimed, same group): fine.
  // s is also a graph output: a fused node cannot return it, so the producer is declined.
  graph::Graph g;
  g.nodes.push_back(node("SplitToSequence", {"x"}, {"s"}));
  g.nodes.push_back(node("SequenceLength", {"s"}, {"n"}));
  seq_info(g, "s");
  g.outputs = {"n"};
  auto r = partition::partition(g, {});
  EXPECT_TRUE(r.declined.empty());
  ASSERT_EQ(r.groups.size(), 1u);

  g.outputs = {"n", "s"};
  r = partition::partition(g, {});
  ASSERT_EQ(r.declined.size(), 1u);
  EXPECT_EQ(r.declined[0].node, 0u);
  EXPECT_NE(r.declined[0].reason.find("graph output"), std::string::npos) << r.declined[0].reason;

  // Read by a node the EP cannot run: declined too, with the reader named.
  g.outputs = {"n", "z"};
  g.nodes.push_back(node("NoSuchOp", {"s"}, {"z"}));
  r = partition::partition(g, {});
  ASSERT_EQ(r.declined.size(), 2u);
  EXPECT_EQ(r.declined[1].node, 0u);
  EXPECT_NE(r.declined[1].reason.find("NoSuchOp"), std::string::npos) << r.declined[1].reason;

  // A map is still declined outright.
  graph::ValueInfo m;
  m.name = "mp";
  m.is_tensor = false;
  m.kind = graph::ValueInfo::Kind::Map;
  g.values["mp"] = m;
  g.nodes.push_back(node("Identity", {"mp"}, {"w"}));
  r = partition::partition(g, {});
  auto it = std::find_if(r.declined.begin(), r.declined.end(),
                         [](const partition::Decline& d) { return d.node == 3; });
  ASSERT_NE(it, r.declined.end());
  EXPECT_NE(it->reason.find("a map"), std::string::npos) << it->reason;
}
