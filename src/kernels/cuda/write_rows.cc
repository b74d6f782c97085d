#include "kernels/cuda/write_rows.h"

#include <map>
#include <mutex>
#include <string>

#include <mlx/fast.h>

#include "kernels/cuda/backend.h"

namespace ortmlx::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBuffers = 256;

// One kernel per buffer count n: inputs b0..b{n-1}, u0.., p0..; blockIdx.y picks the buffer,
// the x dimension walks the update's elements. Template constants: T, H, S, D, TT (rows of a
// buffer).
const mx::fast::CustomKernelFunction& kernel(size_t n) {
  static std::mutex mu;
  static std::map<size_t, mx::fast::CustomKernelFunction> kernels;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = kernels.find(n); it != kernels.end()) return it->second;
  std::vector<std::string> names;
  for (const char* p : {"b", "u", "p"})
    for (size_t i = 0; i < n; ++i) names.push_back(p + std::to_string(i));
  std::string src =
      "  const T* src = nullptr;\n  T* dst = nullptr;\n  int p = 0;\n  switch (blockIdx.y) {\n";
  for (size_t i = 0; i < n; ++i) {
    const auto k = std::to_string(i);
    src += "    case " + k + ": src = u" + k + "; dst = const_cast<T*>(b" + k + "); p = p" + k + "[0]; break;\n";
  }
  src += R"(    default: return;
  }
  p = p < 0 ? 0 : (p > TT - S ? TT - S : p);
  const size_t total = (size_t)H * S * D;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
    const size_t d = e % D, s = (e / D) % S, h = e / ((size_t)S * D);
    dst[(h * TT + p + s) * D + d] = src[e];
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) done[0] = 1;
)";
  auto fn = mx::fast::cuda_kernel("ortmlx_write_rows_" + std::to_string(n), names, {"done"}, src, "",
                                  /*ensure_row_contiguous=*/true);
  return kernels.emplace(n, std::move(fn)).first->second;
}

}  // namespace

std::optional<mx::array> write_rows(const std::vector<mx::array>& buffers, const std::vector<mx::array>& updates,
                                    const std::vector<mx::array>& starts, mx::Stream s) {
  if (s.device != mx::Device::gpu || !available()) return std::nullopt;
  const size_t n = buffers.size();
  if (n == 0 || n > kMaxBuffers || updates.size() != n || starts.size() != n) return std::nullopt;
  const auto& b0 = buffers[0];
  const auto& u0 = updates[0];
  if (b0.ndim() != 4 || b0.shape(0) != 1 || u0.ndim() != 4 || u0.shape(0) != 1 || u0.shape(1) != b0.shape(1) ||
      u0.shape(3) != b0.shape(3) || u0.shape(2) > b0.shape(2) || u0.size() == 0)
    return std::nullopt;
  const auto t = b0.dtype();
  for (size_t i = 0; i < n; ++i) {
    // Written through its pointer: the buffer itself, never a copy MLX would make of a view.
    if (!buffers[i].is_available() || !buffers[i].flags().row_contiguous || buffers[i].shape() != b0.shape() ||
        buffers[i].dtype() != t || updates[i].shape() != u0.shape() || updates[i].dtype() != t ||
        starts[i].size() != 1 || starts[i].dtype() != mx::int32)
      return std::nullopt;
  }
  std::vector<mx::array> inputs(buffers);
  inputs.insert(inputs.end(), updates.begin(), updates.end());
  inputs.insert(inputs.end(), starts.begin(), starts.end());
  const int H = b0.shape(1), TT = b0.shape(2), S = u0.shape(2), D = b0.shape(3);
  const size_t elems = static_cast<size_t>(H) * S * D;
  const int blocks = static_cast<int>(std::min<size_t>((elems + kThreads - 1) / kThreads, 1024));
  auto outs = kernel(n)(inputs, {{1}}, {mx::int32}, {blocks * kThreads, static_cast<int>(n), 1}, {kThreads, 1, 1},
                        {{"T", t}, {"H", H}, {"S", S}, {"D", D}, {"TT", TT}}, std::nullopt, false, s);
  return outs[0];
}

}  // namespace ortmlx::kernels::cuda
