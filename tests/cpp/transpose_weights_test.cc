// graph/transpose_weights: MatMul weights read only as B get their data stored [N, K], and a
// program built from the rewritten graph (its MatMuls read B through a transposed view) gives
// the same outputs; weights another op reads, graph outputs and constant left operands stay.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
#include "graph/transpose_weights.h"
#include "graph_builders.h"

using namespace ortmlx;
using graph::DType;

namespace {

using test::float_weights;

// x [2, 4] by w1 [4, 3] (twice: two products share it), by w2 [4, 5] that an Add also reads,
// by w3 [4, 2] that is also a graph output; k (constant) by w4.
graph::Graph sample() {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(test::node("MatMul", {"x", "w1"}, {"a"}));
  g.nodes.push_back(test::node("MatMul", {"x", "w1"}, {"a2"}));
  g.nodes.push_back(test::node("MatMul", {"x", "w2"}, {"b"}));
  g.nodes.push_back(test::node("Add", {"w2", "w2"}, {"e"}));
  g.nodes.push_back(test::node("MatMul", {"x", "w3"}, {"c"}));
  g.nodes.push_back(test::node("MatMul", {"k", "w4"}, {"d"}));
  g.nodes.push_back(test::node("Relu", {"a"}, {"ra"}));
  g.constants["w1"] = float_weights(4, 3, 0.5f);
  g.constants["w2"] = float_weights(4, 5, -1.f);
  g.constants["w3"] = float_weights(4, 2, 2.f);
  g.constants["w4"] = float_weights(4, 3, 1.f);
  g.constants["k"] = float_weights(2, 4, 0.f);
  g.outputs = {"ra", "a2", "b", "e", "c", "d", "w3"};
  return g;
}

std::vector<std::vector<float>> run(const graph::Graph& g) {
  return test::run_floats(g, engine::Options{}, {1, 2, 3, 4, -1, 0.5f, 2, -3}, {2, 4});
}

}  // namespace

TEST(TransposeWeights, OnlyWeightsReadAsBAloneAreTransposed) {
  auto g = sample();
  const auto before = sample();
  EXPECT_EQ(graph::transpose_matmul_weights(g, g.outputs), 1);
  const auto* w1 = g.constant("w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_TRUE(w1->transposed);
  EXPECT_EQ(w1->shape, (std::vector<int64_t>{4, 3}));  // the constant's own shape
  const auto* t = static_cast<const float*>(w1->data);
  const auto* o = static_cast<const float*>(before.constant("w1")->data);
  for (int k = 0; k < 4; ++k)
    for (int n = 0; n < 3; ++n) EXPECT_EQ(t[n * 4 + k], o[k * 3 + n]) << k << "," << n;
  for (const char* kept : {"w2", "w3", "w4", "k"}) {
    EXPECT_FALSE(g.constant(kept)->transposed) << kept;
    const auto *a = g.constant(kept), *b = before.constant(kept);
    ASSERT_EQ(a->nbytes, b->nbytes) << kept;
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << kept;
  }
  // A second pass finds every qualifying weight already transposed.
  EXPECT_EQ(graph::transpose_matmul_weights(g, g.outputs), 0);
}

TEST(TransposeWeights, SameOutputsThroughTheTransposedView) {
  auto g = sample();
  ASSERT_EQ(graph::transpose_matmul_weights(g, g.outputs), 1);
  auto rewritten = run(g), plain = run(sample());
  ASSERT_EQ(rewritten.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(rewritten[i].size(), plain[i].size()) << i;
    for (size_t j = 0; j < plain[i].size(); ++j) EXPECT_FLOAT_EQ(rewritten[i][j], plain[i][j]) << i;
  }
}

TEST(TransposeWeights, BlockedTransposeOfOddShapes) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 130}, {67, 65}, {128, 64}}) {
    std::vector<uint16_t> src(static_cast<size_t>(rows * cols)), dst(src.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7 + 3);
    graph::transpose_2d(src.data(), dst.data(), rows, cols, sizeof(uint16_t));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dst[c * rows + r], src[r * cols + c]) << rows << "x" << cols;
  }
}
