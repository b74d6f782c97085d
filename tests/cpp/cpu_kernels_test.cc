// The CPU row kernels of ops/cpu_gemv.h against MLX's own ops on the same inputs: what the
// kernels replace must stay what they compute.
#include <gtest/gtest.h>

#include <vector>

#include "ops/cpu_gemv.h"

namespace mx = mlx::core;
using ortmlx::ops::cpu_concat;

namespace {

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

void expect_same(const mx::array& got, const mx::array& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_TRUE(mx::array_equal(got, want).item<bool>());
}

}  // namespace

TEST(CpuConcat, MatchesConcatenateOnEveryAxis) {
  auto a = mx::reshape(mx::arange(0, 2 * 3 * 4 * 5, mx::float32), {2, 3, 4, 5});
  auto b = mx::reshape(mx::arange(1000, 1000 + 2 * 3 * 1 * 5, mx::float32), {2, 3, 1, 5});
  auto y = cpu_concat({a, b}, 2, cpu());
  ASSERT_TRUE(y.has_value());
  expect_same(*y, mx::concatenate({a, b}, 2));
  for (int axis : {0, 1, 3, -1}) {
    mx::Shape s = a.shape();
    s[axis < 0 ? s.size() - 1 : axis] = 2;
    auto c = mx::full(s, 7.f);
    auto z = cpu_concat({a, c, a}, axis, cpu());
    ASSERT_TRUE(z.has_value()) << axis;
    expect_same(*z, mx::concatenate({a, c, a}, axis));
  }
}

TEST(CpuConcat, StridedInputsAndZeroSizePieces) {
  // A transposed view (the GQA append's new rows) and an empty past.
  auto t = mx::transpose(mx::reshape(mx::arange(24, mx::int32), {2, 3, 4}), {1, 0, 2});  // [3, 2, 4]
  auto empty = mx::zeros({3, 0, 4}, mx::int32);
  auto y = cpu_concat({empty, t, t}, 1, cpu());
  ASSERT_TRUE(y.has_value());
  expect_same(*y, mx::concatenate({empty, t, t}, 1));
}

TEST(CpuConcat, DeclinesWhatItDoesNotCover) {
  auto a = mx::ones({2, 3}, mx::float32);
  EXPECT_FALSE(cpu_concat({a, mx::ones({2, 3}, mx::float16)}, 0, cpu()).has_value());  // dtypes
  EXPECT_FALSE(cpu_concat({a, mx::ones({2, 4})}, 0, cpu()).has_value());                // shapes
  EXPECT_FALSE(cpu_concat({a}, 0, cpu()).has_value());                                  // one input
  EXPECT_FALSE(cpu_concat({a, a}, 2, cpu()).has_value());                               // axis
}
