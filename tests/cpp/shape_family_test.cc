// The shape family's planning (engine/shape_family.h) and the signature cache
// (engine/signature_cache.h) on synthetic steps: no graph is translated here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/shape_family.h"
#include "engine/signature_cache.h"

using namespace ortmlx;
using engine::Plan;
using engine::ShapeFamily;
using engine::StepIO;
namespace mx = mlx::core;

namespace {

// A plan of steps over slots [0, num_inputs) (the inputs) and the steps' outputs.
Plan plan(std::vector<StepIO> steps, size_t num_inputs, size_t num_slots, std::vector<int> outputs) {
  Plan p;
  p.steps = std::move(steps);
  p.num_inputs = num_inputs;
  p.num_slots = num_slots;
  p.output_slots = std::move(outputs);
  return p;
}

StepIO step(std::vector<int> in, std::vector<int> out) { return {std::move(in), std::move(out), {}}; }

ShapeFamily::StepInfo fixed(std::vector<mx::Shape> shapes) { return {true, false, std::move(shapes)}; }
ShapeFamily::StepInfo host(std::vector<mx::Shape> shapes) { return {false, true, std::move(shapes)}; }
ShapeFamily::StepInfo eager(std::vector<mx::Shape> shapes) { return {false, false, std::move(shapes)}; }

const ShapeFamily::IsConstant no_constants = [](int) { return false; };

// A decode step's pattern: A (fixed, reads input 0) -> slot 2; H (host arithmetic on input 1,
// the growing past) -> slot 3; B (fixed, reads A) -> slot 4; C (the past appended, reads H and
// B) -> slot 5, the output. In plan order H cuts A and B apart.
Plan decode_plan() {
  return plan({step({0}, {2}), step({1}, {3}), step({2}, {4}), step({1, 3, 4}, {5})}, 2, 6, {5});
}

ShapeFamily::StepInfos decode_steps(int past) {
  return {fixed({{1, 8}, {1, 8}}), host({{1, past, 8}, {3}}), fixed({{1, 8}, {1, 8}}),
          eager({{1, past, 8}, {3}, {1, 8}, {1, past + 1, 8}})};
}

}  // namespace

TEST(StepOrder, PlanOrderWhenNotReordering) {
  auto p = decode_plan();
  auto order = ShapeFamily::step_order(p, [](size_t k) { return k == 0 || k == 2; }, false);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3}));
}

TEST(StepOrder, FixedStepsTakenAsEarlyAsTheirInputsAllow) {
  auto p = decode_plan();
  auto order = ShapeFamily::step_order(p, [](size_t k) { return k == 0 || k == 2; }, true);
  EXPECT_EQ(order, (std::vector<size_t>{0, 2, 1, 3}));
}

TEST(StepOrder, FixedStepWaitsForItsProducer) {
  // 0: other -> 2; 1: fixed, reads 2 -> 3; 2: fixed, reads input 0 -> 4. Step 1 cannot come
  // before step 0, step 2 comes first.
  auto p = plan({step({1}, {2}), step({2}, {3}), step({0}, {4})}, 2, 5, {3, 4});
  auto order = ShapeFamily::step_order(p, [](size_t k) { return k != 0; }, true);
  EXPECT_EQ(order, (std::vector<size_t>{2, 0, 1}));
}

TEST(StepOrder, SubgraphOuterValuesAreDependencies) {
  // Step 1 reads slot 2 (step 0's output) only inside a body: it still waits for step 0.
  auto p = plan({step({0}, {2}), step({1}, {3})}, 2, 4, {3});
  static const graph::Graph body;
  p.steps[1].bodies.push_back({&body, {2}});
  auto order = ShapeFamily::step_order(p, [](size_t k) { return k == 1; }, true);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1}));
}

TEST(FindFamily, OneSegmentOverTheReorderedFixedSteps) {
  auto p = decode_plan();
  ShapeFamily family(/*step_order=*/true, 0, "test");
  auto pw = family.find(p, decode_steps(5), decode_steps(6), no_constants);
  ASSERT_TRUE(pw);
  EXPECT_EQ(pw->order, (std::vector<size_t>{0, 2, 1, 3}));
  ASSERT_EQ(pw->segments.size(), 1u);
  const auto& seg = pw->segments[0];
  EXPECT_EQ(seg.begin, 0u);
  EXPECT_EQ(seg.end, 2u);
  EXPECT_EQ(seg.in_slots, (std::vector<int>{0}));  // A's input; B reads A inside the segment
  EXPECT_EQ(seg.in_shapes, (std::vector<mx::Shape>{{1, 8}}));
  EXPECT_EQ(seg.out_slots, (std::vector<int>{4}));  // B's output, read by C after it
}

TEST(FindFamily, PlanOrderLeavesStretchesTooShort) {
  auto p = decode_plan();
  ShapeFamily family(/*step_order=*/false, 0, "test");
  EXPECT_FALSE(family.find(p, decode_steps(5), decode_steps(6), no_constants));
}

TEST(FindFamily, ChangedShapesStayEager) {
  auto p = decode_plan();
  auto b = decode_steps(6);
  b[2].shapes[1] = {1, 9};  // B's output differs between the two signatures
  ShapeFamily family(true, 0, "test");
  EXPECT_FALSE(family.find(p, decode_steps(5), b, no_constants));
}

TEST(FindFamily, ZeroSizeValuesStayEager) {
  auto p = decode_plan();
  auto a = decode_steps(5), b = decode_steps(6);
  a[0].shapes[0] = b[0].shapes[0] = {0, 8};
  ShapeFamily family(true, 0, "test");
  EXPECT_FALSE(family.find(p, a, b, no_constants));
}

