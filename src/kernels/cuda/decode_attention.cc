#include "kernels/cuda/decode_attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <mlx/fast.h>

namespace ortmlx::kernels::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxRows = 8192;  // a block's scores live in shared memory (4 bytes a row)
constexpr int kMaxHead = 256;

// Blocks of (batch, query head, split): split s takes the key rows [s * CH, (s + 1) * CH) that
// lie in [lo, p] (CH = P, one split, when the buffer is not split). Per block:
//   1. scores: each thread takes whole key rows (16-byte vector loads) against q in shared memory;
//   2. softmax over the block's rows: block-wide max and sum;
//   3. values: lanes split a value row into 16-byte vectors and a warp takes 32 / (lanes a row)
//      rows at once, so one warp has several rows' loads in flight; then the warps' sums added.
// With one split the block writes the output; with several it writes its unnormalized sum, max
// and exp-sum (part_acc, part_ml) and a second kernel (kCombine) rescales and adds the splits:
// a one-row attention has one block per head otherwise, too few to keep the GPU's loads busy
// over a long buffer.
// The source is a head (the block's indices and row range), a prologue that fills qs (the scaled
// query) and points kn / vn at the step's own key and value, and the attention body.
// Template constants (set per call): T, D, NH, NKV, P, WIN, SCALE_BITS (the scale's float bits),
// CH (rows a split), S (splits: ceil(P / CH)).
constexpr const char* kHead = R"(
  constexpr int NT = 128;
  constexpr int NW = NT / 32;
  constexpr int DPL = (D + 31) / 32;  // dims per lane: lane, lane + 32, ...
  constexpr int VEC = 16 / sizeof(T);
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = __int_as_float(0xff800000);
  __shared__ float qs[D];
  __shared__ float sc[CH];
  __shared__ float red[NW];
  __shared__ float part[NW * D];
  const int split = blockIdx.x % S;
  const int bn = blockIdx.x / S;
  const int b = bn / NH;
  const int g = (bn % NH) / (NH / NKV);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int p = pos[b];
  p = p < 0 ? 0 : (p > P - 1 ? P - 1 : p);
  const int lo = (WIN > 0 && p + 1 - WIN > 0) ? p + 1 - WIN : 0;
  const size_t head = (size_t)b * NKV + g;
)";

// The step's q, k_new and v_new as separate [B, N|Nkv, D] arrays.
constexpr const char* kPrologueRows = R"(
  for (int d = tid; d < D; d += NT) qs[d] = static_cast<float>(q[(size_t)bn * D + d]) * scale;
  const T* kn = k_new + head * D;
  const T* vn = v_new + head * D;
  __syncthreads();
)";

// The step's projections as the QKV product gives them (row b of q at Q_OFF + n * D, of k at
// K_OFF + g * D, of v at V_OFF + g * D, rows Q_STRIDE / K_STRIDE / V_STRIDE apart), q and k
// rotated here at position p (RD > 0: the first RD dims, halves or INTERLEAVED pairs, cos / sin
// rows of RD / 2 values). The rotated key is rounded to T, as the buffer holds it; the head's
// first query head's first split writes the key and value rows out (k_row, v_row: [B, NKV, 1, D]).
constexpr const char* kPrologueProjections = R"(
  __shared__ __align__(16) T kn_s[D];
  __shared__ __align__(16) T vn_s[D];
  const int n = bn % NH;
  const T* qsrc = q + (size_t)b * Q_STRIDE + Q_OFF + (size_t)n * D;
  const T* ksrc = k + (size_t)b * K_STRIDE + K_OFF + (size_t)g * D;
  const T* vsrc = v + (size_t)b * V_STRIDE + V_OFF + (size_t)g * D;
  auto rotated = [&](const T* src, int d) -> float {
    const float x = static_cast<float>(src[d]);
    if (RD == 0 || d >= RD) return x;
    constexpr int HALF = RD / 2;
    if (INTERLEAVED) {
      const int i = d >> 1;
      const float c = static_cast<float>(cos_t[(size_t)p * HALF + i]);
      const float sn = static_cast<float>(sin_t[(size_t)p * HALF + i]);
      const float y = static_cast<float>(src[d ^ 1]);
      return (d & 1) ? x * c + y * sn : x * c - y * sn;
    }
    const int i = d < HALF ? d : d - HALF;
    const float c = static_cast<float>(cos_t[(size_t)p * HALF + i]);
    const float sn = static_cast<float>(sin_t[(size_t)p * HALF + i]);
    return d < HALF ? x * c - static_cast<float>(src[d + HALF]) * sn
                    : x * c + static_cast<float>(src[d - HALF]) * sn;
  };
  const bool writer = split == 0 && n % (NH / NKV) == 0;
  for (int d = tid; d < D; d += NT) {
    qs[d] = rotated(qsrc, d) * scale;
    const T kr = static_cast<T>(rotated(ksrc, d));
    const T vr = vsrc[d];
    kn_s[d] = kr;
    vn_s[d] = vr;
    if (writer) {
      k_row[head * D + d] = kr;
      v_row[head * D + d] = vr;
    }
  }
  const T* kn = kn_s;
  const T* vn = vn_s;
  __syncthreads();
)";

