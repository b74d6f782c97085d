// kernels/cpu/dnnl_conv: convolutions through oneDNN give what MLX's own convolution gives (in
// MLX's channels-last layout, transposed here) for 1-D, 2-D and 3-D geometries with strides,
// asymmetric padding, dilation, groups, depthwise, with or without a bias, with post-ops (each
// kind, and chains of them), and on one thread.
#include <gtest/gtest.h>

#include <stdexcept>

#include "kernels/cpu/kernels.h"

using namespace ortmlx::ops;
namespace mx = mlx::core;

namespace {

struct Case {
  int nd, C, M, H, K, stride, lo, hi, dil, groups;
  bool bias;
  std::vector<ConvPostOp> post_ops = {};
  int threads = 0;
};

// The post-ops as MLX computes them.
mx::array apply(const std::vector<ConvPostOp>& ops, mx::array y, mx::Stream s) {
  auto k = [](float v) { return mx::array(v); };
  for (const auto& op : ops) {
    switch (op.kind) {
      case ConvPostOp::Relu: y = mx::where(mx::less(y, k(0), s), mx::multiply(y, k(op.alpha), s), y, s); break;
      case ConvPostOp::Clip: y = mx::minimum(mx::maximum(y, k(op.alpha), s), k(op.beta), s); break;
      case ConvPostOp::Linear: y = mx::add(mx::multiply(y, k(op.alpha), s), k(op.beta), s); break;
      case ConvPostOp::HardSwish:
        y = mx::multiply(y, mx::clip(mx::add(mx::divide(y, k(6), s), k(0.5f), s), k(0), k(1), s), s);
        break;
      case ConvPostOp::Logistic: y = mx::sigmoid(y, s); break;
      case ConvPostOp::Tanh: y = mx::tanh(y, s); break;
      case ConvPostOp::Swish: y = mx::multiply(y, mx::sigmoid(mx::multiply(y, k(op.alpha), s), s), s); break;
      case ConvPostOp::Sum: throw std::logic_error("the Sum post-op needs its residual (cpu_dnnl_conv_add)");
    }
  }
  return y;
}

std::vector<int> perm_last(int rank) {  // (N, C, D..) -> (N, D.., C)
  std::vector<int> p{0};
  for (int d = 2; d < rank; ++d) p.push_back(d);
  p.push_back(1);
  return p;
}
std::vector<int> perm_first(int rank) {  // (N, D.., C) -> (N, C, D..)
  std::vector<int> p{0, rank - 1};
  for (int d = 1; d < rank - 1; ++d) p.push_back(d);
  return p;
}

void check(const Case& k) {
  const mx::Stream s = mx::default_stream(mx::Device::cpu);
  mx::Shape xs{2, k.C}, ws{k.M, k.C / k.groups}, ys{2, k.M};
  const int out = (k.H + k.lo + k.hi - ((k.K - 1) * k.dil + 1)) / k.stride + 1;
  for (int d = 0; d < k.nd; ++d) xs.push_back(k.H), ws.push_back(k.K), ys.push_back(out);
  auto x = mx::random::normal(xs, mx::float32, 0.f, 1.f, mx::random::key(1));
  auto w = mx::random::normal(ws, mx::float32, 0.f, 1.f, mx::random::key(2));
  auto b = mx::random::normal({k.M}, mx::float32, 0.f, 1.f, mx::random::key(3));
  DnnlConvShape g{xs, ws, ys, std::vector<int>(k.nd, k.stride), std::vector<int>(k.nd, k.lo),
                  std::vector<int>(k.nd, k.hi), std::vector<int>(k.nd, k.dil), k.groups, k.bias, k.post_ops};
  g.threads = k.threads;
  auto plan = cpu_dnnl_conv_plan(g, s);
  ASSERT_TRUE(plan) << "no oneDNN plan (is libdnnl.so.2 next to the test binary?) for " << g.key();
  auto wp = cpu_dnnl_conv_weights(plan, w, s);
  std::optional<mx::array> bias;
  if (k.bias) bias = b;
  auto y = cpu_dnnl_conv(plan, g, x, wp, bias, s);
  const int rank = k.nd + 2;
  auto ref = mx::conv_general(mx::transpose(x, perm_last(rank), s), mx::transpose(w, perm_last(rank), s),
                              g.stride, g.pad_lo, g.pad_hi, g.dilation, {}, k.groups, false, s);
  if (k.bias) ref = mx::add(ref, b, s);
  ref = apply(k.post_ops, ref, s);
  ref = mx::transpose(ref, perm_first(rank), s);
  ASSERT_EQ(y.shape(), ref.shape());
  const float err = mx::max(mx::abs(mx::subtract(y, ref, s), s), s).item<float>();
  EXPECT_LT(err, 1e-3f) << g.key();
  EXPECT_EQ(cpu_dnnl_conv_failures(), 0u);
}

}  // namespace

