// kernels/cpu/dnnl_matmul: products through oneDNN's sgemm give what mx::matmul gives, for
// several row counts, odd K and N, batch dims taken flat, transposed weight and activation views
// (passed to sgemm as transposed), column slices (a leading dimension above K) and views that
// must be gathered first (strided, broadcast), and batched products of two activations
// (attention's, one sgemm per batch element); every one is counted as a oneDNN run.
#include <gtest/gtest.h>

#include "kernels/cpu/kernels.h"

using namespace ortmlx::ops;
namespace mx = mlx::core;

namespace {

const mx::Stream kCpu = mx::default_stream(mx::Device::cpu);

mx::array normal(const mx::Shape& shape, int seed) {
  return mx::random::normal(shape, mx::float32, 0.f, 1.f, mx::random::key(seed));
}

// y through oneDNN against mx::matmul; both evaluated, the kernel's result also read back.
void expect_matches(const mx::array& x, const mx::array& w, const std::string& what) {
  const uint64_t before = cpu_dnnl_matmul_runs();
  auto y = cpu_dnnl_matmul(x, w, kCpu);
  ASSERT_TRUE(y) << what;
  auto ref = mx::matmul(x, w, kCpu);
  mx::eval({*y, ref});
  ASSERT_EQ(y->shape(), ref.shape()) << what;
  const float scale = 1.f + mx::max(mx::abs(ref, kCpu), kCpu).item<float>();
  const float err = mx::max(mx::abs(mx::subtract(*y, ref, kCpu), kCpu), kCpu).item<float>();
  EXPECT_LT(err, 1e-5f * scale) << what;
  EXPECT_FALSE(mx::any(mx::isnan(*y, kCpu), kCpu).item<bool>()) << what;
  EXPECT_EQ(cpu_dnnl_matmul_runs(), before + 1) << what << ": not run through oneDNN";
}

}  // namespace

TEST(DnnlMatmul, MatchesMlxMatmul) {
  ASSERT_TRUE(cpu_dnnl_available()) << "oneDNN did not load: scripts/setup fetches it into .deps";
  const uint64_t failures = cpu_dnnl_matmul_failures();
  struct Shape {
    int M, K, N;
  };
  const Shape shapes[] = {{2, 3, 5}, {3, 31, 33}, {16, 384, 384}, {17, 385, 129}, {64, 1, 7}, {5, 64, 1}, {256, 257, 255}};
  int seed = 1;
  for (const auto& sh : shapes) {
    const std::string what = std::to_string(sh.M) + "x" + std::to_string(sh.K) + "x" + std::to_string(sh.N);
    auto x = normal({sh.M, sh.K}, seed++), w = normal({sh.K, sh.N}, seed++);
    expect_matches(x, w, what);
    // The weight as a transposed view of [N, K] (Gemm transB, a [N, K] weight read by rows).
    expect_matches(x, mx::transpose(normal({sh.N, sh.K}, seed++), kCpu), what + " transposed w");
    // The activations as a transposed view of [K, M] (Gemm transA).
    expect_matches(mx::transpose(normal({sh.K, sh.M}, seed++), kCpu), w, what + " transposed x");
  }
  EXPECT_EQ(cpu_dnnl_matmul_failures(), failures);
}