constexpr const char* kBody = R"(
  const T* kb = k_buf + head * P * D;
  const T* vb = v_buf + head * P * D;
  const int r0 = lo > split * CH ? lo : split * CH;
  const int r1 = p + 1 < (split + 1) * CH ? p + 1 : (split + 1) * CH;  // exclusive
  const int nr = r1 - r0;
  const size_t slot = (size_t)bn * S + split;  // this block's part (S > 1)
  if (S > 1 && nr <= 0) {  // a split past the valid rows (the same for the whole block)
    for (int d = tid; d < D; d += NT) part_acc[slot * D + d] = 0.f;
    if (tid == 0) {
      part_ml[slot * 2] = neg_inf;
      part_ml[slot * 2 + 1] = 0.f;
    }
    return;
  }
  // 16-byte loads where every row starts 16-byte aligned.
  const bool vec_ok = D % VEC == 0 &&
                      ((reinterpret_cast<uintptr_t>(kb) | reinterpret_cast<uintptr_t>(kn)) & 15) == 0;

  float m_local = neg_inf;
  for (int i = tid; i < nr; i += NT) {
    const int t = r0 + i;
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
  for (int i = tid; i < nr; i += NT) {
    const float e = expf(sc[i] - m);
    sc[i] = e;
    l_local += e;
  }
  for (int o = 16; o > 0; o >>= 1) l_local += __shfl_xor_sync(0xffffffff, l_local, o);
  if (lane == 0) red[warp] = l_local;
  __syncthreads();
  float l = 0.f;
  for (int w = 0; w < NW; ++w) l += red[w];

  // Values: LPR lanes a row, each one 16-byte vector of it, RPW rows a warp at once.
  constexpr int LPR = (D % VEC == 0 && D >= VEC) ? D / VEC : 32;
  constexpr int RPW = 32 / LPR;
  const bool vvec = D % VEC == 0 && D >= VEC && 32 % LPR == 0 &&
                    ((reinterpret_cast<uintptr_t>(vb) | reinterpret_cast<uintptr_t>(vn)) & 15) == 0;
  if (vvec) {
    const int sub = lane / LPR, piece = lane % LPR;
    float a[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] = 0.f;
#pragma unroll 4
    for (int i = warp * RPW + sub; i < nr; i += NW * RPW) {
      const int t = r0 + i;
      const T* row = t == p ? vn : vb + (size_t)t * D;
      const AlignedVector<T, VEC> x = *reinterpret_cast<const AlignedVector<T, VEC>*>(row + piece * VEC);
      const float w = sc[i];
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] += w * static_cast<float>(x[j]);
    }
    for (int o = 16; o >= LPR; o >>= 1)
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] += __shfl_xor_sync(0xffffffff, a[j], o);
    if (sub == 0)
#pragma unroll
      for (int j = 0; j < VEC; ++j) part[warp * D + piece * VEC + j] = a[j];
  } else {
    float acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; ++j) acc[j] = 0.f;
