// graph/fuse_conv_relu: a Relu that alone reads a Conv's output becomes part of the Conv (the
// Conv takes the Relu's output and the activation attribute); a Conv output read elsewhere, or a
// graph output, keeps its Relu. A program of the rewritten graph gives the same outputs.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "graph/fuse_conv_relu.h"
#include "graph_builders.h"

using namespace ortmlx;
using graph::DType;

namespace {

graph::ConstTensor conv_weight(int64_t m, int64_t c, float scale) {
  std::vector<float> v(static_cast<size_t>(m * c * 9));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (static_cast<float>(i % 7) - 3.f) / 7.f;
  return graph::ConstTensor::from_bytes(DType::Float32, {m, c, 3, 3}, v.data(), v.size() * sizeof(float));
}

graph::Node conv(const std::string& x, const std::string& w, const std::string& y) {
  auto n = test::node("Conv", {x, w}, {y});
  graph::Attribute pads;
  pads.type = graph::AttrType::Ints;
  pads.ints = {1, 1, 1, 1};
  n.attrs["pads"] = pads;
  return n;
}

// x -> conv a -> relu ra (fuses); ra -> conv b -> relu rb, and b is also a graph output (stays);
// ra -> conv c -> relu rc and c also feeds an Add (stays).
graph::Graph sample() {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(conv("x", "w1", "a"));
  g.nodes.push_back(test::node("Relu", {"a"}, {"ra"}));
  g.nodes.push_back(conv("ra", "w2", "b"));
  g.nodes.push_back(test::node("Relu", {"b"}, {"rb"}));
  g.nodes.push_back(conv("ra", "w2", "c"));
  g.nodes.push_back(test::node("Relu", {"c"}, {"rc"}));
  g.nodes.push_back(test::node("Add", {"c", "rc"}, {"d"}));
  g.constants["w1"] = conv_weight(4, 2, 1.f);
  g.constants["w2"] = conv_weight(4, 4, -0.5f);
  g.outputs = {"rb", "b", "d"};
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
  return g;
}

}  // namespace

TEST(FuseConvRelu, OnlyAReluThatAloneReadsTheConv) {
  auto g = sample();
  EXPECT_EQ(graph::fuse_conv_relu(g, g.outputs), 1);
  ASSERT_EQ(g.nodes.size(), 6u);
  EXPECT_EQ(g.nodes[0].op_type, "Conv");
  EXPECT_EQ(g.nodes[0].outputs[0], "ra");
  EXPECT_EQ(g.nodes[0].attr_string(graph::kConvActivation, ""), "Relu");
  for (size_t i = 1; i < g.nodes.size(); ++i) {
    EXPECT_EQ(g.nodes[i].index, i);
    EXPECT_FALSE(g.nodes[i].has_attr(graph::kConvActivation)) << i;
  }
  EXPECT_EQ(graph::fuse_conv_relu(g, g.outputs), 0);  // nothing left to fuse
}

TEST(FuseConvRelu, ProgramGivesTheSameOutputs) {
  const auto g = sample();
  std::vector<float> x(2 * 2 * 5 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 11) / 5.f - 1.f;
  engine::Options on, off;
  off.cpu_dnnl = false;  // no rewrite, MLX's convolutions
  const auto fused = test::run_floats(g, on, x, {2, 2, 5, 5});
  const auto plain = test::run_floats(g, off, x, {2, 2, 5, 5});
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t k = 0; k < fused.size(); ++k) {
    ASSERT_EQ(fused[k].size(), plain[k].size());
    for (size_t i = 0; i < fused[k].size(); ++i) EXPECT_NEAR(fused[k][i], plain[k][i], 1e-4f) << k << " " << i;
  }
}
