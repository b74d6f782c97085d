#include "kernels/cuda/decode_attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>

#include <mlx/fast.h>

namespace ortmlx::kernels::cuda {

namespace {

constexpr int kThreads = 256;  // one block per (batch, query head)
constexpr int kMaxRows = 8192;  // the scores of one head live in shared memory (4 bytes a row)
constexpr int kMaxHead = 256;

// One block per (b, n). Three phases, all rows [lo, p] of the head's KV buffer:
//   1. scores: each thread takes whole key rows (a 16-byte vector load at a time) against q in
//      shared memory; the scores stay in shared memory;
//   2. softmax: block-wide max and sum;
//   3. output: each warp accumulates value rows (lane l the dims l, l + 32, ...), then the
//      warps' partial sums are added.
// Template constants (set per call): T, D, NH, NKV, P, WIN, SCALE_BITS (the scale's float bits).
constexpr const char* kSource = R"(
  constexpr int NT = 256;
  constexpr int NW = NT / 32;
  constexpr int DPL = (D + 31) / 32;  // dims per lane: lane, lane + 32, ...
  constexpr int VEC = 16 / sizeof(T);
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = __int_as_float(0xff800000);
  __shared__ float qs[D];
  __shared__ float sc[P];
  __shared__ float red[NW];
  __shared__ float part[NW * D];
  const int bn = blockIdx.x;
  const int b = bn / NH;
  const int g = (bn % NH) / (NH / NKV);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int p = pos[b];
  p = p < 0 ? 0 : (p > P - 1 ? P - 1 : p);
  const int lo = (WIN > 0 && p + 1 - WIN > 0) ? p + 1 - WIN : 0;
  const int n_keys = p - lo + 1;
  for (int d = tid; d < D; d += NT) qs[d] = static_cast<float>(q[(size_t)bn * D + d]) * scale;
  __syncthreads();
  const size_t head = (size_t)b * NKV + g;
  const T* kb = k_buf + head * P * D;
  const T* vb = v_buf + head * P * D;
  const T* kn = k_new + head * D;
  const T* vn = v_new + head * D;
  // 16-byte loads where every row starts 16-byte aligned.
  const bool vec_ok = D % VEC == 0 &&
                      ((reinterpret_cast<uintptr_t>(kb) | reinterpret_cast<uintptr_t>(kn)) & 15) == 0;

  float m_local = neg_inf;
  for (int i = tid; i < n_keys; i += NT) {
    const int t = lo + i;
    const T* row = t == p ? kn : kb + (size_t)t * D;
    float acc = 0.f;
    if (vec_ok) {
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += VEC) {
        const AlignedVector<T, VEC> x = *reinterpret_cast<const AlignedVector<T, VEC>*>(row + d0);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc += qs[d0 + j] * static_cast<float>(x[j]);
      }
    } else {
      for (int d = 0; d < D; ++d) acc += qs[d] * static_cast<float>(row[d]);
    }
    sc[i] = acc;
    m_local = fmaxf(m_local, acc);
  }
  for (int o = 16; o > 0; o >>= 1) m_local = fmaxf(m_local, __shfl_xor_sync(0xffffffff, m_local, o));
  if (lane == 0) red[warp] = m_local;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < NW; ++w) m = fmaxf(m, red[w]);
  __syncthreads();

  float l_local = 0.f;
  for (int i = tid; i < n_keys; i += NT) {
    const float e = expf(sc[i] - m);
    sc[i] = e;
    l_local += e;
  }
  for (int o = 16; o > 0; o >>= 1) l_local += __shfl_xor_sync(0xffffffff, l_local, o);
  if (lane == 0) red[warp] = l_local;
  __syncthreads();
  float l = 0.f;
  for (int w = 0; w < NW; ++w) l += red[w];

  float acc[DPL];
#pragma unroll
  for (int j = 0; j < DPL; ++j) acc[j] = 0.f;
#pragma unroll 4
  for (int i = warp; i < n_keys; i += NW) {
    const int t = lo + i;
    const T* row = t == p ? vn : vb + (size_t)t * D;
    const float w = sc[i];
#pragma unroll
    for (int j = 0; j < DPL; ++j)
      if (lane + 32 * j < D) acc[j] += w * static_cast<float>(row[lane + 32 * j]);
  }
#pragma unroll
  for (int j = 0; j < DPL; ++j)
    if (lane + 32 * j < D) part[warp * D + lane + 32 * j] = acc[j];
  __syncthreads();
  for (int d = tid; d < D; d += NT) {
    float sum = 0.f;
    for (int w = 0; w < NW; ++w) sum += part[w * D + d];
    out[(size_t)bn * D + d] = static_cast<T>(sum / l);
  }
)";

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "ortmlx_decode_attention", {"q", "k_new", "v_new", "k_buf", "v_buf", "pos"}, {"out"}, kSource,
      /*header=*/"", /*ensure_row_contiguous=*/true);
  return k;
}

std::atomic<uint64_t> nodes_built{0};

}  // namespace

uint64_t decode_attention_nodes() { return nodes_built.load(); }

std::optional<mx::array> decode_attention(const mx::array& q, const mx::array& k_new,
                                          const mx::array& v_new, const mx::array& k_buf,
                                          const mx::array& v_buf, const mx::array& pos,
                                          const DecodeAttention& p, mx::Stream s) {
  if (s.device != mx::Device::gpu || !available()) return std::nullopt;
  if (q.ndim() != 3 || k_buf.ndim() != 4) return std::nullopt;
  const int B = q.shape(0), N = q.shape(1), H = q.shape(2);
  const int Nkv = k_buf.shape(1), P = k_buf.shape(2);
  const auto t = q.dtype();
  if (t != mx::float16 && t != mx::bfloat16 && t != mx::float32) return std::nullopt;
  for (const auto* a : {&k_new, &v_new, &k_buf, &v_buf})
    if (a->dtype() != t) return std::nullopt;
  if (N != p.num_heads || Nkv != p.kv_heads || Nkv <= 0 || N % Nkv != 0) return std::nullopt;
  if (H < 1 || H > kMaxHead || P < 1 || P > kMaxRows) return std::nullopt;
  // Template values become part of the kernel's C++ name: keep them non-negative.
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return std::nullopt;
  if (k_buf.shape(0) != B || k_buf.shape(3) != H || v_buf.shape() != k_buf.shape() ||
      k_new.shape() != mx::Shape{B, Nkv, H} || v_new.shape() != k_new.shape() || pos.size() != static_cast<size_t>(B))
    return std::nullopt;
  auto pos32 = mx::reshape(mx::astype(pos, mx::int32, s), {B}, s);
  auto outs = kernel()({q, k_new, v_new, k_buf, v_buf, pos32}, {q.shape()}, {t},
                       {B * N * kThreads, 1, 1}, {kThreads, 1, 1},
                       {{"T", t},
                        {"D", H},
                        {"NH", N},
                        {"NKV", Nkv},
                        {"P", P},
                        {"WIN", std::max(p.window, 0)},
                        {"SCALE_BITS", std::bit_cast<int>(p.scale)}},
                       std::nullopt, false, s);
  nodes_built++;
  return outs[0];
}

}  // namespace ortmlx::kernels::cuda