#pragma unroll 4
    for (int i = warp; i < nr; i += NW) {
      const int t = r0 + i;
      const T* row = t == p ? vn : vb + (size_t)t * D;
      const float w = sc[i];
#pragma unroll
      for (int j = 0; j < DPL; ++j)
        if (lane + 32 * j < D) acc[j] += w * static_cast<float>(row[lane + 32 * j]);
    }
#pragma unroll
    for (int j = 0; j < DPL; ++j)
      if (lane + 32 * j < D) part[warp * D + lane + 32 * j] = acc[j];
  }
  __syncthreads();
  for (int d = tid; d < D; d += NT) {
    float sum = 0.f;
    for (int w = 0; w < NW; ++w) sum += part[w * D + d];
    if (S == 1) {
      out[(size_t)bn * D + d] = static_cast<T>(sum / l);
    } else {
      part_acc[slot * D + d] = sum;
    }
  }
  if (S > 1 && tid == 0) {
    part_ml[slot * 2] = m;
    part_ml[slot * 2 + 1] = l;
  }
)";

// The splits of one (batch, query head) added: each split's sum and exp-sum rescaled from its own
// max to the largest (a split without rows has max -inf and weight 0). Template constants: T, D, S.
constexpr const char* kCombine = R"(
  constexpr int NT = 128;
  const float neg_inf = __int_as_float(0xff800000);
  __shared__ float w[S];
  __shared__ float total;
  const int bn = blockIdx.x;
  const int tid = threadIdx.x;
  const float* ml = part_ml + (size_t)bn * S * 2;
  float mx_all = neg_inf;
  for (int s = 0; s < S; ++s) mx_all = fmaxf(mx_all, ml[2 * s]);
  for (int s = tid; s < S; s += NT) w[s] = ml[2 * s] == neg_inf ? 0.f : expf(ml[2 * s] - mx_all);
  __syncthreads();
  if (tid == 0) {
    float l = 0.f;
    for (int s = 0; s < S; ++s) l += w[s] * ml[2 * s + 1];
    total = l;
  }
  __syncthreads();
  const float* acc = part_acc + (size_t)bn * S * D;
  for (int d = tid; d < D; d += NT) {
    float sum = 0.f;
    for (int s = 0; s < S; ++s) sum += w[s] * acc[(size_t)s * D + d];
    out[(size_t)bn * D + d] = static_cast<T>(sum / total);
  }
)";

// Each body is built twice: one split (writes `out`) and several (writes part_acc / part_ml). The
// names the other form writes are declared as null locals so that one body serves both.
constexpr const char* kOneSplit = "  float* const part_acc = nullptr;\n  float* const part_ml = nullptr;\n";
constexpr const char* kSplitsNoOut = "  T* const out = nullptr;\n";

using Kernel = mx::fast::CustomKernelFunction;

const Kernel& rows_kernel(bool split) {
  static const std::vector<std::string> in = {"q", "k_new", "v_new", "k_buf", "v_buf", "pos"};
  static const Kernel one = mx::fast::cuda_kernel("ortmlx_decode_attention", in, {"out"},
                                                  std::string(kOneSplit) + kHead + kPrologueRows + kBody, "", true);
  static const Kernel many = mx::fast::cuda_kernel("ortmlx_decode_attention_split", in, {"part_acc", "part_ml"},
                                                   std::string(kSplitsNoOut) + kHead + kPrologueRows + kBody,
                                                   "", true);
  return split ? many : one;
}

const Kernel& projections_kernel(bool split) {
  static const std::vector<std::string> in = {"q", "k", "v", "cos_t", "sin_t", "k_buf", "v_buf", "pos"};
  static const Kernel one =
      mx::fast::cuda_kernel("ortmlx_decode_attention_qkv", in, {"out", "k_row", "v_row"},
                            std::string(kOneSplit) + kHead + kPrologueProjections + kBody, "", true);
  static const Kernel many =
      mx::fast::cuda_kernel("ortmlx_decode_attention_qkv_split", in, {"part_acc", "part_ml", "k_row", "v_row"},
                            std::string(kSplitsNoOut) + kHead + kPrologueProjections + kBody, "", true);
  return split ? many : one;
}

