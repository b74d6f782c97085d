// The halves rotation (ops/contrib/rotary.cc) against the formula it implements, written with plain MLX
// ops: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] on the first rotary_dim features. The
// fused form (one compiled kernel over a reversed view of x's halves) must give the same values
// for full and partial rotary widths, strided inputs, half precision, and inside a compile trace.
#include <gtest/gtest.h>

#include <vector>

#include "ops/contrib/contrib_internal.h"

namespace mx = mlx::core;
using ortmlx::ops::contrib::apply_rotary_halves;
using ortmlx::ops::contrib::rotary_half_tables;

namespace {

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

// x: [B, S, N, H]; cos/sin: [S, dim / 2] rows for each position.
mx::array reference(const mx::array& x, const mx::array& cos, const mx::array& sin, int dim) {
  const int H = x.shape(-1), half = dim / 2;
  auto xf = mx::astype(x, mx::float32);
  auto part = [&](int lo, int hi) {
    mx::Shape start(4, 0), stop = xf.shape();
    start[3] = lo, stop[3] = hi;
    return mx::slice(xf, start, stop);
  };
  auto c = mx::reshape(mx::astype(cos, mx::float32), {1, cos.shape(0), 1, half});
  auto s = mx::reshape(mx::astype(sin, mx::float32), {1, sin.shape(0), 1, half});
  auto x1 = part(0, half), x2 = part(half, dim);
  std::vector<mx::array> pieces = {mx::subtract(mx::multiply(x1, c), mx::multiply(x2, s)),
                                   mx::add(mx::multiply(x2, c), mx::multiply(x1, s))};
  if (dim < H) pieces.push_back(part(dim, H));
  return mx::astype(mx::concatenate(pieces, 3), x.dtype());
}

mx::array rotate(const mx::array& x, const mx::array& cos, const mx::array& sin, int dim) {
  auto [cos2, sin2] = rotary_half_tables(cos, sin, mx::float32, cpu());
  const int S = cos.shape(0);
  return apply_rotary_halves(x, mx::reshape(cos2, {1, S, 1, dim}), mx::reshape(sin2, {1, S, 1, dim}), dim, cpu());
}

void expect_rotation(const mx::array& x, int dim, float tol) {
  const int S = x.shape(1);
  auto angle = mx::random::uniform(-3.f, 3.f, {S, dim / 2}, mx::float32, mx::random::key(7));
  auto cos = mx::cos(angle), sin = mx::sin(angle);
  auto got = rotate(x, cos, sin, dim), want = reference(x, cos, sin, dim);
  ASSERT_EQ(got.shape(), x.shape());
  ASSERT_EQ(got.dtype(), x.dtype());
  EXPECT_TRUE(mx::allclose(mx::astype(got, mx::float32), mx::astype(want, mx::float32), tol, tol).item<bool>())
      << "dim " << dim << " max diff "
      << mx::max(mx::abs(mx::subtract(mx::astype(got, mx::float32), mx::astype(want, mx::float32)))).item<float>();
}

}  // namespace

TEST(RotaryHalves, FullAndPartialWidths) {
  auto x = mx::random::normal({2, 5, 3, 16}, mx::float32, mx::random::key(1));
  expect_rotation(x, 16, 1e-6f);
  expect_rotation(x, 8, 1e-6f);
  expect_rotation(mx::random::normal({1, 1, 12, 64}, mx::float32, mx::random::key(2)), 64, 1e-6f);
}

TEST(RotaryHalves, StridedAndHalfPrecisionInputs) {
  // A transposed view (heads before positions in memory) and a slice of a packed row.
  auto t = mx::transpose(mx::random::normal({2, 3, 5, 16}, mx::float32, mx::random::key(3)), {0, 2, 1, 3});
  expect_rotation(t, 16, 1e-6f);
  auto packed = mx::random::normal({1, 4, 5 * 16}, mx::float32, mx::random::key(4));
  auto qk = mx::reshape(mx::slice(packed, {0, 0, 0}, {1, 4, 3 * 16}), {1, 4, 3, 16});
  expect_rotation(qk, 16, 1e-6f);
  expect_rotation(mx::astype(qk, mx::float16), 16, 2e-3f);
}

TEST(RotaryHalves, InsideACompileTrace) {
  // Translators also run inside the engine's compiled segments: the nested compiled function
  // must trace and replay like the plain ops.
  auto x = mx::random::normal({1, 2, 4, 8}, mx::float32, mx::random::key(5));
  auto angle = mx::random::uniform(-3.f, 3.f, {2, 4}, mx::float32, mx::random::key(6));
  auto cos = mx::cos(angle), sin = mx::sin(angle);
  auto outer = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::multiply(rotate(in[0], in[1], in[2], 8), mx::array(2.f))};
  });
  for (int run = 0; run < 2; ++run) {
    auto got = outer({x, cos, sin})[0];
    auto want = mx::multiply(reference(x, cos, sin, 8), mx::array(2.f));
    EXPECT_TRUE(mx::allclose(got, want, 1e-6, 1e-6).item<bool>()) << "run " << run;
  }
}
