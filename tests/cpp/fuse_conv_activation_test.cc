// graph/fuse_conv_activation: the activation steps after a Conv become part of the Conv (the Conv
// takes the last step's output and the activation attributes): Relu, a scalar Mul/Add, Clip,
// HardSigmoid, HardSwish as ONNX's op and as exporters write it (v * Clip(v + 3, 0, 6) / 6),
// Sigmoid and Mul(v, Sigmoid(v)). A value read elsewhere, a graph output, a per-channel constant
// or a HardSigmoid that scales another tensor stops the chain. A program of the rewritten graph
// gives the same outputs as MLX's unfused nodes.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "graph/fuse_conv_activation.h"
#include "graph_builders.h"

using namespace ortmlx;
using graph::ConvActivation;
using graph::DType;
using Kind = ConvActivation::Kind;

namespace {

graph::ConstTensor conv_weight(int64_t m, int64_t c, float scale) {
  std::vector<float> v(static_cast<size_t>(m * c * 9));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (static_cast<float>(i % 7) - 3.f) / 7.f;
  return graph::ConstTensor::from_bytes(DType::Float32, {m, c, 3, 3}, v.data(), v.size() * sizeof(float));
}

graph::ConstTensor scalar(float v, std::vector<int64_t> shape = {}) {
  std::vector<float> d(static_cast<size_t>(shape.empty() ? 1 : shape[0]), v);
  return graph::ConstTensor::from_bytes(DType::Float32, shape, d.data(), d.size() * sizeof(float));
}

graph::Node conv(const std::string& x, const std::string& w, const std::string& y) {
  auto n = test::node("Conv", {x, w}, {y});
  graph::Attribute pads;
  pads.type = graph::AttrType::Ints;
  pads.ints = {1, 1, 1, 1};
  n.attrs["pads"] = pads;
  return n;
}

graph::Node with_float(graph::Node n, const std::string& name, float v) {
  graph::Attribute a;
  a.type = graph::AttrType::Float;
  a.f = v;
  n.attrs[name] = a;
  return n;
}

void finish(graph::Graph& g) {
  g.constants["w1"] = conv_weight(4, 2, 1.f);
  g.constants["w2"] = conv_weight(4, 4, -0.5f);
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].index = i;
}

// x -> conv a -> relu ra (fuses); ra -> conv b -> relu rb, and b is also a graph output (stays);
// ra -> conv c -> relu rc and c also feeds an Add (stays).
graph::Graph relus() {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(conv("x", "w1", "a"));
  g.nodes.push_back(test::node("Relu", {"a"}, {"ra"}));
  g.nodes.push_back(conv("ra", "w2", "b"));
  g.nodes.push_back(test::node("Relu", {"b"}, {"rb"}));
  g.nodes.push_back(conv("ra", "w2", "c"));
  g.nodes.push_back(test::node("Relu", {"c"}, {"rc"}));
  g.nodes.push_back(test::node("Add", {"c", "rc"}, {"d"}));
  g.outputs = {"rb", "b", "d"};
  finish(g);
  return g;
}

// conv a -> * 0.9 -> + 0.5 (into a's weight and bias) -> hard-swish (Add 3, Clip 0..6, Mul, Div
// 6) -> conv b -> HardSigmoid (fuses) and conv c -> Sigmoid, Mul(c, sigmoid) (Swish); conv e ->
// Mul by a per-channel constant (into e's weight and bias); conv f -> HardSigmoid (fuses) that
// gates e's product, a Mul of two tensors (stays).
graph::Graph mobile() {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(conv("x", "w1", "a"));
  g.nodes.push_back(test::node("Mul", {"k09", "a"}, {"a1"}));
  g.nodes.push_back(test::node("Add", {"a1", "k05"}, {"a2"}));
  g.nodes.push_back(test::node("Add", {"a2", "k3"}, {"t"}));
  g.nodes.push_back(test::node("Clip", {"t", "k0", "k6"}, {"tc"}));
  g.nodes.push_back(test::node("Mul", {"a2", "tc"}, {"m"}));
  g.nodes.push_back(test::node("Div", {"m", "k6"}, {"hs"}));
  g.nodes.push_back(conv("hs", "w2", "b"));
  g.nodes.push_back(with_float(with_float(test::node("HardSigmoid", {"b"}, {"bh"}), "alpha", 0.2f), "beta", 0.5f));
  g.nodes.push_back(conv("hs", "w2", "c"));
  g.nodes.push_back(test::node("Sigmoid", {"c"}, {"cs"}));
  g.nodes.push_back(test::node("Mul", {"c", "cs"}, {"sw"}));
  g.nodes.push_back(conv("hs", "w2", "e"));
  g.nodes.push_back(test::node("Mul", {"e", "kc"}, {"ec"}));
  g.nodes.push_back(conv("hs", "w2", "f"));
  g.nodes.push_back(with_float(test::node("HardSigmoid", {"f"}, {"fh"}), "alpha", 1.f / 6.f));
  g.nodes.push_back(test::node("Mul", {"ec", "fh"}, {"se"}));
  g.outputs = {"bh", "sw", "se"};
  g.constants["k09"] = scalar(0.9f, {1});
  g.constants["k05"] = scalar(0.5f, {1});
  g.constants["k3"] = scalar(3.f);
  g.constants["k0"] = scalar(0.f);
  g.constants["k6"] = scalar(6.f);
  g.constants["kc"] = scalar(1.5f, {4, 1, 1});
  finish(g);
  return g;
}