TEST(FindFamily, ConstantsAreNotSegmentArguments) {
  // Slot 1 a constant initializer: A reads input 0 and the constant; only input 0 is an argument.
  auto p = plan({step({0, 1}, {2}), step({2}, {3})}, 2, 4, {3});
  ShapeFamily::StepInfos s = {fixed({{4}, {4}, {4}}), fixed({{4}, {4}})};
  ShapeFamily family(true, 0, "test");
  auto pw = family.find(p, s, s, [](int slot) { return slot == 1; });
  ASSERT_TRUE(pw);
  ASSERT_EQ(pw->segments.size(), 1u);
  EXPECT_EQ(pw->segments[0].in_slots, (std::vector<int>{0}));
  EXPECT_EQ(pw->segments[0].out_slots, (std::vector<int>{3}));  // a group output
}

TEST(FindFamily, TooFewFixedStepsIsNoFamily) {
  // Two fixed steps among nine that do MLX work: under a quarter.
  std::vector<StepIO> steps = {step({0}, {1}), step({1}, {2})};
  ShapeFamily::StepInfos a = {fixed({{2}, {2}}), fixed({{2}, {2}})};
  for (int k = 0; k < 7; ++k) {
    steps.push_back(step({2 + k}, {3 + k}));
    a.push_back(eager({{2}, {2}}));
  }
  auto p = plan(steps, 1, 10, {9});
  ShapeFamily family(true, 0, "test");
  EXPECT_FALSE(family.find(p, a, a, no_constants));
  // The same with the seven as host steps: they do no MLX work, so the two are enough.
  for (size_t k = 2; k < a.size(); ++k) a[k] = host({{2}, {2}});
  EXPECT_TRUE(family.find(p, a, a, no_constants));
}

TEST(ShapeFamilyState, TwoNewSignaturesOfOneLayoutMakeAFamily) {
  auto p = decode_plan();
  const engine::Layout layout = {-1, -1}, other = {-1, -2};
  ShapeFamily family(true, 0, "test");
  EXPECT_TRUE(family.looking());
  family.observe(p, layout, mx::Device::cpu, decode_steps(5), no_constants);
  EXPECT_TRUE(family.looking());  // one signature: nothing to compare with
  family.observe(p, other, mx::Device::cpu, decode_steps(6), no_constants);
  EXPECT_TRUE(family.looking());  // another layout: not compared
  family.observe(p, other, mx::Device::cpu, decode_steps(7), no_constants);
  EXPECT_FALSE(family.looking());
  EXPECT_TRUE(family.member(other, mx::Device::cpu));
  EXPECT_FALSE(family.member(layout, mx::Device::cpu));
  EXPECT_FALSE(family.member(other, mx::Device::gpu));
  // Four runs in a row in which no segment matched: the family is dropped.
  auto* pw = family.member(other, mx::Device::cpu);
  pw->misses = 3;
  family.after_run();
  EXPECT_FALSE(family.looking());
  family.member(other, mx::Device::cpu)->misses = 4;
  family.after_run();
  EXPECT_TRUE(family.looking());
  EXPECT_FALSE(family.member(other, mx::Device::cpu));
}

TEST(RecordStep, FixedOnlyForTensorStepsWithoutHostReads) {
  StepIO io = step({0, -1}, {1});
  engine::Slots slots(2);
  slots[0] = ops::Value::of(mx::zeros({2, 3}));
  slots[1] = ops::Value::of(mx::zeros({3}));
  ShapeFamily::StepInfos infos;
  ShapeFamily::record_step(1, io, slots, false, false, infos);
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_TRUE(infos[1].fixed);
  EXPECT_FALSE(infos[1].host);
  EXPECT_EQ(infos[1].shapes, (std::vector<mx::Shape>{{2, 3}, {-1}, {3}}));
  ShapeFamily::record_step(1, io, slots, false, /*read_host=*/true, infos);
  EXPECT_FALSE(infos[1].fixed);
  ShapeFamily::record_step(1, io, slots, /*host_step=*/true, false, infos);
  EXPECT_FALSE(infos[1].fixed);
  EXPECT_TRUE(infos[1].host);
  slots[0] = ops::Value::sequence({mx::zeros({2})}, graph::DType::Float32);
  ShapeFamily::record_step(1, io, slots, false, false, infos);
  EXPECT_FALSE(infos[1].fixed);
  EXPECT_EQ(infos[1].shapes[0], (mx::Shape{-2}));
}

TEST(SignatureCache, LeastRecentlyUsedDroppedBeyondCapacity) {
  engine::SignatureCache<int> cache(2);
  cache.insert("a", 1);
  cache.insert("b", 2);
  ASSERT_TRUE(cache.find("a"));  // a is now the most recent
  cache.insert("c", 3);           // drops b
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_FALSE(cache.contains("b"));
  EXPECT_TRUE(cache.contains("c"));
  EXPECT_EQ(cache.order(), (std::list<std::string>{"c", "a"}));
  EXPECT_EQ(*cache.find("a"), 1);
  EXPECT_EQ(cache.find("b"), nullptr);
}

TEST(SignatureCache, InsertKeepsAnExistingEntryAndEraseRemoves) {
  engine::SignatureCache<int> cache(0);  // capacity at least one
  cache.insert("a", 1);
  cache.insert("a", 7);
  EXPECT_EQ(*cache.find("a"), 1);
  cache.insert("b", 2);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_TRUE(cache.contains("b"));
  cache.erase("b");
  cache.erase("missing");
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(cache.order().empty());
}