const Kernel& combine_kernel() {
  static const Kernel k =
      mx::fast::cuda_kernel("ortmlx_decode_attention_combine", {"part_acc", "part_ml"}, {"out"}, kCombine, "", true);
  return k;
}

std::atomic<uint64_t> nodes_built{0}, projection_nodes_built{0}, split_nodes_built{0};

// Rows a split takes for a buffer of P rows and `heads` (batch x query heads) blocks of one split:
// the whole buffer when split_rows is 0 or covers it, or when the splits' threads would overflow
// the launch's int count.
int split_rows(const DecodeAttention& p, int P, int64_t heads) {
  if (p.split_rows <= 0 || p.split_rows >= P) return P;
  const int64_t splits = (P + p.split_rows - 1) / p.split_rows;
  return heads * splits * kThreads < (int64_t{1} << 31) ? p.split_rows : P;
}

// The template constants both kernels share (their kBody reads them).
std::vector<std::pair<std::string, mx::fast::TemplateArg>> body_constants(mx::Dtype t, int H, int P, int ch,
                                                                          const DecodeAttention& p) {
  return {{"T", t},
          {"D", H},
          {"NH", p.num_heads},
          {"NKV", p.kv_heads},
          {"P", P},
          {"WIN", std::max(p.window, 0)},
          {"SCALE_BITS", std::bit_cast<int>(p.scale)},
          {"CH", ch},
          {"S", (P + ch - 1) / ch}};
}

// Launches `kernel` over B * N heads and their splits; with several splits it returns the
// combined output in place of the first two outputs (part_acc, part_ml), the rest as they come.
std::vector<mx::array> run_splits(const Kernel& one, const Kernel& many, const std::vector<mx::array>& inputs,
                                  mx::Shape out_shape, std::vector<mx::Shape> extra_shapes, mx::Dtype t, int B,
                                  int N, int H, int P, int ch,
                                  std::vector<std::pair<std::string, mx::fast::TemplateArg>> constants, mx::Stream s) {
  const int S = (P + ch - 1) / ch;
  std::vector<mx::Dtype> extra_types(extra_shapes.size(), t);
  if (S == 1) {
    std::vector<mx::Shape> shapes{out_shape};
    shapes.insert(shapes.end(), extra_shapes.begin(), extra_shapes.end());
    std::vector<mx::Dtype> types{t};
    types.insert(types.end(), extra_types.begin(), extra_types.end());
    return one(inputs, shapes, types, {B * N * kThreads, 1, 1}, {kThreads, 1, 1}, constants, std::nullopt, false, s);
  }
  std::vector<mx::Shape> shapes{{B * N * S * H}, {B * N * S * 2}};
  shapes.insert(shapes.end(), extra_shapes.begin(), extra_shapes.end());
  std::vector<mx::Dtype> types{mx::float32, mx::float32};
  types.insert(types.end(), extra_types.begin(), extra_types.end());
  auto outs = many(inputs, shapes, types, {B * N * S * kThreads, 1, 1}, {kThreads, 1, 1}, constants, std::nullopt,
                   false, s);
  split_nodes_built++;
  auto combined = combine_kernel()({outs[0], outs[1]}, {out_shape}, {t}, {B * N * kThreads, 1, 1}, {kThreads, 1, 1},
                                   {{"T", t}, {"D", H}, {"S", S}}, std::nullopt, false, s);
  std::vector<mx::array> result{combined[0]};
  result.insert(result.end(), outs.begin() + 2, outs.end());
  return result;
}

}  // namespace

uint64_t decode_attention_nodes() { return nodes_built.load(); }
uint64_t decode_attention_qkv_nodes() { return projection_nodes_built.load(); }
uint64_t decode_attention_split_nodes() { return split_nodes_built.load(); }

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
  const int ch = split_rows(p, P, static_cast<int64_t>(B) * N);
  auto outs = run_splits(rows_kernel(false), rows_kernel(true), {q, k_new, v_new, k_buf, v_buf, pos32}, q.shape(),
                         {}, t, B, N, H, P, ch, body_constants(t, H, P, ch, p), s);
  nodes_built++;
  return outs[0];
}