void expect_same_outputs(const graph::Graph& g, int64_t min_flops = 0) {
  SCOPED_TRACE("cpu_dnnl_min_flops " + std::to_string(min_flops));
  std::vector<float> x(2 * 2 * 5 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 11) / 5.f - 1.f;
  engine::Options on, off;
  off.cpu_dnnl = false;  // no rewrite, MLX's convolutions and nodes
  on.cpu_dnnl_min_flops = min_flops;  // 0: these small convolutions through oneDNN too
  const auto fused = test::run_floats(g, on, x, {2, 2, 5, 5});
  const auto plain = test::run_floats(g, off, x, {2, 2, 5, 5});
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t k = 0; k < fused.size(); ++k) {
    ASSERT_EQ(fused[k].size(), plain[k].size());
    for (size_t i = 0; i < fused[k].size(); ++i) EXPECT_NEAR(fused[k][i], plain[k][i], 1e-4f) << k << " " << i;
  }
}

}  // namespace

TEST(FuseConvActivation, OnlyAReluThatAloneReadsTheConv) {
  auto g = relus();
  EXPECT_EQ(graph::fuse_conv_activation(g, g.outputs), 1);
  ASSERT_EQ(g.nodes.size(), 6u);
  EXPECT_EQ(g.nodes[0].op_type, "Conv");
  EXPECT_EQ(g.nodes[0].outputs[0], "ra");
  const auto steps = graph::conv_activations(g.nodes[0]);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, Kind::Relu);
  for (size_t i = 1; i < g.nodes.size(); ++i) {
    EXPECT_EQ(g.nodes[i].index, i);
    EXPECT_TRUE(graph::conv_activations(g.nodes[i]).empty()) << i;
  }
  EXPECT_EQ(graph::fuse_conv_activation(g, g.outputs), 0);  // nothing left to fuse
}

TEST(FuseConvActivation, MobilePatterns) {
  auto g = mobile();
  EXPECT_EQ(graph::fuse_conv_activation(g, g.outputs), 6 + 1 + 2 + 1 + 1);
  std::map<std::string, const graph::Node*> conv_of;  // by output
  for (const auto& n : g.nodes)
    if (n.op_type == "Conv") conv_of[n.outputs[0]] = &n;
  ASSERT_TRUE(conv_of.count("hs") && conv_of.count("bh") && conv_of.count("sw") && conv_of.count("ec") &&
              conv_of.count("fh"));
  // a's affine in its new weight (0.9 w1) and bias (0.5), the hard-swish its one step
  const graph::Node& a_conv = *conv_of["hs"];
  ASSERT_EQ(a_conv.inputs.size(), 3u);
  const auto* w = g.constant(a_conv.inputs[1]);
  const auto* bias = g.constant(a_conv.inputs[2]);
  ASSERT_TRUE(w && bias);
  EXPECT_EQ(w->shape, g.constant("w1")->shape);
  for (int64_t i = 0; i < w->numel(); ++i) EXPECT_FLOAT_EQ(w->float_at(i), 0.9f * g.constant("w1")->float_at(i));
  ASSERT_EQ(bias->numel(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(bias->float_at(i), 0.5f);
  auto a = graph::conv_activations(a_conv);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::HardSwish);
  auto b = graph::conv_activations(*conv_of["bh"]);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].kind, Kind::HardSigmoid);
  EXPECT_FLOAT_EQ(b[0].a, 0.2f);
  auto c = graph::conv_activations(*conv_of["sw"]);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].kind, Kind::Swish);
  EXPECT_TRUE(graph::conv_activations(*conv_of["ec"]).empty());  // the per-channel scale in its weight
  const auto* we = g.constant(conv_of["ec"]->inputs[1]);
  ASSERT_TRUE(we);
  for (int64_t i = 0; i < we->numel(); ++i) EXPECT_FLOAT_EQ(we->float_at(i), 1.5f * g.constant("w2")->float_at(i));
  auto f = graph::conv_activations(*conv_of["fh"]);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, Kind::HardSigmoid);
  EXPECT_FLOAT_EQ(f[0].a, 1.f / 6.f);
  EXPECT_FLOAT_EQ(f[0].b, 0.5f);
  int muls = 0;
  for (const auto& n : g.nodes) muls += n.op_type == "Mul";
  EXPECT_EQ(muls, 1);  // the gate
}

// A hard-swish whose Div constant has more dims than the Conv (its output gains a dim) stays nodes.
TEST(FuseConvActivation, ConstantsOfHigherRankStay) {
  graph::Graph g;
  g.inputs = {"x"};
  g.nodes.push_back(conv("x", "w1", "a"));
  g.nodes.push_back(test::node("Add", {"a", "k3"}, {"t"}));
  g.nodes.push_back(test::node("Clip", {"t", "k0", "k6"}, {"tc"}));
  g.nodes.push_back(test::node("Mul", {"a", "tc"}, {"m"}));
  g.nodes.push_back(test::node("Div", {"m", "k6r5"}, {"hs"}));
  g.outputs = {"hs"};
  g.constants["k3"] = scalar(3.f);
  g.constants["k0"] = scalar(0.f);
  g.constants["k6"] = scalar(6.f);
  std::vector<float> six{6.f};
  g.constants["k6r5"] = graph::ConstTensor::from_bytes(DType::Float32, {1, 1, 1, 1, 1}, six.data(), sizeof(float));
  finish(g);
  EXPECT_EQ(graph::fuse_conv_activation(g, g.outputs), 0);
  EXPECT_EQ(g.nodes.size(), 5u);
}

TEST(FuseConvActivation, ProgramGivesTheSameOutputs) {
  expect_same_outputs(relus());
  expect_same_outputs(mobile());
  expect_same_outputs(mobile(), int64_t{1} << 40);  // fused, but MLX's convolutions
}
