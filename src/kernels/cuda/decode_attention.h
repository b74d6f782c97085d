// One-row attention over a preallocated KV buffer, as one CUDA kernel (mx::fast::cuda_kernel).
//
// Why: a decode step into a shared past/present buffer (onnxruntime-genai's
// past_present_share_buffer) attends to the first `pos + 1` rows of a buffer of fixed length.
// Through mx::fast::scaled_dot_product_attention that needs a mask array, and with one MLX's CUDA
// backend leaves its fused one-row kernel for several unfused kernels a layer. This kernel takes
// the valid length from the device itself, so the step keeps static shapes (one compiled
// function) and reads only the rows it attends to.
#pragma once

#include <cstdint>
#include <optional>

#include <mlx/mlx.h>

#include "kernels/cuda/backend.h"

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

struct DecodeAttention {
  int num_heads = 0;     // query heads N
  int kv_heads = 0;      // key/value heads Nkv (N a multiple of it)
  float scale = 1.f;     // applied to Q K^T
  int window = -1;       // > 0: only the last `window` keys up to pos (local attention)
  int split_rows = 0;    // > 0: the buffer's rows split into blocks of this many, combined after
};

// How many graph nodes this process has built with the kernel (the report's evidence that a
// decode step took it).
uint64_t decode_attention_nodes();
// ... of them (either form) attending in several splits and a combining kernel (split_rows).
uint64_t decode_attention_split_nodes();

// out[b, n, :] = softmax(scale * q[b, n] . K[b, g]^T) V[b, g] over key rows t in [lo, pos[b]],
// g = n / (N / Nkv), lo = max(0, pos[b] + 1 - window) with a window, else 0; row pos[b] is taken
// from k_new / v_new (the step's own key and value), rows below it from k_buf / v_buf.
//   q [B, N, H]; k_new, v_new [B, Nkv, H]; k_buf, v_buf [B, Nkv, P, H]; pos [B] int32, clipped
//   to [0, P - 1] as the present buffer's write position is.
// Returns [B, N, H] in q's dtype, or std::nullopt where the kernel does not apply (not a CUDA
// GPU stream, mixed dtypes, H over 256, P over 8192): the caller then
// uses the general path.
std::optional<mx::array> decode_attention(const mx::array& q, const mx::array& k_new,
                                          const mx::array& v_new, const mx::array& k_buf,
                                          const mx::array& v_buf, const mx::array& pos,
                                          const DecodeAttention& p, mx::Stream s);

// The same attention for a step whose projections come as the QKV product gives them, with the
// rotary embedding applied inside (GroupQueryAttention's do_rotary): one kernel where the general
// form takes slices, reshapes, a rotary kernel and copies, each an array MLX dispatches.
struct ProjectionLayout {
  // Head h's row of batch b in q starts at b * q_stride + q_offset + h * head_size (k, v alike):
  // a packed QKV row is one array three times over, with the offsets 0, N H and (N + Nkv) H.
  int q_stride = 0, q_offset = 0, k_stride = 0, k_offset = 0, v_stride = 0, v_offset = 0;
  bool interleaved = false;  // rotary pairs (2i, 2i + 1) instead of halves (i, i + RD / 2)
};
struct DecodeAttentionStep {
  mx::array out;    // [B, N * H]
  mx::array k_row;  // [B, Nkv, 1, H]: the step's key, rotated, for the buffer's row pos[b]
  mx::array v_row;  // [B, Nkv, 1, H]
};
uint64_t decode_attention_qkv_nodes();
// q, k, v: B rows of their strides (any shape of that size, T = k_buf's dtype); cos / sin:
// [rows >= P, RD / 2] tables, the rotation at position pos[b] (clipped as above), or none.
// std::nullopt where the kernel does not apply (as decode_attention, or tables short of P rows).
std::optional<DecodeAttentionStep> decode_attention_qkv(const mx::array& q, const mx::array& k, const mx::array& v,
                                                        const std::optional<mx::array>& cos,
                                                        const std::optional<mx::array>& sin, const mx::array& k_buf,
                                                        const mx::array& v_buf, const mx::array& pos,
                                                        const DecodeAttention& p, const ProjectionLayout& layout,
                                                        mx::Stream s);

}  // namespace ortmlx::kernels::cuda
