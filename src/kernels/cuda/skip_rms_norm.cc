#include "kernels/cuda/skip_rms_norm.h"

#include <atomic>
#include <bit>
#include <cmath>

#include <mlx/fast.h>

#include "kernels/cuda/backend.h"

namespace ortmlx::kernels::cuda {

namespace {

constexpr int kThreads = 256;  // one block per row

// Pass 1 writes the rounded sum and accumulates its squares; pass 2 reads the sum back (each
// thread its own elements, so no barrier is needed for them) and writes y.
// Template constants: T, D, HAS_BIAS, EPS_BITS (the epsilon's float bits).
constexpr const char* kSource = R"(
  constexpr int NT = 256;
  constexpr int NW = NT / 32;
  const float eps = __int_as_float(EPS_BITS);
  __shared__ float red[NW];
  const size_t base = (size_t)blockIdx.x * D;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float ss = 0.f;
  for (int d = tid; d < D; d += NT) {
    float v = static_cast<float>(x[base + d]) + static_cast<float>(skip[base + d]);
    if (HAS_BIAS) v += static_cast<float>(bias[d]);
    const T t = static_cast<T>(v);
    sum[base + d] = t;
    const float f = static_cast<float>(t);
    ss += f * f;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < NW; ++w) total += red[w];
  const float inv = rsqrtf(total / static_cast<float>(D) + eps);
  for (int d = tid; d < D; d += NT)
    y[base + d] = static_cast<T>(static_cast<float>(sum[base + d]) * inv * static_cast<float>(gamma[d]));
)";

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "ortmlx_skip_rms_norm", {"x", "skip", "gamma", "bias"}, {"y", "sum"}, kSource,
      /*header=*/"", /*ensure_row_contiguous=*/true);
  return k;
}

std::atomic<uint64_t> nodes_built{0};

}  // namespace

uint64_t skip_rms_norm_nodes() { return nodes_built.load(); }

std::optional<std::pair<mx::array, mx::array>> skip_rms_norm(const mx::array& x, const mx::array& skip,
                                                             const mx::array& gamma,
                                                             const std::optional<mx::array>& bias,
                                                             float eps, mx::Stream s) {
  if (s.device != mx::Device::gpu || !available()) return std::nullopt;
  const auto t = x.dtype();
  if (t != mx::float16 && t != mx::bfloat16 && t != mx::float32) return std::nullopt;
  if (x.ndim() < 1 || x.size() == 0 || skip.shape() != x.shape()) return std::nullopt;
  const int D = x.shape(-1);
  const mx::Shape row{D};
  if (skip.dtype() != t || gamma.dtype() != t || gamma.size() != static_cast<size_t>(D)) return std::nullopt;
  if (bias && (bias->dtype() != t || bias->size() != static_cast<size_t>(D))) return std::nullopt;
  // Template values become part of the kernel's C++ name: keep them non-negative.
  if (!(eps >= 0.f) || !std::isfinite(eps)) return std::nullopt;
  const int rows = static_cast<int>(x.size() / D);
  auto g = mx::reshape(gamma, row, s);
  auto b = bias ? mx::reshape(*bias, row, s) : g;  // unread without HAS_BIAS
  auto outs = kernel()({x, skip, g, b}, {x.shape(), x.shape()}, {t, t}, {rows * kThreads, 1, 1},
                       {kThreads, 1, 1},
                       {{"T", t}, {"D", D}, {"HAS_BIAS", bias ? 1 : 0}, {"EPS_BITS", std::bit_cast<int>(eps)}},
                       std::nullopt, false, s);
  nodes_built++;
  return std::pair{outs[0], outs[1]};
}

}  // namespace ortmlx::kernels::cuda