TEST(DnnlMatmul, BatchDimsAndViews) {
  ASSERT_TRUE(cpu_dnnl_available());
  const uint64_t failures = cpu_dnnl_matmul_failures();
  auto w = normal({47, 29}, 20);
  // Batch dims: rows taken flat, the result keeps them.
  expect_matches(normal({2, 3, 5, 47}, 21), w, "batch 2x3x5");
  expect_matches(normal({1, 2, 47}, 22), w, "batch 1x2");
  // Columns of a wider matrix: rows at a stride above K.
  expect_matches(mx::slice(normal({9, 100}, 23), {0, 10}, {9, 57}, kCpu), w, "column slice of x");
  expect_matches(normal({9, 47}, 24), mx::slice(normal({47, 64}, 25), {0, 3}, {47, 32}, kCpu), "column slice of w");
  // Views sgemm cannot read as they are: gathered first.
  expect_matches(mx::slice(normal({18, 94}, 26), {0, 0}, {18, 94}, {2, 2}, kCpu), w, "strided x");
  expect_matches(mx::broadcast_to(normal({1, 47}, 27), {6, 47}, kCpu), w, "broadcast x");
  expect_matches(normal({9, 47}, 28), mx::slice(normal({94, 29}, 29), {0, 0}, {94, 29}, {2, 1}, kCpu), "strided w");
  expect_matches(mx::transpose(normal({4, 47, 3}, 30), {0, 2, 1}, kCpu), w, "batch of transposed rows");
  // The primitive inside a compiled function, called twice.
  auto fn = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::add(*cpu_dnnl_matmul(in[0], in[1], kCpu), mx::array(1.f), kCpu)};
  });
  auto x = normal({12, 47}, 31);
  const uint64_t before = cpu_dnnl_matmul_runs();
  for (int i = 0; i < 2; ++i) {
    auto y = fn({x, w})[0];
    auto ref = mx::add(mx::matmul(x, w, kCpu), mx::array(1.f), kCpu);
    EXPECT_LT(mx::max(mx::abs(mx::subtract(y, ref, kCpu), kCpu), kCpu).item<float>(), 1e-4f);
  }
  EXPECT_EQ(cpu_dnnl_matmul_runs(), before + 2);
  EXPECT_EQ(cpu_dnnl_matmul_failures(), failures);
}

TEST(DnnlMatmul, BatchedProducts) {
  ASSERT_TRUE(cpu_dnnl_available());
  const uint64_t failures = cpu_dnnl_matmul_failures();
  // Attention's scores: q [B, H, S, D] by k^T, a transposed view of k [B, H, S, D].
  auto q = normal({2, 3, 17, 8}, 60), k = normal({2, 3, 17, 8}, 61), v = normal({2, 3, 17, 8}, 62);
  expect_matches(q, mx::swapaxes(k, -1, -2, kCpu), "q k^T");
  expect_matches(normal({2, 3, 17, 17}, 63), v, "p v");
  // Broadcast batch dims (a grouped K/V: one per two query heads) and a 2-D x under a batched w.
  expect_matches(normal({2, 4, 5, 8}, 64), normal({2, 1, 8, 9}, 65), "broadcast w batch");
  expect_matches(normal({5, 8}, 66), normal({3, 8, 9}, 67), "2-D x, batched w");
  // Per-element views sgemm cannot read (strided rows): gathered first.
  expect_matches(mx::slice(normal({2, 10, 8}, 68), {0, 0, 0}, {2, 10, 8}, {1, 2, 1}, kCpu), normal({2, 8, 6}, 69),
                 "strided rows in a batch");
  // One transposed row-major operand per batch element ([B, K, M] -> [B, M, K]).
  expect_matches(mx::swapaxes(normal({3, 8, 5}, 70), -1, -2, kCpu), normal({3, 8, 6}, 71), "transposed x per batch");
  EXPECT_EQ(cpu_dnnl_matmul_failures(), failures);
}

TEST(DnnlMatmul, DeclinesWhatItDoesNotTake) {
  auto w = normal({8, 4}, 40);
  EXPECT_FALSE(cpu_dnnl_matmul(normal({1, 8}, 41), w, kCpu));        // one row: the gemv path's
  EXPECT_FALSE(cpu_dnnl_matmul(normal({1, 1, 8}, 42), w, kCpu));     // one row under a batch
  EXPECT_FALSE(cpu_dnnl_matmul(normal({8}, 43), w, kCpu));           // 1-D
  EXPECT_FALSE(cpu_dnnl_matmul(normal({3, 7}, 44), w, kCpu));        // K mismatch
  EXPECT_FALSE(cpu_dnnl_matmul(normal({2, 1, 8}, 45), normal({2, 8, 4}, 46), kCpu));  // batched, one row each
  EXPECT_FALSE(cpu_dnnl_matmul(normal({3, 3, 8}, 51), normal({2, 8, 4}, 52), kCpu));  // batches that do not broadcast
  EXPECT_FALSE(cpu_dnnl_matmul(mx::astype(normal({3, 8}, 47), mx::float16), mx::astype(w, mx::float16), kCpu));
  EXPECT_FALSE(cpu_dnnl_matmul(normal({0, 8}, 48), w, kCpu));        // no rows
  EXPECT_FALSE(cpu_dnnl_matmul(normal({3, 8}, 49), normal({8, 0}, 50), kCpu));  // N = 0
}
