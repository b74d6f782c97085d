// Engine + translators without ORT: broadcasting rules, compile/eager agreement, error text.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>

#include "engine/program.h"
#include "ops/registry.h"

using namespace ortmlx;
namespace mx = mlx::core;

namespace {

graph::Graph binary_graph(const std::string& op) {
  graph::Graph g;
  graph::Node n;
  n.name = "node0";
  n.op_type = op;
  n.since_version = 17;
  n.inputs = {"a", "b"};
  n.outputs = {"y"};
  g.nodes.push_back(n);
  graph::ValueInfo y;
  y.name = "y";
  y.dtype = graph::DType::Float32;
  g.values["y"] = y;
  return g;
}

engine::HostTensor host(const std::vector<float>& v, std::vector<int64_t> shape) {
  return {graph::DType::Float32, std::move(shape), v.data()};
}

std::vector<float> values(const mx::array& a) {
  return std::vector<float>(a.data<float>(), a.data<float>() + a.size());
}

}  // namespace

TEST(Broadcasting, MultidirectionalLikeNumpy) {
  engine::Program p("p", binary_graph("Add"), {"a", "b"}, {"y"}, {});
  std::vector<float> a = {1, 2};          // shape (2, 1, 1)
  std::vector<float> b = {10, 20, 30};    // shape (3,)
  auto out = p.run({host(a, {2, 1, 1}), host(b, {3})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (mx::Shape{2, 1, 3}));
  EXPECT_EQ(values(out[0]), (std::vector<float>{11, 21, 31, 12, 22, 32}));
}

TEST(Broadcasting, ScalarAndEmpty) {
  engine::Program p("p", binary_graph("Mul"), {"a", "b"}, {"y"}, {});
  std::vector<float> s = {3};
  std::vector<float> none;
  auto out = p.run({host(s, {}), host(none, {0, 4})});
  EXPECT_EQ(out[0].shape(), (mx::Shape{0, 4}));
  auto out2 = p.run({host(s, {}), host(s, {})});
  EXPECT_EQ(out2[0].ndim(), 0u);
  EXPECT_EQ(values(out2[0])[0], 9.f);
}

TEST(Broadcasting, IncompatibleShapesNameTheNode) {
  engine::Program p("fused0", binary_graph("Add"), {"a", "b"}, {"y"}, {});
  std::vector<float> a(6, 1.f), b(4, 1.f);
  try {
    p.run({host(a, {2, 3}), host(b, {4})});
    FAIL() << "expected a shape error";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("node0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2,3]"), std::string::npos) << msg;
  }
}

TEST(Engine, CompiledRunsMatchTheEagerProbe) {
  engine::Options opt;
  opt.compile_after = 2;
  engine::Program p("p", binary_graph("Div"), {"a", "b"}, {"y"}, opt);
  std::vector<float> a = {1, -2, 3, 4}, b = {3, 7};
  auto first = values(p.run({host(a, {2, 2}), host(b, {2})})[0]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(values(p.run({host(a, {2, 2}), host(b, {2})})[0]), first);
  EXPECT_GE(p.stats().compiled_runs.load(), 2u);
  EXPECT_EQ(p.stats().eager_runs.load(), 1u);
}

TEST(Engine, ConstantInitializersAreCopiedAtConstruction) {
  auto g = binary_graph("Sub");
  std::vector<float> c = {1, 2, 3};
  graph::ConstTensor ct;
  ct.dtype = graph::DType::Float32;
  ct.shape = {3};
  ct.data = c.data();
  ct.nbytes = c.size() * sizeof(float);
  g.constants["b"] = ct;
  engine::Program p("p", g, {"a"}, {"y"}, {});
  c = {100, 100, 100};  // the caller's buffer dies after Compile: the program must not see this
  std::vector<float> a = {10, 10, 10};
  EXPECT_EQ(values(p.run({host(a, {3})})[0]), (std::vector<float>{9, 8, 7}));
}

TEST(Shapes, Int64DimsBeyondInt32AreRejected) {
  EXPECT_THROW(ops::to_shape({1, static_cast<int64_t>(INT32_MAX) + 1}), std::invalid_argument);
  EXPECT_EQ(ops::to_shape({2, 3}), (mx::Shape{2, 3}));
}

TEST(Shapes, NegativeAxesNormalise) {
  EXPECT_EQ(ops::norm_axis(-1, 4), 3);
  EXPECT_EQ(ops::norm_axis(0, 0), 0);  // scalars accept axis 0 where ONNX allows it
  EXPECT_THROW(ops::norm_axis(4, 4), std::invalid_argument);
}

TEST(ConstTensor, ReadsHalfAndIntegers) {
  uint16_t h[] = {0x3C00, 0xC000};  // 1.0, -2.0 in fp16
  graph::ConstTensor t;
  t.dtype = graph::DType::Float16;
  t.shape = {2};
  t.data = h;
  EXPECT_EQ(t.to_floats(), (std::vector<double>{1.0, -2.0}));
  int64_t v[] = {-5, 7};
  graph::ConstTensor i;
  i.dtype = graph::DType::Int64;
  i.shape = {2};
  i.data = v;
  EXPECT_EQ(i.to_ints(), (std::vector<int64_t>{-5, 7}));
}

TEST(Registry, EveryEntryHasATranslatorAndIsFindable) {
  for (const auto& e : ops::registry()) {
    EXPECT_NE(e.translate, nullptr) << e.op_type;
    EXPECT_LE(e.min_opset, e.max_opset) << e.op_type;
    EXPECT_EQ(ops::find_op(e.domain, e.op_type, e.min_opset) != nullptr, true) << e.op_type;
  }
}

// EngineHooks::translation_memo: two RotaryEmbedding nodes on the same position ids and caches
// gather the cos/sin rows once per translation (log_level 3 lists the primitives evaluated).
TEST(Engine, RotaryRowsAreGatheredOncePerTranslation) {
  graph::Graph g;
  auto rotary = [&](const std::string& in, const std::string& out) {
    graph::Node n;
    n.name = out;
    n.op_type = "RotaryEmbedding";
    n.domain = "com.microsoft";
    n.since_version = 1;
    n.inputs = {in, "pos", "cos", "sin"};
    n.outputs = {out};
    g.nodes.push_back(n);
    graph::ValueInfo v;
    v.name = out;
    v.dtype = graph::DType::Float32;
    g.values[out] = v;
  };
  rotary("x", "q");
  rotary("q", "k");
  std::vector<float> table(16 * 4);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.1f * static_cast<float>(i));
  for (const char* name : {"cos", "sin"}) {
    graph::ConstTensor ct;
    ct.dtype = graph::DType::Float32;
    ct.shape = {16, 4};
    ct.data = table.data();
    ct.nbytes = table.size() * sizeof(float);
    g.constants[name] = ct;
  }
  engine::Options opt;
  opt.compile = false;
  opt.log_level = 3;
  engine::Program p("p", g, {"x", "pos"}, {"k"}, opt);
  std::vector<float> x(2 * 16, 0.5f);
  std::vector<int64_t> pos = {3, 4};
  testing::internal::CaptureStderr();
  auto y = p.run({host(x, {1, 2, 16}), {graph::DType::Int64, {1, 2}, pos.data()}});
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_NE(log.find("Gather=2 "), std::string::npos) << log;  // cos and sin rows, not 4
  EXPECT_EQ(y[0].shape(), (mx::Shape{1, 2, 16}));
}