TEST(DnnlConv, MatchesMlxConvolution) {
  ASSERT_TRUE(cpu_dnnl_available()) << "oneDNN did not load: scripts/setup fetches it into .deps";
  const uint64_t before = cpu_dnnl_conv_runs();
  const Case cases[] = {
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true},   // a 3x3 layer
      {2, 3, 8, 17, 7, 2, 3, 2, 1, 1, true},     // a stem: 3 channels, stride 2, asymmetric pads
      {2, 16, 32, 12, 1, 1, 0, 0, 1, 1, false},  // 1x1, no bias
      {2, 16, 16, 12, 3, 1, 2, 2, 2, 1, true},   // dilated
      {2, 32, 32, 12, 3, 1, 1, 1, 1, 2, true},   // grouped (16 channels a group: a direct kernel)
      {2, 16, 16, 12, 3, 2, 1, 1, 1, 16, true},  // depthwise, stride 2
      {1, 8, 12, 30, 5, 1, 2, 2, 1, 1, true},    // 1-D
      {3, 4, 6, 6, 3, 1, 1, 1, 1, 1, false},     // 3-D
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Relu}}},   // with the Relu as a post-op
      {2, 16, 16, 12, 3, 2, 1, 1, 1, 16, false, {{ConvPostOp::Relu}}},  // depthwise with the Relu
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Relu, 0.1f}}},  // leaky
      // a per-tensor affine, then hard-swish (mobile OCR backbones); hard-sigmoid as linear + clip
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Linear, 0.9f, 0.5f}, {ConvPostOp::HardSwish, 1.f / 6, 0.5f}}},
      {2, 16, 16, 12, 3, 2, 1, 1, 1, 16, true, {{ConvPostOp::HardSwish, 1.f / 6, 0.5f}}},
      {2, 16, 32, 12, 1, 1, 0, 0, 1, 1, true, {{ConvPostOp::Linear, 0.2f, 0.5f}, {ConvPostOp::Clip, 0.f, 1.f}}},
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Clip, 0.f, 6.f}}},
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, false, {{ConvPostOp::Logistic}}},
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Tanh}}},
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Swish, 1.f}}},
      {2, 16, 32, 12, 3, 1, 1, 1, 1, 1, true, {{ConvPostOp::Relu}}, 1},  // on the calling thread alone
  };
  for (const auto& k : cases) check(k);
  EXPECT_EQ(cpu_dnnl_conv_runs(), before + std::size(cases));
}

// Geometries for which oneDNN offers only a GEMM-based implementation stay MLX's: its JIT GEMM
// kernels are not safe against signals (dnnl_conv.cc). Groups of 4 channels are such a geometry
// on AVX2 machines; on AVX-512 ones oneDNN has a direct (brgemm) kernel for them, which is taken
// and nothing is refused. Either way the answer is remembered: not planned (nor counted) again.
TEST(DnnlConv, NoPlanWhereOnlyAGemmBasedImplementationExists) {
  ASSERT_TRUE(cpu_dnnl_available());
  const mx::Stream s = mx::default_stream(mx::Device::cpu);
  const uint64_t before = cpu_dnnl_conv_gemm_refusals();
  DnnlConvShape g{{2, 16, 12, 12}, {32, 4, 3, 3}, {2, 32, 12, 12}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 4, true, {}};
  const bool planned = static_cast<bool>(cpu_dnnl_conv_plan(g, s));
  EXPECT_EQ(cpu_dnnl_conv_gemm_refusals(), before + (planned ? 0 : 1));
  EXPECT_EQ(static_cast<bool>(cpu_dnnl_conv_plan(g, s)), planned);
  EXPECT_EQ(cpu_dnnl_conv_gemm_refusals(), before + (planned ? 0 : 1));
}

TEST(DnnlConv, NoPlanOffTheCpuOrForBadGeometry) {
  DnnlConvShape g{{1, 4, 8, 8}, {4, 4, 3, 3}, {1, 4, 6, 6}, {1, 1}, {0, 0}, {0, 0}, {1, 1}, 1, false, {}};
  g.stride = {1};  // one stride for two spatial dims
  EXPECT_FALSE(cpu_dnnl_conv_plan(g, mx::default_stream(mx::Device::cpu)));
}
