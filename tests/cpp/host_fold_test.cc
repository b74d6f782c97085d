// Host folding (engine/host_fold/host_fold.h) against the op translators it stands in for: the same node on
// the same small integer inputs must give the same dtype, shape and values both ways (the
// translators are checked against ORT by the conformance runner and the Python oracle). Cases
// the fold refuses must be ones the translator rejects or that this file says are not covered.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "graph_builders.h"
#include "ops/common.h"
#include "engine/host_fold/host_fold.h"
#include "ops/op_context.h"
#include "ops/registry.h"

namespace mx = mlx::core;
using ortmlx::graph::Attribute;
using ortmlx::graph::AttrType;
using ortmlx::graph::Graph;
using ortmlx::graph::Node;
using ortmlx::ops::fold_on_host;

namespace {

using Inputs = std::vector<std::optional<mx::array>>;

mx::array ints(std::vector<int64_t> v, mx::Shape shape, mx::Dtype t = mx::int64) {
  return mx::astype(mx::array(v.begin(), std::move(shape), mx::int64), t);
}

mx::array evaluated(mx::array a) {
  a = mx::contiguous(a);
  a.eval();
  return a;
}

void ints_attr(Node& n, const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.type = AttrType::Ints;
  a.ints = std::move(v);
  n.attrs[name] = a;
}

// Folds `n` and translates it; both must agree (or the fold refuse, when `must_fold` is false).
void expect_same(const Node& n, Inputs in, bool must_fold = true) {
  for (auto& a : in)
    if (a) a = evaluated(*a);
  Graph g;
  auto folded = fold_on_host(n, in);
  if (!folded) {
    EXPECT_FALSE(must_fold) << n.op_type << " was not folded";
    return;
  }
  const auto* entry = ortmlx::ops::find_op(n.domain, n.op_type, n.since_version);
  ASSERT_NE(entry, nullptr) << n.op_type;
  ortmlx::ops::OpContext ctx(n, g, in, mx::default_stream(mx::Device::cpu), nullptr);
  auto want = entry->translate(ctx);
  ASSERT_EQ(folded->size(), 1u);
  const mx::array& got = (*folded)[0];
  EXPECT_TRUE(got.is_available()) << n.op_type;
  ASSERT_EQ(got.dtype(), want[0].dtype()) << n.op_type;
  ASSERT_EQ(got.shape(), want[0].shape()) << n.op_type;
  EXPECT_TRUE(mx::array_equal(got, want[0]).item<bool>()) << n.op_type;
}

Node op(const std::string& type, size_t inputs, int opset = 21) {
  std::vector<std::string> in;
  for (size_t i = 0; i < inputs; ++i) in.push_back("x" + std::to_string(i));
  return ortmlx::test::node(type, in, {"y"}, opset);
}

}  // namespace

TEST(HostFold, ShapeChainsOfExporters) {
  // Shape -> Gather -> Unsqueeze -> Concat -> Reshape's target, as torch.onnx writes it.
  auto shape = ints({2, 7, 16, 64}, {4});
  auto g = op("Gather", 2);
  expect_same(g, {shape, ints({1}, {})});   // scalar index: a scalar out
  expect_same(g, {shape, ints({-1, 0}, {2})});
  auto u = op("Unsqueeze", 2);
  expect_same(u, {ints({7}, {}), ints({0}, {1})});
  expect_same(u, {ints({3, 4}, {2}), ints({-1, 0}, {2})});
  auto u11 = op("Unsqueeze", 1, 11);
  ints_attr(u11, "axes", {0});
  expect_same(u11, {ints({7}, {})});
  auto c = op("Concat", 3);
  ortmlx::test::int_attr(c, "axis", 0);
  expect_same(c, {ints({2}, {1}), ints({-1}, {1}), ints({16, 64}, {2})});
  auto r = op("Reshape", 2);
  expect_same(r, {ints({1, 2, 3, 4, 5, 6}, {6}), ints({2, -1}, {2})});
  expect_same(r, {ints({1, 2, 3, 4, 5, 6}, {2, 3}), ints({0, 3, 1}, {3})});
  auto s = op("Squeeze", 2);
  expect_same(s, {ints({5}, {1}), ints({0}, {1})});
  expect_same(op("Squeeze", 1), {ints({5, 6}, {1, 2, 1})});
}

