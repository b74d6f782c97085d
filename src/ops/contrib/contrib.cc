// The com.microsoft transformer ops (and the newer ai.onnx ones of the same family): the table.
// Translators live by topic in attention.cc, rotary.cc, quantized_matmul.cc and contrib_norm.cc.
#include "ops/contrib/contrib_internal.h"

namespace ortmlx::ops {

namespace {

using namespace contrib;
constexpr std::string_view kMs = "com.microsoft";

const OpEntry kOps[] = {
    {kMs, "GroupQueryAttention", 1, kAnyOpset, check_gqa, translate_gqa,
     "float KV cache only (k_scale/v_scale declined); qk_output, sliding_window_cache, causal=0 "
     "and q/k_norm_weight declined; rows past a batch entry's length in a right-padded prompt "
     "attend to that entry's keys (ORT leaves them unspecified)"},
    {kMs, "MultiHeadAttention", 1, kAnyOpset, check_mha, translate_mha,
     "past_sequence_length/cache_indirection (beam-search buffers) and the qk output declined"},
    {kMs, "Attention", 1, kAnyOpset, check_attention_ms, translate_attention_ms,
     "do_rotary, past_present_share_buffer and 4-D masks declined"},
    {"", "Attention", 23, kAnyOpset, check_attention_onnx, translate_attention_onnx,
     "softmax_precision: computed in float32 for fp16/bf16 on the CPU backend, else in the input "
     "type; softcap acts before the mask and qk_matmul_output_mode 1/2 are after softcap / after "
     "mask, as ONNX 1.22 defines them and ORT's CPU EP computes (the node tests "
     "test_attention_*_qk_matmul_{bias,softcap}* expect the earlier order: mask, then softcap)"},
    {kMs, "RotaryEmbedding", 1, kAnyOpset, check_rotary_ms, translate_rotary_ms,
     "is_packed_batching declined; `scale` is ignored (as ORT's kernels do)"},
    {"", "RotaryEmbedding", 23, kAnyOpset, check_rotary_onnx, translate_rotary_onnx},
    // normalizations
    {kMs, "SkipLayerNormalization", 1, kAnyOpset, check_skip_layer_norm, translate_skip_layer_norm},
    {kMs, "SkipSimplifiedLayerNormalization", 1, kAnyOpset, check_skip_layer_norm,
     translate_skip_simplified_layer_norm, "the unused `mean` output is zeros, as on ORT's CPU EP"},
    {kMs, "SimplifiedLayerNormalization", 1, kAnyOpset, check_simplified_layer_norm,
     translate_simplified_layer_norm},
    // ORT registers SimplifiedLayerNormalization in the default domain and exporters use that.
    {"", "SimplifiedLayerNormalization", 1, kAnyOpset, check_simplified_layer_norm,
     translate_simplified_layer_norm},
    {kMs, "EmbedLayerNormalization", 1, kAnyOpset, check_embed_layer_norm, translate_embed_layer_norm,
     "mask_index is the count of ones per row (ORT's CPU kernel)"},
    // activations
    {kMs, "FastGelu", 1, kAnyOpset, check_float_activation, translate_fast_gelu},
    {kMs, "BiasGelu", 1, kAnyOpset, check_erf_activation, translate_bias_gelu,
     "float64 declined (MLX's erf is float32-accurate)"},
    {kMs, "Gelu", 1, kAnyOpset, check_erf_activation, translate_gelu_ms,
     "float64 declined (MLX's erf is float32-accurate)"},
    {kMs, "QuickGelu", 1, kAnyOpset, check_float_activation, translate_quick_gelu},
    {kMs, "BiasAdd", 1, kAnyOpset, check_bias_add, translate_bias_add},
    {kMs, "BiasSplitGelu", 1, kAnyOpset, check_bias_split_gelu, translate_bias_split_gelu},
    // quantized weights
    {kMs, "MatMulNBits", 1, kAnyOpset, check_matmul_nbits, translate_matmul_nbits,
     "bits 2/4/8, any power-of-2 block_size >= 16; accuracy_level 4 quantizes A to int8 per block "
     "as ORT's CPU EP does (absent/uint8 zero points, no g_idx; option int8_emulation, default on "
     "MLX's CPU device only: the GPU keeps A in float, as ORT's GPU EPs), other levels compute in float; "
     "g_idx with packed uint8 zero_points declined (ORT's CPU kernel ignores those zero points); "
     "weight_prepacked declined"},
    {kMs, "GatherBlockQuantized", 1, kAnyOpset, check_gather_block_quantized,
     translate_gather_block_quantized,
     "uint8 data only (gather_axis 0, packed along the last axis)"},
};

}  // namespace

std::span<const OpEntry> contrib_ops() { return kOps; }

}  // namespace ortmlx::ops
