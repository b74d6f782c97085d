// Partitioner: convexity and the cycle guard, on hand-built graph views (no ORT).
#include <gtest/gtest.h>

#include "partition/partition.h"

using namespace ortmlx;

namespace {

graph::Node node(std::string name, std::string op, std::vector<std::string> in,
                 std::vector<std::string> out) {
  graph::Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.since_version = 17;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

graph::Graph chain_with_foreign_middle() {
  // a -> A -> B(unsupported) -> C -> out, plus A -> C directly: {A, C} is not convex.
  graph::Graph g;
  g.nodes = {node("A", "Relu", {"x"}, {"a"}), node("B", "Unsupported", {"a"}, {"b"}),
             node("C", "Add", {"a", "b"}, {"c"})};
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
  return g;
}

}  // namespace

TEST(ConvexGroups, SplitsAroundAnUnclaimedNodeOnAPath) {
  auto g = chain_with_foreign_middle();
  auto groups = partition::convex_groups(g, {true, false, true});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], std::vector<size_t>{0});
  EXPECT_EQ(groups[1], std::vector<size_t>{2});
}

TEST(ConvexGroups, MergesAChainWhenAllClaimed) {
  auto g = chain_with_foreign_middle();
  auto groups = partition::convex_groups(g, {true, true, true});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0], (std::vector<size_t>{0, 1, 2}));
}

TEST(ConvexGroups, MergesSiblingsReadingTheSameInput) {
  graph::Graph g;
  g.nodes = {node("A", "Relu", {"x"}, {"a"}), node("B", "Neg", {"x"}, {"b"})};
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
  auto groups = partition::convex_groups(g, {true, true});
  ASSERT_EQ(groups.size(), 1u);
}

TEST(ConvexGroups, NoGroupIsBothUpstreamAndDownstreamOfAnother) {
  // Diamond with a foreign node on one arm: x->A->F(unclaimed)->D, A->B->D. Claimed: A, B, D.
  graph::Graph g;
  g.nodes = {node("A", "Relu", {"x"}, {"a"}), node("F", "Foreign", {"a"}, {"f"}),
             node("B", "Neg", {"a"}, {"b"}), node("D", "Add", {"f", "b"}, {"d"})};
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
  auto groups = partition::convex_groups(g, {true, false, true, true});
  // {A,B,D} would contain F's only path: A->F->D. So D must stay apart from A.
  for (const auto& grp : groups) {
    bool has_a = std::find(grp.begin(), grp.end(), 0) != grp.end();
    bool has_d = std::find(grp.begin(), grp.end(), 3) != grp.end();
    EXPECT_FALSE(has_a && has_d);
  }
  size_t total = 0;
  for (const auto& grp : groups) total += grp.size();
  EXPECT_EQ(total, 3u);
}

TEST(ConvexGroups, CycleInInputClaimsNothing) {
  graph::Graph g;
  g.nodes = {node("A", "Relu", {"b"}, {"a"}), node("B", "Neg", {"a"}, {"b"})};
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
  EXPECT_TRUE(partition::convex_groups(g, {true, true}).empty());
}

TEST(CheckNode, DeclinesUnknownOpsWithAReason) {
  graph::Graph g;
  g.nodes = {node("n", "NoSuchOp", {"x"}, {"y"})};
  auto reason = partition::check_node(g, g.nodes[0], {});
  EXPECT_NE(reason.find("no MLX translator"), std::string::npos) << reason;
}

TEST(CheckNode, DeclinesFloat64OnTheGpuOnly) {
  graph::Graph g;
  g.nodes = {node("n", "Add", {"x", "y"}, {"z"})};
  for (auto name : {"x", "y", "z"}) {
    graph::ValueInfo v;
    v.name = name;
    v.dtype = graph::DType::Float64;
    v.has_shape = true;
    v.dims = {2};
    g.values[name] = v;
  }
  EXPECT_EQ(partition::check_node(g, g.nodes[0], {false}), "");
  EXPECT_NE(partition::check_node(g, g.nodes[0], {true}), "");
}