TEST(HostFold, ArithmeticComparisonsAndWhere) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> d(-20, 20);
  auto rand_ints = [&](mx::Shape s, mx::Dtype t) {
    std::vector<int64_t> v;
    size_t n = 1;
    for (int k : s) n *= static_cast<size_t>(k);
    for (size_t i = 0; i < n; ++i) v.push_back(d(rng));
    return ints(v, s, t);
  };
  for (auto t : {mx::int64, mx::int32, mx::int8}) {
    auto a = rand_ints({2, 3}, t), b = rand_ints({3}, t);
    for (const char* name : {"Add", "Sub", "Mul", "Max", "Min"}) expect_same(op(name, 2), {a, b});
    for (const char* name : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
      expect_same(op(name, 2), {a, b});
    expect_same(op("Neg", 1), {a});
    expect_same(op("Abs", 1), {a});
    auto nonzero = mx::where(mx::equal(b, mx::array(0, t)), mx::array(3, t), b);
    expect_same(op("Div", 2), {a, nonzero});  // truncation toward zero, as ORT divides
    expect_same(op("Where", 3), {mx::greater(a, mx::array(0, t)), a, mx::array(-1, t)});
  }
  // int32 overflow wraps as ORT's kernels do
  expect_same(op("Mul", 2), {ints({1 << 20}, {1}, mx::int32), ints({1 << 15}, {1}, mx::int32)});
  // refused: a zero divisor (the translator's business), a float input that is not an integer
  EXPECT_FALSE(fold_on_host(op("Div", 2), {evaluated(ints({4}, {1})), evaluated(ints({0}, {1}))}));
  EXPECT_FALSE(fold_on_host(op("Add", 2), {evaluated(mx::array({1.5f})), evaluated(mx::array({1.f}))}));
  auto b1 = mx::array({true, false, true}), b2 = mx::array({true, true, false});
  for (const char* name : {"And", "Or", "Xor"}) expect_same(op(name, 2), {b1, b2});
  expect_same(op("Not", 1), {b1});
}

TEST(HostFold, SliceRangeExpandCastConstantOfShape) {
  auto v = ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  auto sl = op("Slice", 5);
  expect_same(sl, {v, ints({1}, {1}), ints({INT64_MAX}, {1}), ints({1}, {1}), ints({2}, {1})});
  expect_same(sl, {v, ints({-1, -2}, {2}), ints({-100, 0}, {2}), ints({0, 1}, {2}), ints({-1, -1}, {2})});
  expect_same(sl, {v, ints({3}, {1}), ints({0}, {1}), ints({1}, {1}), ints({-2}, {1})});
  expect_same(sl, {v, ints({0, 0}, {2}), ints({3, 4}, {2}), ints({0, 1}, {2}), ints({2, 3}, {2})});
  expect_same(op("Slice", 3), {ints({2, 7, 16, 64}, {4}), ints({-1}, {1}), ints({INT64_MAX}, {1})});
  expect_same(sl, {ints({}, {0}), ints({-1}, {1}), ints({INT64_MIN}, {1}), ints({0}, {1}), ints({-1}, {1})});
  auto rg = op("Range", 3);
  expect_same(rg, {ints({3}, {}), ints({17}, {}), ints({4}, {})});
  expect_same(rg, {ints({5}, {}, mx::int32), ints({-6}, {}, mx::int32), ints({-3}, {}, mx::int32)});
  expect_same(rg, {ints({5}, {}), ints({5}, {}), ints({1}, {})});
  expect_same(op("Expand", 2), {ints({1, 2, 3}, {3, 1}), ints({2, 1, 4}, {3})});
  for (auto to : {ortmlx::graph::DType::Int32, ortmlx::graph::DType::Bool, ortmlx::graph::DType::UInt8}) {
    auto c = op("Cast", 1);
    ortmlx::test::int_attr(c, "to", static_cast<int64_t>(to));
    expect_same(c, {ints({-300, 0, 7, 1000}, {4})});
  }
  auto cs = op("ConstantOfShape", 1);
  Attribute value;
  value.type = AttrType::Tensor;
  const int64_t one = 1;
  value.t = std::make_shared<ortmlx::graph::ConstTensor>(
      ortmlx::graph::ConstTensor::from_bytes(ortmlx::graph::DType::Int64, {1}, &one, sizeof(one)));
  cs.attrs["value"] = value;
  expect_same(cs, {ints({2, 3}, {2})});
  // float32 zeros by default: left to the translator
  EXPECT_FALSE(fold_on_host(op("ConstantOfShape", 1), {evaluated(ints({2, 3}, {2}))}));
}

