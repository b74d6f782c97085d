// The attention core the attention ops share (attention.cc): softmax(scale * Q K^T [softcap] +
// bias, masked) V with grouped heads, and the [B, S, N*H] <-> [B, N, S, H] layouts.
#pragma once

#include <optional>

#include "ops/contrib/contrib_internal.h"

namespace ortmlx::ops::contrib {

// q [B, N, S, H]; k [B, Nkv, T, H]; v [B, Nkv, T, Hv] with N a multiple of Nkv. mask: bool,
// true = attend, broadcastable to [B, N, S, T]; bias: additive, same broadcasting; sinks: [N]
// extra softmax logits (a smooth softmax). All in one float dtype. Returns out [B, N, S, Hv] and,
// when qk_mode >= 0, ONNX Attention's qk_matmul_output: 0 = scale * Q K^T, 1 = after softcap,
// 2 = after the mask/bias, 3 = after softmax.
struct Attn {
  mx::array out;
  std::optional<mx::array> qk;
};

Attn attend(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
            const std::optional<mx::array>& mask, const std::optional<mx::array>& bias,
            float softcap, const std::optional<mx::array>& sinks, mx::Stream s, int qk_mode = -1,
            bool causal = false);

mx::array to_bnsh(const mx::array& x, int B, int S, int N, int H, mx::Stream s);
mx::array from_bnsh(const mx::array& x, mx::Stream s);

}  // namespace ortmlx::ops::contrib
