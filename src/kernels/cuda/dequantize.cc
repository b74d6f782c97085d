#include "kernels/cuda/dequantize.h"

#include <atomic>

#include <mlx/fast.h>

#include "kernels/cuda/backend.h"

namespace ortmlx::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// One thread a word: its eight values share one (scale, bias) because a group is a multiple of 8.
// Template constants: T (output), KW (words a row), G (groups a row), GROUP, WORDS (all words).
constexpr const char* kSource = R"(
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)WORDS) return;
  const size_t r = i / KW;
  const int gi = (int)(i % KW) * 8 / GROUP;
  const float sc = static_cast<float>(scales[r * G + gi]);
  const float bi = static_cast<float>(biases[r * G + gi]);
  const uint32_t wd = words[i];
  AlignedVector<T, 8> v;
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = static_cast<T>(static_cast<float>((wd >> (4 * j)) & 15u) * sc + bi);
  *reinterpret_cast<AlignedVector<T, 8>*>(out + i * 8) = v;
)";

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "ortmlx_dequantize_int4", {"words", "scales", "biases"}, {"out"}, kSource, /*header=*/"",
      /*ensure_row_contiguous=*/true);
  return k;
}

std::atomic<uint64_t> nodes_built{0};

bool floating(mx::Dtype t) { return t == mx::float16 || t == mx::bfloat16 || t == mx::float32; }

}  // namespace

uint64_t dequantize_int4_nodes() { return nodes_built.load(); }

std::optional<mx::array> dequantize_int4(const mx::array& words, const mx::array& scales, const mx::array& biases,
                                         int group, mx::Dtype out, mx::Stream s) {
  if (s.device != mx::Device::gpu || !available()) return std::nullopt;
  if (!floating(out) || !floating(scales.dtype()) || !floating(biases.dtype())) return std::nullopt;
  if (words.dtype() != mx::uint32 || words.ndim() != 2 || group < 8 || group % 8 != 0) return std::nullopt;
  const int N = words.shape(0), KW = words.shape(1);
  const int64_t K = static_cast<int64_t>(KW) * 8;
  if (N < 1 || KW < 1 || K % group != 0) return std::nullopt;
  const int G = static_cast<int>(K / group);
  if (scales.shape() != mx::Shape{N, G} || biases.shape() != scales.shape()) return std::nullopt;
  const int64_t total = static_cast<int64_t>(N) * KW;
  if (total > (int64_t{1} << 31) - kThreads) return std::nullopt;
  const int blocks = static_cast<int>((total + kThreads - 1) / kThreads);
  auto outs = kernel()({words, scales, biases}, {{N, static_cast<int>(K)}}, {out}, {blocks * kThreads, 1, 1},
                       {kThreads, 1, 1},
                       {{"T", out}, {"KW", KW}, {"G", G}, {"GROUP", group}, {"WORDS", static_cast<int>(total)}},
                       std::nullopt, false, s);
  nodes_built++;
  return outs[0];
}

}  // namespace ortmlx::kernels::cuda