TEST(HostFold, ReduceSumOverIntegers) {
  auto mask = ints({1, 1, 1, 0, 1, 1, 0, 0}, {2, 4});
  auto r = op("ReduceSum", 2);
  expect_same(r, {mask, ints({1}, {1})});
  expect_same(r, {mask, ints({-1, 0, 1}, {3})});
  expect_same(op("ReduceSum", 1), {ints({5, -7, 9}, {3}, mx::int32)});  // all axes
  auto keep0 = op("ReduceSum", 2);
  ortmlx::test::int_attr(keep0, "keepdims", 0);
  expect_same(keep0, {mask, ints({0}, {1})});
  auto noop = op("ReduceSum", 1);
  ortmlx::test::int_attr(noop, "noop_with_empty_axes", 1);
  expect_same(noop, {mask});
  auto old = op("ReduceSum", 1, 11);
  ints_attr(old, "axes", {1});
  expect_same(old, {mask});
}

TEST(HostFold, RefusesWhatItDoesNotCover) {
  auto g = op("Gather", 2);
  EXPECT_FALSE(fold_on_host(g, {evaluated(ints({1, 2}, {2})), evaluated(ints({5}, {}))}));  // out of range
  // too large, and not yet evaluated
  EXPECT_FALSE(fold_on_host(op("Identity", 1), {evaluated(mx::zeros({5000}, mx::int64))}));
  EXPECT_FALSE(fold_on_host(op("Identity", 1), {mx::add(ints({1}, {1}), ints({1}, {1}))}));
  auto other = op("Add", 2);
  other.domain = "com.microsoft";
  EXPECT_FALSE(fold_on_host(other, {evaluated(ints({1}, {1})), evaluated(ints({1}, {1}))}));
}

// Floats are folded while every value is an integer the dtype holds exactly: an exporter's
// additive mask, (1 - Cast(mask)) -> Where(bool, -65504, 0) in fp16, as onnxruntime-genai
// writes it. Each step must equal the translator's result.
TEST(HostFold, IntegralFloatsOfAMaskBias) {
  auto mask = ints({0, 1, 1, 1, 1, 1}, {1, 1, 1, 6});
  auto to_f16 = op("Cast", 1);
  ortmlx::test::int_attr(to_f16, "to", static_cast<int64_t>(ortmlx::graph::DType::Float16));
  expect_same(to_f16, {mask});
  auto mask_h = evaluated(mx::astype(mask, mx::float16));
  auto one_minus = mx::subtract(mx::array(1.f, mx::float16), mask_h);
  expect_same(op("Sub", 2), {mx::array(1.f, mx::float16), mask_h});
  auto to_bool = op("Cast", 1);
  ortmlx::test::int_attr(to_bool, "to", static_cast<int64_t>(ortmlx::graph::DType::Bool));
  expect_same(to_bool, {one_minus});
  auto padded = evaluated(mx::astype(one_minus, mx::bool_));
  auto zero_h = mx::array(0.f, mx::float16), lowest_h = mx::array(-65504.f, mx::float16);
  expect_same(op("Where", 3), {padded, lowest_h, zero_h});
  auto bias = evaluated(mx::where(padded, lowest_h, zero_h));
  expect_same(op("Add", 2), {bias, evaluated(mx::zeros({1, 1, 1, 6}, mx::float16))});
  for (auto t : {mx::float32, mx::bfloat16, mx::float16}) {
    auto a = mx::astype(mx::array({3.f, -4.f, 0.f, 12.f}), t), b = mx::astype(mx::array({3.f, 2.f, 5.f, -6.f}), t);
    for (const char* name : {"Add", "Sub", "Max", "Min", "Equal", "Less", "Abs"})
      expect_same(op(name, name == std::string("Abs") ? 1 : 2), {a, b});
    expect_same(op("Div", 2), {mx::astype(mx::array({12.f, -6.f}), t), mx::astype(mx::array({3.f, 2.f}), t)});
    expect_same(op("Neg", 1), {mx::astype(mx::array({3.f, -4.f}), t)});
  }
  expect_same(op("Range", 3), {mx::array(2.f), mx::array(11.f), mx::array(3.f)});
  auto to_i32 = op("Cast", 1);
  ortmlx::test::int_attr(to_i32, "to", static_cast<int64_t>(ortmlx::graph::DType::Int32));
  expect_same(to_i32, {mx::array({-7.f, 0.f, 100000.f})});
}