std::optional<DecodeAttentionStep> decode_attention_qkv(const mx::array& q, const mx::array& k, const mx::array& v,
                                                        const std::optional<mx::array>& cos,
                                                        const std::optional<mx::array>& sin, const mx::array& k_buf,
                                                        const mx::array& v_buf, const mx::array& pos,
                                                        const DecodeAttention& p, const ProjectionLayout& layout,
                                                        mx::Stream s) {
  if (s.device != mx::Device::gpu || !available()) return std::nullopt;
  if (k_buf.ndim() != 4 || v_buf.shape() != k_buf.shape()) return std::nullopt;
  const int B = k_buf.shape(0), Nkv = k_buf.shape(1), P = k_buf.shape(2), H = k_buf.shape(3);
  const int N = p.num_heads;
  const auto t = k_buf.dtype();
  if (t != mx::float16 && t != mx::bfloat16 && t != mx::float32) return std::nullopt;
  for (const auto* a : {&q, &k, &v, &v_buf})
    if (a->dtype() != t) return std::nullopt;
  if (Nkv != p.kv_heads || Nkv <= 0 || N <= 0 || N % Nkv != 0) return std::nullopt;
  if (H < 1 || H > kMaxHead || P < 1 || P > kMaxRows || B < 1) return std::nullopt;
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return std::nullopt;
  // Each projection holds B rows of its stride, and every head's row lies inside its row.
  const auto fits = [&](const mx::array& a, int stride, int offset, int heads) {
    return stride > 0 && offset >= 0 && a.size() == static_cast<size_t>(B) * stride &&
           static_cast<int64_t>(offset) + static_cast<int64_t>(heads) * H <= stride;
  };
  if (!fits(q, layout.q_stride, layout.q_offset, N) || !fits(k, layout.k_stride, layout.k_offset, Nkv) ||
      !fits(v, layout.v_stride, layout.v_offset, Nkv) || pos.size() != static_cast<size_t>(B))
    return std::nullopt;
  // Rotary tables [rows, RD / 2]: every position the buffer can hold has its row.
  const int rd = cos ? 2 * cos->shape(-1) : 0;
  if (cos) {
    if (!sin || cos->ndim() != 2 || sin->shape() != cos->shape() || sin->dtype() != cos->dtype() ||
        cos->shape(0) < P || rd < 2 || rd > H)
      return std::nullopt;
    const auto ct = cos->dtype();
    if (ct != mx::float16 && ct != mx::bfloat16 && ct != mx::float32) return std::nullopt;
  }
  auto pos32 = pos.dtype() == mx::int32 ? pos : mx::astype(pos, mx::int32, s);
  const auto& cos_t = cos ? *cos : q;  // unread without rotary (RD = 0)
  const auto& sin_t = sin ? *sin : q;
  const int ch = split_rows(p, P, static_cast<int64_t>(B) * N);
  auto constants = body_constants(t, H, P, ch, p);
  constants.insert(constants.end(), {{"RD", rd},
                                     {"INTERLEAVED", layout.interleaved ? 1 : 0},
                                     {"Q_STRIDE", layout.q_stride},
                                     {"Q_OFF", layout.q_offset},
                                     {"K_STRIDE", layout.k_stride},
                                     {"K_OFF", layout.k_offset},
                                     {"V_STRIDE", layout.v_stride},
                                     {"V_OFF", layout.v_offset}});
  auto outs = run_splits(projections_kernel(false), projections_kernel(true), {q, k, v, cos_t, sin_t, k_buf, v_buf, pos32},
                         {B, N * H}, {{B, Nkv, 1, H}, {B, Nkv, 1, H}}, t, B, N, H, P, ch, std::move(constants), s);
  projection_nodes_built++;
  return DecodeAttentionStep{outs[0], outs[1], outs[2]};
}

}  // namespace ortmlx::kernels::cuda
