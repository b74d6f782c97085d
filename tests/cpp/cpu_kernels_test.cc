// The CPU kernels of kernels/cpu/kernels.h against MLX's own ops on the same inputs: what the
// kernels replace must stay what they compute.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"
#include "kernels/cpu/kernels.h"

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

TEST(ConcatNonempty, LeavesOutInputsEmptyAlongTheAxis) {
  // An LLM's first prompt: an empty past [1, 2, 0, 4] and the new rows. The result is the new
  // rows themselves, with no zero-size array left in the graph (on the GPU such a graph runs on
  // MLX's CPU stream), on any stream.
  auto fresh = mx::reshape(mx::arange(24, mx::float32), {1, 2, 3, 4});
  auto past = mx::zeros({1, 2, 0, 4}, mx::float32);
  for (auto s : {cpu(), mx::default_stream(mx::default_device())}) {
    auto y = ortmlx::ops::concat_nonempty({past, fresh}, 2, s);
    for (const auto& in : y.inputs()) EXPECT_EQ(in.id(), fresh.id());
    expect_same(y, fresh);
    // A single input stays itself (ONNX Concat of one tensor).
    EXPECT_EQ(ortmlx::ops::concat_nonempty({fresh}, 2, s).id(), fresh.id());
    auto z = ortmlx::ops::concat_nonempty({past, fresh, past, fresh}, -2, s);
    for (const auto& in : z.inputs()) EXPECT_GT(in.size(), 0u);
    expect_same(z, mx::concatenate({fresh, fresh}, 2));
  }
  // All empty: the empty concatenation, as ONNX defines it.
  auto e = ortmlx::ops::concat_nonempty({past, past}, 2, cpu());
  EXPECT_EQ(e.shape(), (mx::Shape{1, 2, 0, 4}));
}

TEST(ConcatNonempty, KeepsInputsEmptyOffTheAxis) {
  // [2, 2, 0] is empty, but not along axis 0: it does not fit [2, 2, 2] there, and the
  // mismatch must still be reported (a fuzz finding: dropping it gave a [2, 2, 2] result).
  auto a = mx::ones({2, 2, 2}, mx::float32);
  auto b = mx::ones({2, 2, 0}, mx::float32);
  EXPECT_THROW(mx::eval(ortmlx::ops::concat_nonempty({a, b}, 0, cpu())), std::exception);
  EXPECT_THROW(ortmlx::ops::concat_nonempty({}, 0, cpu()), std::invalid_argument);
}

namespace {

// x over [-lo, lo] in n steps (n not a multiple of 8: the kernel's scalar tail runs too), with
// the special values at the front.
mx::array erf_inputs(int n, float lo) {
  std::vector<float> v = {0.f, -0.f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 1e30f, -1e30f, 1e-30f, 9.3f, -9.3f};
  for (int i = 0; i < n; ++i) v.push_back(-lo + 2 * lo * static_cast<float>(i) / static_cast<float>(n - 1));
  return mx::array(v.data(), {static_cast<int>(v.size())}, mx::float32);
}

float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(a, b))).item<float>();
}

}  // namespace

TEST(CpuErf, MatchesMlxErfAcrossThreadsAndTail) {
  // 100,001 + 9 values: split over the row pool (>= 32K elements a part) and an odd tail.
  auto x = erf_inputs(100001, 6.f);
  auto y = ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Erf, x, cpu());
  ASSERT_TRUE(y.has_value());
  auto want = mx::erf(x);
  EXPECT_LT(max_abs_diff(*y, want), 3e-7f);
  // erf(+-inf) = +-1, erf(+-0) = +-0 to the formula's error, NaN stays NaN.
  y->eval();
  EXPECT_EQ(y->data<float>()[2], 1.f);
  EXPECT_EQ(y->data<float>()[3], -1.f);
  std::vector<float> with_nan(ortmlx::ops::kCpuUnaryMinElements, 1.f);
  with_nan[0] = std::nanf("");
  auto nan = ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Erf,
                                    mx::array(with_nan.data(), {static_cast<int>(with_nan.size())}), cpu());
  ASSERT_TRUE(nan.has_value());
  nan->eval();
  EXPECT_TRUE(std::isnan(nan->data<float>()[0]));
  // Under kCpuUnaryMinElements the caller keeps MLX's op (which compiled programs fuse).
  EXPECT_FALSE(ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Erf, mx::array({std::nanf(""), 1.f}), cpu()).has_value());
}