TEST(HostFold, RefusesFloatResultsAKernelWouldRound) {
  auto f = [](std::vector<float> v, mx::Dtype t = mx::float32) {
    return evaluated(mx::astype(mx::array(v.begin(), {static_cast<int>(v.size())}), t));
  };
  EXPECT_FALSE(fold_on_host(op("Div", 2), {f({1.f}), f({2.f})}));                    // a fraction
  EXPECT_FALSE(fold_on_host(op("Mul", 2), {f({0.f}), f({-1.f})}));                   // -0
  EXPECT_FALSE(fold_on_host(op("Neg", 1), {f({0.f})}));                              // -0
  EXPECT_FALSE(fold_on_host(op("Identity", 1), {f({-0.f})}));                        // -0 given
  EXPECT_FALSE(fold_on_host(op("Add", 2), {f({-65504.f}, mx::float16), f({-65504.f}, mx::float16)}));  // -inf
  EXPECT_FALSE(fold_on_host(op("Mul", 2), {f({4097.f}), f({4097.f})}));              // float32 rounds it
  EXPECT_FALSE(fold_on_host(op("Identity", 1), {evaluated(mx::array({INFINITY}))}));
  auto to_f16 = op("Cast", 1);
  ortmlx::test::int_attr(to_f16, "to", static_cast<int64_t>(ortmlx::graph::DType::Float16));
  EXPECT_FALSE(fold_on_host(to_f16, {evaluated(ints({2049}, {1}))}));               // fp16 rounds it
  auto to_i8 = op("Cast", 1);
  ortmlx::test::int_attr(to_i8, "to", static_cast<int64_t>(ortmlx::graph::DType::Int8));
  EXPECT_FALSE(fold_on_host(to_i8, {f({300.f})}));                                  // out of range
  EXPECT_FALSE(fold_on_host(op("ReduceSum", 1), {f({1.f, 2.f})}));                  // summation order
  EXPECT_FALSE(fold_on_host(op("Gather", 2), {evaluated(ints({1, 2}, {2})), f({0.f})}));  // float indices
  EXPECT_FALSE(fold_on_host(op("Reshape", 2), {f({1.f, 2.f}), f({2.f})}));          // float shape
}

// known_all_zero (ops/common.h): an all-zero value the host folded stays known through the
// views, casts and broadcasts a Tile or an Unsqueeze builds; arithmetic, or data that is not
// zero, or a value nothing evaluated, is not known.
TEST(KnownAllZero, FollowsViewsOfEvaluatedZeros) {
  using ortmlx::ops::known_all_zero;
  auto zeros = evaluated(mx::zeros({1, 1, 1, 6}, mx::float16));
  EXPECT_TRUE(known_all_zero(zeros));
  EXPECT_TRUE(known_all_zero(mx::tile(zeros, {1, 4, 1, 1})));
  EXPECT_TRUE(known_all_zero(mx::astype(mx::expand_dims(mx::reshape(zeros, {6}), 0), mx::float32)));
  EXPECT_TRUE(known_all_zero(mx::concatenate({zeros, mx::broadcast_to(zeros, {1, 1, 2, 6})}, 2)));
  EXPECT_TRUE(known_all_zero(mx::pad(zeros, {3}, {0}, {2}, mx::array(0.f, mx::float16))));
  auto padded = evaluated(mx::astype(mx::array({-65504.f, 0.f, 0.f}), mx::float16));
  EXPECT_FALSE(known_all_zero(padded));
  EXPECT_FALSE(known_all_zero(mx::tile(padded, {4})));
  EXPECT_FALSE(known_all_zero(mx::pad(zeros, {3}, {0}, {2}, mx::array(-1.f, mx::float16))));
  EXPECT_FALSE(known_all_zero(mx::multiply(zeros, mx::array(2.f, mx::float16))));  // arithmetic
  EXPECT_FALSE(known_all_zero(mx::zeros({4}, mx::float32)));                       // not evaluated
  EXPECT_FALSE(known_all_zero(evaluated(mx::zeros({70000}, mx::float32))));        // too large to scan
}
