// graph/fuse_matmuls: products of one input by constant weights become one product over the
// concatenated weights plus a Split, and a program built from the rewritten graph gives the
// same outputs; weights read elsewhere, a constant left operand, or another K stay apart.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "graph/fuse_matmuls.h"
#include "graph_builders.h"

using namespace ortmlx;
using graph::DType;

namespace {

using test::float_weights;

// x [2, 4] times three weights [4, 3], [4, 5], [4, 2]; a fourth product of x by a weight that
// another node also reads; a fifth by a [3, 2] weight of another K (over the first's output).
graph::Graph sample() {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(test::node("MatMul", {"x", "w1"}, {"a"}));
  g.nodes.push_back(test::node("Relu", {"a"}, {"ra"}));
  g.nodes.push_back(test::node("MatMul", {"x", "w2"}, {"b"}));
  g.nodes.push_back(test::node("MatMul", {"x", "w3"}, {"c"}));
  g.nodes.push_back(test::node("MatMul", {"x", "shared"}, {"d"}));
  g.nodes.push_back(test::node("Add", {"shared", "shared"}, {"e"}));
  g.nodes.push_back(test::node("MatMul", {"a", "w4"}, {"f"}));
  g.constants["w1"] = float_weights(4, 3, 0.5f);
  g.constants["w2"] = float_weights(4, 5, -1.f);
  g.constants["w3"] = float_weights(4, 2, 2.f);
  g.constants["shared"] = float_weights(4, 4, 1.f);
  g.constants["w4"] = float_weights(3, 2, 0.f);
  g.outputs = {"ra", "b", "c", "d", "e", "f"};
  return g;
}

std::vector<std::vector<float>> run(const graph::Graph& g, bool fuse) {
  engine::Options o;
  o.fuse_matmuls = fuse;
  return test::run_floats(g, o, {1, 2, 3, 4, -1, 0.5f, 2, -3}, {2, 4});
}

}  // namespace

TEST(FuseMatmuls, SiblingsBecomeOneProductAndASplit) {
  auto g = sample();
  EXPECT_EQ(graph::fuse_sibling_matmuls(g), 1);
  ASSERT_EQ(g.nodes.size(), 6u);  // 7 - 3 + 2
  EXPECT_EQ(g.nodes[0].op_type, "MatMul");
  EXPECT_EQ(g.nodes[1].op_type, "Split");
  EXPECT_EQ(g.nodes[1].outputs, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(g.nodes[1].attr_ints("split"), (std::vector<int64_t>{3, 5, 2}));
  for (size_t i = 0; i < g.nodes.size(); ++i) EXPECT_EQ(g.nodes[i].index, i);
  const auto* w = g.constant(g.nodes[0].inputs[1]);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 10}));
  // Row 1 of the fused weight: row 1 of w1, then of w2, then of w3.
  const auto* f = static_cast<const float*>(w->data);
  const auto* w1 = static_cast<const float*>(g.constant("w1")->data);
  const auto* w2 = static_cast<const float*>(g.constant("w2")->data);
  const auto* w3 = static_cast<const float*>(g.constant("w3")->data);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(f[10 + j], w1[3 + j]);
  for (int j = 0; j < 5; ++j) EXPECT_EQ(f[13 + j], w2[5 + j]);
  for (int j = 0; j < 2; ++j) EXPECT_EQ(f[18 + j], w3[2 + j]);
  // The product of x by the weight the Add reads, and the one of another K, are untouched.
  EXPECT_EQ(g.nodes[3].inputs[1], "shared");
  EXPECT_EQ(g.nodes[5].inputs[1], "w4");
}

TEST(FuseMatmuls, SameOutputsAsOneProductPerNode) {
  auto fused = run(sample(), true), apart = run(sample(), false);
  ASSERT_EQ(fused.size(), apart.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].size(), apart[i].size()) << i;
    for (size_t j = 0; j < fused[i].size(); ++j) EXPECT_NEAR(fused[i][j], apart[i][j], 1e-5f) << i;
  }
}

TEST(FuseMatmuls, ALoneProductOrAConstantLeftOperandStays) {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(test::node("MatMul", {"x", "w1"}, {"a"}));
  g.nodes.push_back(test::node("MatMul", {"k", "w2"}, {"b"}));
  g.nodes.push_back(test::node("MatMul", {"k", "w3"}, {"c"}));
  g.constants["w1"] = float_weights(4, 3, 0.f);
  g.constants["w2"] = float_weights(4, 3, 0.f);
  g.constants["w3"] = float_weights(4, 3, 0.f);
  g.constants["k"] = float_weights(2, 4, 0.f);
  EXPECT_EQ(graph::fuse_sibling_matmuls(g), 0);
  EXPECT_EQ(g.nodes.size(), 3u);
}