TEST(CpuErf, GeluAndStridedInput) {
  auto x = mx::transpose(mx::reshape(erf_inputs(4087, 8.f), {128, 32}));  // [32, 128] view
  auto y = ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Gelu, x, cpu());
  ASSERT_TRUE(y.has_value());
  ASSERT_EQ(y->shape(), x.shape());
  auto want = mx::multiply(mx::multiply(x, mx::array(0.5f)),
                           mx::add(mx::erf(mx::multiply(x, mx::array(static_cast<float>(M_SQRT1_2)))), mx::array(1.f)));
  // |x| <= 8 and 1e30 scale the erf error by x / 2 (the 1e30 rows: both are exactly x or 0).
  auto finite = mx::less(mx::abs(x), mx::array(100.f));
  EXPECT_LT(mx::max(mx::where(finite, mx::abs(mx::subtract(*y, want)), mx::array(0.f))).item<float>(), 2e-6f);
  EXPECT_TRUE(mx::array_equal(mx::where(finite, mx::array(0.f), *y), mx::where(finite, mx::array(0.f), want), /*equal_nan=*/true).item<bool>());
}

// exp, sigmoid and tanh against the C library in double precision, relative error per element,
// over the whole range: around 0 (tanh's polynomial branch and its switch at 0.625), large
// magnitudes, results near FLT_MAX and in the denormals, +-inf, NaN; 100,003 values so the
// threads and the tail both run.
TEST(CpuUnary, ExpSigmoidTanhAgainstLibm) {
  std::vector<float> v;
  for (int i = 0; i < 100000; ++i) v.push_back(-110.f + 220.f * static_cast<float>(i) / 100000.f);
  for (float f : {0.f, -0.f, 1e-8f, -1e-8f, 0.6249f, 0.6251f, -0.6251f, 88.7f, 88.75f, -87.5f, -103.f, 1e4f, -1e4f})
    v.push_back(f);
  v.push_back(INFINITY), v.push_back(-INFINITY), v.push_back(std::nanf(""));
  const mx::array x(v.data(), {static_cast<int>(v.size())}, mx::float32);
  using ortmlx::ops::CpuUnary;
  const std::pair<CpuUnary, double (*)(double)> fns[] = {
      {CpuUnary::Exp, [](double a) { return std::exp(a); }},
      {CpuUnary::Sigmoid, [](double a) { return 1.0 / (1.0 + std::exp(-a)); }},
      {CpuUnary::Tanh, [](double a) { return std::tanh(a); }}};
  for (const auto& [f, ref] : fns) {
    auto y = ortmlx::ops::cpu_unary(f, x, cpu());
    ASSERT_TRUE(y.has_value());
    y->eval();
    const float* out = y->data<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      const double want = ref(static_cast<double>(v[i]));
      const float wantf = static_cast<float>(want);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << static_cast<int>(f) << " x=" << v[i];
      } else if (std::isinf(wantf) || wantf == 0.f || std::fabs(want) < 1e-37) {
        // overflow, and the denormal range (flushed or gradual: both within 1e-37 absolute)
        EXPECT_TRUE(out[i] == wantf || std::fabs(out[i] - want) < 1e-37) << static_cast<int>(f) << " x=" << v[i] << " got " << out[i];
      } else {
        EXPECT_LT(std::fabs(out[i] - want) / std::fabs(want), 4e-7) << static_cast<int>(f) << " x=" << v[i] << " got " << out[i] << " want " << want;
      }
    }
  }
}

TEST(CpuErf, DeclinesOtherDtypes) {
  EXPECT_FALSE(ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Erf, mx::ones({4}, mx::float16), cpu()).has_value());
  EXPECT_FALSE(ortmlx::ops::cpu_unary(ortmlx::ops::CpuUnary::Sigmoid, mx::ones({4}, mx::float64), cpu()).has_value());
}
