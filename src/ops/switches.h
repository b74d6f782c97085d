// Engine options that choose between two exact translations of the same nodes (docs/options.md:
// fused_rotary, zero_bias, grouped_kv, cpu_gemv, gpu_kernels, flat_products, cpu_dnnl, cpu_dnnl_matmul, int4_dense_rows, ...), as translators and their helpers
// read them. The engine sets them for each translation (Program::run_steps, a SwitchesScope);
// outside one (a C++ test calling a translator directly) every switch is on, the default.
// Thread-local rather than an EngineHooks field: the rotary rotation and the CPU kernels are
// reached from helpers that take only a stream.
#pragma once

#include "kernels/cpu/kernels.h"

namespace ortmlx::ops {

struct TranslationSwitches {
  bool fused_rotary = true;  // rotary halves as one compiled kernel (contrib/rotary.cc)
  bool zero_bias = true;     // attention leaves out a bias known to be all zeros (known_all_zero)
  bool grouped_kv = true;    // MultiHeadAttention reads the grouped cache under a repeated K/V
  bool cpu_kernels = true;   // the EP's CPU kernels (kernels/cpu/kernels.h)
  bool gpu_kernels = true;   // the EP's CUDA kernels where an op has one (kernels/cuda)
  bool skip_norm_kernel = true;  // ... SkipSimplifiedLayerNormalization's (kernels/cuda/skip_rms_norm.h)
  bool gqa_step_kernel = true;   // ... a shared-buffer decode step's GroupQueryAttention from its projections
  bool flat_products = true;     // products by a matrix read their rows flat (ops/common.h as_rows)
  bool cpu_conv_library = true;  // float32 convolutions on the CPU through oneDNN (kernels/cpu/dnnl_conv.cc)
  int64_t cpu_conv_library_min_flops = 0;  // ... those of at least this much work
  int64_t cpu_conv_parallel_min_flops = 5000000;  // ... on one thread below this much
  int int4_dense_rows = 128;     // GPU MatMulNBits with this many rows: dequantize + dense product (0: never)
  bool int4_dequantize_kernel = true;  // ... dequantized by the EP's kernel (kernels/cuda/dequantize.h), not MLX's
  // float32 products of several rows by a matrix on the CPU through oneDNN's sgemm
  // (kernels/cpu/dnnl_matmul.cc), those of at least cpu_conv_library_min_flops
  bool cpu_matmul_library = false;  // off by default: not signal-safe (kernels.h)
  // oneDNN convolutions leave their outputs blocked for a following one that reads that layout
  bool cpu_conv_blocked = true;
  // 2-D float32 depthwise convolutions as the EP's kernel over NCHW (kernels/cpu/depthwise.cc),
  // unless their input is a oneDNN convolution's blocked output
  bool cpu_depthwise = true;
  // 2-D float32 ConvTranspose whose kernel equals its stride as the EP's kernel over NCHW
  // (kernels/cpu/patch_deconv.cc)
  bool cpu_patch_deconv = true;
  // a shared-buffer decode step's attention splits the buffer's rows into blocks of this many
  // (kernels/cuda/decode_attention.h; 0: one block a head)
  int gpu_attention_split_rows = 128;
  // the EP's CPU kernels take their AVX-512 forms where the CPU has AVX-512F (kernels.h)
  bool cpu_avx512 = true;
  // float32 products of several rows by a constant matrix as the EP's packed-panel kernel
  // (kernels/cpu/packed_gemm.cc)
  bool cpu_packed_matmul = true;
  // runs on MLX's CPU device are walked (engine/caller_eval.h), which computes MLX's own ops but
  // not its generated kernels: helpers keep the plain ops there
  bool cpu_caller_eval = true;
  // MatMulNBits prompt rows with int8 blocks as integer products (kernels/cpu/int4_gemv.cc)
  bool cpu_int4_gemm = true;
  // attention over several query rows through the EP's kernel (kernels/cpu/attention.cc)
  bool cpu_attention = true;
  // a decode step's GroupQueryAttention on the CPU as one kernel (kernels/cpu/decode_attention.cc)
  bool cpu_gqa_step = true;
  // the packed kernel's blocked walk: threads by panels, rows in blocks, the next panel asked for
  bool cpu_packed_blocks = true;
  // LayerNormalization after an Add, and the skip normalizations, as one kernel with their add
  // (kernels/cpu/layer_norm.cc)
  bool cpu_skip_norm = true;
  // a prompt's GroupQueryAttention inputs laid out per head, q and k rotated, as one kernel
  // (kernels/cpu/decode_attention.cc, cpu_gqa_layout)
  bool cpu_gqa_prompt = true;
  // the packed kernel's threads take rows where each gets this many or more (0: never)
  int64_t cpu_packed_rows = 64;
  // a product of one row tile: columns split in 16s, each range streamed with lines this many
  // bytes ahead asked for (0: the blocked walk)
  int64_t cpu_packed_stream = 6144;
  // a product of several row tiles: each tile asks for its panel's lines this many bytes ahead
  int64_t cpu_packed_ahead = 6144;
  // the packed kernel's K blocks this deep (0: from the L2's size)
  int64_t cpu_packed_depth = 0;
  // a MatMul's or Gemm's constant weight laid out as panels once for the program
  bool cpu_packed_prepared = true;
  // a residual Add after a oneDNN convolution as its Sum post-op (kernels.h, cpu_dnnl_conv_add)
  bool cpu_conv_add = true;
  // oneDNN convolutions in 16-channel blocks (a graph's Convs marked kConvBlocked16, which the
  // engine does under cpu_dnnl_blocked16) of a 3 x 3 kernel, stride 1, one group, by oneDNN's
  // Winograd kernels
  bool cpu_conv_winograd = true;
  // ... and a channel Concat of such convolutions of one image computed into its buffer
  // (cpu_dnnl_convs_concat)
  bool cpu_concat_convs = true;
};

// The calling thread's current switches.
const TranslationSwitches& translation_switches();

// Whether a CPU kernel of `flops` work splits over the threads: at least the switches'
// cpu_conv_parallel_min_flops, and not inside a one-thread WorkScope. The flops count toward
// the enclosing WorkScope.
bool parallel_work(double flops);

// Counts the work (parallel_work's flops) of the kernels translated inside; with `one_thread`,
// none of them splits. Why: a program whose whole run is a few microseconds of arithmetic (a
// VAD step, a wake-word head) loses more to waking the threads, and to their spinning beside
// the caller between runs, than a split of its largest kernel saves. Nests.
class WorkScope {
 public:
  explicit WorkScope(bool one_thread);
  ~WorkScope();
  WorkScope(const WorkScope&) = delete;
  WorkScope& operator=(const WorkScope&) = delete;
  double flops() const;
  bool split() const;  // some kernel inside chose to split

 private:
  double prev_flops_;
  bool prev_split_;
  bool prev_one_thread_;
};

// Sets the calling thread's switches until destroyed (nests: restores the previous ones).
class SwitchesScope {
 public:
  explicit SwitchesScope(const TranslationSwitches& s);
  ~SwitchesScope();
  SwitchesScope(const SwitchesScope&) = delete;
  SwitchesScope& operator=(const SwitchesScope&) = delete;

 private:
  TranslationSwitches prev_;
  RowKernelsScope kernels_;
};

}  // namespace ortmlx::ops
