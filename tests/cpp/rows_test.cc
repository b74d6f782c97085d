// ops::rows_source / as_rows / rows_to (ops/common.h): a consumer that reads rows takes the 2-D
// array a batch of rows was reshaped from, so the reshape views between two such consumers are
// never evaluated (option flat_products). A look-back is exact or nothing: through reshapes of
// the same data only, never through an evaluated array or another kind of view.
#include <gtest/gtest.h>

#include "ops/common.h"
#include "ops/switches.h"

namespace mx = mlx::core;
using ortmlx::ops::as_rows;
using ortmlx::ops::rows_source;
using ortmlx::ops::rows_to;

namespace {
mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }
bool same(const mx::array& a, const mx::array& b) { return a.id() == b.id(); }
}  // namespace

TEST(Rows, ReshapeChainsLeadBackToTheFlatArray) {
  auto flat = mx::add(mx::ones({6, 8}), mx::ones({6, 8}));  // lazy, [rows, K]
  auto batched = mx::reshape(flat, {2, 3, 8}, cpu());
  ASSERT_TRUE(rows_source(batched).has_value());
  EXPECT_TRUE(same(*rows_source(batched), flat));
  EXPECT_TRUE(same(as_rows(batched, cpu()), flat));
  // Through MLX's own matmul views and unit axes.
  auto chain = mx::expand_dims(mx::unflatten(flat, 0, {2, 3}, cpu()), 0, cpu());  // [1, 2, 3, 8]
  EXPECT_TRUE(same(as_rows(chain, cpu()), flat));
  // A 2-D array is its own rows.
  EXPECT_TRUE(same(as_rows(flat, cpu()), flat));
}

TEST(Rows, NoLookBackThroughOtherViewsOrEvaluatedArrays) {
  auto flat = mx::add(mx::ones({6, 8}), mx::ones({6, 8}));
  // A transpose changes which values form a row: no source, and as_rows reshapes the view.
  auto t = mx::transpose(mx::reshape(flat, {2, 3, 8}, cpu()), {1, 0, 2}, cpu());
  EXPECT_FALSE(rows_source(t).has_value());
  auto r = as_rows(t, cpu());
  EXPECT_EQ(r.shape(), (mx::Shape{6, 8}));
  EXPECT_TRUE(mx::array_equal(r, mx::reshape(t, {6, 8})).item<bool>());
  // Another last axis is other rows.
  auto wide = mx::reshape(flat, {1, 3, 16}, cpu());
  EXPECT_FALSE(rows_source(wide).has_value());
  // An evaluated reshape has no inputs to look back through (its own buffer is the data).
  auto batched = mx::reshape(flat, {2, 3, 8}, cpu());
  mx::eval(batched);
  EXPECT_FALSE(rows_source(batched).has_value());
  EXPECT_TRUE(mx::array_equal(as_rows(batched, cpu()), flat).item<bool>());
}

TEST(Rows, SwitchOffKeepsThePlainReshape) {
  auto flat = mx::add(mx::ones({6, 8}), mx::ones({6, 8}));
  auto batched = mx::reshape(flat, {2, 3, 8}, cpu());
  ortmlx::ops::TranslationSwitches off;
  off.flat_products = false;
  ortmlx::ops::SwitchesScope scope(off);
  EXPECT_FALSE(rows_source(batched).has_value());
  EXPECT_FALSE(same(as_rows(batched, cpu()), flat));
}

TEST(Rows, ResultsShapedBackToTheBatch) {
  auto y = mx::ones({6, 5});
  auto like = mx::zeros({2, 3, 8});
  EXPECT_EQ(rows_to(y, like, cpu()).shape(), (mx::Shape{2, 3, 5}));
  EXPECT_TRUE(same(rows_to(y, mx::zeros({6, 8}), cpu()), y));
}

TEST(Rows, ElementwiseInputsOfOneShapeAllFlat) {
  auto a = mx::add(mx::ones({6, 8}), mx::ones({6, 8}));
  auto b = mx::multiply(mx::ones({6, 8}), mx::ones({6, 8}));
  auto a3 = mx::reshape(a, {2, 3, 8}, cpu()), b3 = mx::reshape(b, {2, 3, 8}, cpu());
  auto r = ortmlx::ops::same_rows({a3, b3});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(same((*r)[0], a) && same((*r)[1], b));
  // One input without rows at hand, or shapes that broadcast: the op runs as it is.
  EXPECT_FALSE(ortmlx::ops::same_rows({a3, mx::ones({2, 3, 8})}).has_value());
  EXPECT_FALSE(ortmlx::ops::same_rows({a3, mx::reshape(b, {1, 6, 8}, cpu())}).has_value());
  // Rank 2 is already flat.
  EXPECT_FALSE(ortmlx::ops::same_rows({a, b}).has_value());
}
