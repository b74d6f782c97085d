// Row-vector x matrix products on MLX's CPU stream through BLAS's sgemv.
//
// Why: MLX's CPU Matmul always calls sgemm. For a single row (every decode step of an LLM) the
// BLAS we link (Debian's OpenBLAS 0.3.21) packs the whole weight matrix on every sgemm call, and
// sgemv does not (several times faster for decode-sized rows; the A/B is in
// docs/performance.md). Weight reads are the decode step, so this is most of its time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <optional>
#include <type_traits>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/buffers.h"

namespace mlx::core::cpu {
struct CommandEncoder;
}

namespace ortmlx::ops {

namespace mx = mlx::core;

// x @ w for a float32 x holding one row ([K], or [1, ..., 1, K]) and a 2-D float32 w [K, N], as
// one MLX primitive that calls sgemv, when `s` is a CPU stream and the process has a CBLAS
// sgemv; std::nullopt otherwise (the caller uses mx::matmul). The result has x's shape with the
// last dim N. Any strides work (a transposed weight view is read as such, without a copy).
// small_products: many small products (attention's, one per head) run single-threaded with
// this library's AVX2 loops instead of BLAS (see RowGemv in gemv.cc).
std::optional<mx::array> cpu_row_gemv(const mx::array& x, const mx::array& w, mx::Stream s,
                                      bool small_products = false);

// Whether the gemv path is available: a CBLAS sgemv was found and the kernels are on (below).
bool cpu_gemv_available();
// Whether the EP's CPU kernels (all of this header) may run: the engine option cpu_gemv
// (env ORT_MLX_CPU_GEMV), set for the calling thread's translation by a RowKernelsScope (the
// kernels are reached from helpers that take only a stream). On outside any scope.
bool cpu_row_kernels_enabled();
// Whether the kernels that have an AVX-512 form take it: the CPU has AVX-512F and the engine
// option cpu_avx512 is on (set with the kernels' scope below).
bool cpu_avx512_kernels();
bool cpu_has_avx512f();  // the CPU has AVX-512F (detected once)
class RowKernelsScope {
 public:
  explicit RowKernelsScope(bool on, bool avx512 = true);
  ~RowKernelsScope();
  RowKernelsScope(const RowKernelsScope&) = delete;
  RowKernelsScope& operator=(const RowKernelsScope&) = delete;

 private:
  bool prev_, prev_avx512_;
};

// One float32 row times a 4-bit blockwise-quantized weight in MatMulNBits's layout, on MLX's CPU
// stream: y[n] = sum_b scales[n, b] * (q[n, b, :] . x_b) + zbias[n, b] * sum(x_b), with
// zbias = -scale * zero_point. packed: uint8 [N, n_blocks * block / 2] (low nibble first);
// scales, zbias: float32 [N, n_blocks]. x: float32 with one row of K ([K] or [1, ..., 1, K]).
// Why: MLX's CPU quantized_matmul is a scalar loop (~50 ms a decode step on a 60M-parameter
// model, ORT's CPU EP takes 4); this reads the 4-bit weights once, with AVX2 where the CPU has it,
// split over threads. int8_blocks: x is first quantized to int8 per block and back (MatMulNBits
// accuracy_level 4, as ORT's CPU EP computes it; the same arithmetic as the graph-level
// fake_quant_int8_blocks, ~13 MLX ops fewer per product). mid_zero: every zero point is 8 (none
// given), zbias is not read. std::nullopt when `s` is not a CPU stream or the shapes do not fit.
std::optional<mx::array> cpu_int4_gemv(const mx::array& x, const mx::array& packed,
                                       const mx::array& scales, const mx::array& zbias, int K,
                                       int block, mx::Stream s, bool int8_blocks = false, bool mid_zero = false);
// The same product with int8 blocks (accuracy_level 4) on a CPU with AVX-512 VNNI, blocks of 32
// to 256, from one copy of the weight laid out as panels of 16 outputs (cpu_int4_panel_codes and
// cpu_int4_panel_floats, made once from constant weights): the rows quantized per block as MLAS
// does, integer sums per block by vpdpbusd, scaled per block as ORT's CPU EP scales them. A
// decode row ("Int4PanelGemv") takes four panels a step, prompt rows ("Int4GemmVnni") tiles of 4
// rows x 32 outputs, split over the threads. Why: the float form does 4x the multiply-adds an
// instruction, and one layout for prompts and decode steps leaves in the caches, after a prompt,
// the weights the next steps read (two layouts: the steps after a prompt read theirs from memory).
bool cpu_int4_panels_apply(int block);
// ORT's bytes [N, n_blocks * block / 2] -> uint8 [panels, Kp * 8]: per panel and group of 8
// values of K, 64 bytes, lane n's 4 bytes holding output n's codes k..k+3 (low nibbles) and
// k+4..k+7 (high); outputs past N zero. MLX ops (prepared once by the translator).
mx::array cpu_int4_panel_codes(const mx::array& packed, mx::Stream s);
// Panel layouts made in this process (cpu_int4_panel_codes calls): one per weight when its
// prompts and decode steps share it.
uint64_t cpu_int4_panel_layouts();
// Per-block floats [N, n_blocks] (scales, zero biases) -> float32 [panels, n_blocks * 16].
mx::array cpu_int4_panel_floats(const mx::array& per_block, mx::Stream s);
// x [..., K] float32 times the panel weight; zbias absent: every zero point is 8 (not read).
std::optional<mx::array> cpu_int4_panel_product(const mx::array& x, const mx::array& codes, const mx::array& scales,
                                                const std::optional<mx::array>& zbias, int K, int N, int block,
                                                mx::Stream s);
// A decode step's GroupQueryAttention (one sequence, one new token, float32) as one kernel: the
// step's query and key rotated at its position (ORT's rotary, halves or interleaved, when
// rotary_dim > 0), the present caches (a growing cache: the past's rows and the new one; a shared
// buffer, in_buffer: the past buffer with the new row at seqlens_k, clipped to it), then each
// query head's softmax(scale q K^T) V over the present's rows [max(0, pos + 1 - window), pos + 1)
// (window <= 0: all), grouped heads reading their KV head in place. A present bound to ORT's
// output buffer (kernels/cpu/buffers.h) that is the past's own (a shared buffer) gets the new row
// only. q, k, v: [1, 1, *], the heads from q_offset / k_offset / v_offset (a packed projection
// passed three times); past_k, past_v [1, Nkv, P, H]; seqlens [1] int32; cos, sin [rows,
// rotary_dim / 2]. Returns {attention [1, 1, N * H], present_k, present_v}, or nullopt.
struct CpuGqaHeads {  // the heads of q, k and v, and their rotation (0: none)
  int N = 0, Nkv = 0, H = 0;
  int q_offset = 0, k_offset = 0, v_offset = 0;
  int rotary_dim = 0;
  bool interleaved = false;
  bool operator==(const CpuGqaHeads&) const = default;
};
struct CpuDecodeGqa : CpuGqaHeads {
  float scale = 1.f;
  int window = -1;
  bool in_buffer = false;
  bool operator==(const CpuDecodeGqa&) const = default;
};
std::optional<std::vector<mx::array>> cpu_decode_gqa(const mx::array& q, const mx::array& k, const mx::array& v,
                                                     const mx::array& past_k, const mx::array& past_v,
                                                     const mx::array& seqlens, const std::optional<mx::array>& cos,
                                                     const std::optional<mx::array>& sin, const CpuDecodeGqa& g,
                                                     mx::Stream s);
// A prompt's (or a chunk's) GroupQueryAttention inputs laid out per head in one pass on MLX's CPU
// stream (kernels/cpu/decode_attention.cc): q, k, v [1, S, *] (a packed projection passed three
// times, the heads from the offsets) into q [1, N, S, H], k and v [1, Nkv, S, H], q and k rotated
// as the decode kernel rotates them (rotary_dim > 0: cos, sin [rows, rotary_dim / 2], row s at
// position first + s). Why: composed, the rotation is slices, products and a sum over MLX's
// single-threaded ops, and the present cache a strided copy of the transposed keys and values.
// Returns {q, k, v}, or nullopt (off the CPU, other dtypes, positions past the tables).
struct CpuGqaLayout : CpuGqaHeads {
  int first = 0;
  bool operator==(const CpuGqaLayout&) const = default;
};
std::optional<std::vector<mx::array>> cpu_gqa_layout(const mx::array& q, const mx::array& k, const mx::array& v,
                                                     const std::optional<mx::array>& cos,
                                                     const std::optional<mx::array>& sin, const CpuGqaLayout& g,
                                                     mx::Stream s);
// exp(x - max) / sum over one row of n floats (vectorized where the CPU allows).
void softmax_row(const float* x, float* y, int n);

// Softmax over the last axis of a float32 array on MLX's CPU stream, rows split over threads,
// with an AVX2 exp where the CPU has it. Why: MLX's CPU softmax evaluates exp one lane at a time
// and calls libm's out-of-line fmaf (exp + fmaf were 27% of the MiniLM encoder's profile at
// batch 8 x 256). Same results as max-shifted exp / sum: rows whose max is not finite take
// std::exp (so -inf rows give NaN as usual); exp underflow below -87.3 gives 0 (true value <
// 1.2e-38). std::nullopt off the CPU or for other dtypes.
std::optional<mx::array> cpu_softmax_last_axis(const mx::array& x, mx::Stream s);

// softmax(scores) @ v, scores = (q @ kt) / scale (divide) or * scale, plus an additive bias, for
// float32 q [.., S, H], kt [.., H, T] (K transposed), v [.., T, Hv] of rank 3 or 4 whose
// leading dims kt, v and the bias ([.., S, T] at most) broadcast to q's: one primitive on MLX's
// CPU stream (kernels/cpu/attention.cc), (batch, head) pairs split over the threads; per pair
// K^T and V are gathered once from any strides, each four query rows' scores stay in the
// thread's scratch through the softmax (RowSoftmax's arithmetic, AVX-512 exp) and the weighted
// sum of V. Why: composed, an encoder's attention is five primitives a layer, two of them
// OpenBLAS's batched products of 32-deep rows and three passes over the [.., S, T] scores
// (MiniLM at 8 x 128: ~a fifth of its time). std::nullopt off the CPU, without AVX-512 (or with
// cpu_avx512 off) or for shapes that do not fit.
// Grouped heads: K/V of rank 4 with fewer heads than q, each serving heads / kv_heads query heads.
// causal: query row i sees keys [0, T - S + i] (bottom-right aligned; a row that sees none is NaN).
// heads_inner: rank 4 only, the result transposed to [B, S, N, Hv] (each head's rows written
// where the heads lie side by side).
std::optional<mx::array> cpu_attention(const mx::array& q, const mx::array& kt, const mx::array& v, float scale,
                                       bool divide, const std::optional<mx::array>& bias, mx::Stream s,
                                       bool causal = false, bool heads_inner = false);

// A transcendental function of a float32 array on MLX's CPU stream, 8 lanes at a time where the
// CPU has AVX2, split over threads (kernels/cpu/unary.cc). Why: MLX's CPU backend runs these one
// lane at a time through libm's out-of-line fmaf (a sigmoid of 100K floats ~60x ORT's time; in
// the MiniLM encoder at batch 8 x 128 its GELU took as long as all the matrix products).
// Erf: MLX's formula (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7); Gelu: 0.5 x (1 + erf(x /
// sqrt 2)); Exp: Cephes' expf over the whole range (within ~2 ulp; 0 where the true value is
// below ~1e-45, inf above FLT_MAX); Sigmoid: 1 / (1 + exp(-x)); Tanh: Cephes' tanhf (a
// polynomial under |x| 0.625, 1 - 2 / (exp(2|x|) + 1) above). NaN stays NaN. std::nullopt off
// the CPU, with the CPU kernels off, for other dtypes, or under kCpuUnaryMinElements: there
// MLX's own op costs less, since a compiled program fuses it with its elementwise neighbours
// into one primitive, and each primitive costs a hand-off to the stream thread.
inline constexpr size_t kCpuUnaryMinElements = 256;
enum class CpuUnary { Erf, Gelu, Exp, Sigmoid, Tanh };
std::optional<mx::array> cpu_unary(CpuUnary f, const mx::array& x, mx::Stream s);
// g * sigmoid(g) * up for float32 g and up of one shape (a Llama MLP's gate; graph/fuse_swiglu.h)
// in one pass on MLX's CPU stream, split over the threads: the sigmoid is cpu_unary's and the two
// products MLX's, in that order, so the bits are those of the three ops apart. nullopt off the CPU,
// for other dtypes or shapes, or below cpu_unary's size.
std::optional<mx::array> cpu_swiglu(const mx::array& g, const mx::array& up, mx::Stream s);
// y = f(x) over n floats with cpu_unary's formulas, on the calling thread (for other kernels' steps;
// `avx512` as cpu_unary's primitive takes it from cpu_avx512_kernels()).
void cpu_unary_rows(CpuUnary f, const float* x, float* y, int64_t n, bool avx512 = false);
// The function cpu_unary_rows calls, for a kernel that applies f to many short rows.
using CpuUnaryFn = void (*)(const float* x, float* y, int64_t n);
CpuUnaryFn cpu_unary_fn(CpuUnary f, bool avx512 = false);

// One of MLX's own elementwise primitives (by its name) computed by the calling thread into a
// new row-contiguous `out`, for the evaluation on the caller (engine/caller_eval.h): float32
// Add, Subtract, Multiply, Divide, Maximum, Minimum, Power; Negative, Abs, Square, Sqrt, Rsqrt,
// Log, Exp, Sigmoid, Tanh, Erf with MLX's own formulas (the same bits); AsType among float32, int32,
// int64 and bool. Inputs of any layout; large ones split over the threads. False (nothing done)
// for any other primitive or dtype.
bool cpu_elementwise_on_caller(std::string_view name, const std::vector<mx::array>& inputs, mx::array& out);
// Those, and MLX's Gather (indices in range) and float32 Matmul (the same cblas_sgemm calls as
// MLX's), by the primitive (kernels/cpu/mlx_on_caller.cc). False (nothing done) for the rest.
bool cpu_mlx_primitive_on_caller(mx::Primitive& p, const std::vector<mx::array>& inputs,
                                 std::vector<mx::array>& outputs);

// x @ w for a float32 x [..., K] of rows (taken flat; one row too) and a constant 2-D float32 w
// [K, N] (any strides: Gemm's transposed weight is read as such), as one MLX primitive on the CPU
// stream; the result has x's shape with the last dim N. w is laid out once (on the first run, one
// copy for every primitive over the same buffer) as panels of 48 columns (16 with AVX2) that the
// register tiles (8 x 48, AVX2 6 x 16) stream through; K in blocks of 512; tiles split over the
// threads with `parallel`. With `blocks`, the threads take panels (rows where there are too few
// panels), each walks rows in blocks of 128 over its panels, and each tile asks for its share of
// the next panel into L2 while it computes; without, the threads take (panel, row tile) items. Why: OpenBLAS's sgemm packs the weight on every call, and for an
// encoder's rows (16 to a few hundred) ran at about a third of what the cores reach; a decode
// step's one row streams the panels, contiguous a thread, faster than OpenBLAS's sgemv reads
// the matrix. std::nullopt off the CPU or x86-64 without AVX2, for other dtypes, or with the
// CPU kernels off.
// With `rows` > 0 (and `blocks`), a product of at least `rows` rows a thread splits its rows over
// the threads instead, each thread all the panels: the rows stay on the core whose kernels before
// and after wrote and read them (row-split too), each thread reading the whole weight.
// With `ahead` > 0, a product of one row tile (up to 8 rows with AVX-512, 6 with AVX2: a decode
// step's) splits its columns over the threads in 16-column steps, each thread's range walked over
// the whole depth, its tiles asking for the lines `ahead` bytes past the ones they read.
// With `tile_ahead` > 0, the tiles of the other products ask for their panel's lines `tile_ahead`
// bytes past the ones they read (from L2 or the L3 into L1; AVX2's tiles, whose panel rows are a
// third as wide, a third as far: the same depth).
// `bias`: a float32 [N] the sums start from (a MatMul's fused bias Add, graph/fuse_matmul_bias.h).
// `epilogue`: cpu_unary's map applied to each tile of the product as it is stored (a fused Gelu),
// the same bits as cpu_unary over the product; the primitive is then named PackedMatmulGelu.
struct PackedWalk {
  bool blocks = true;    // cpu_packed_blocks
  int64_t rows = 64;     // cpu_packed_rows
  int64_t ahead = 6144;  // cpu_packed_stream
  int64_t tile_ahead = 6144;  // cpu_packed_ahead
  int64_t depth = 0;          // cpu_packed_depth: K blocks this deep (0: from the L2's size)
  bool operator==(const PackedWalk&) const = default;
};
// `panels`: w laid out already (cpu_packed_panels, for this process's tiles), read in place of
// w's own panels; ignored when they do not fit w's shape.
std::optional<mx::array> cpu_packed_matmul(const mx::array& x, const mx::array& w, bool parallel,
                                           const PackedWalk& walk, mx::Stream s,
                                           const std::optional<mx::array>& bias = std::nullopt,
                                           std::optional<CpuUnary> epilogue = std::nullopt,
                                           const std::optional<mx::array>& panels = std::nullopt);
// An evaluated float32 w [K, N] laid out now as cpu_packed_matmul's panels (in 2 MiB pages from
// 4 MiB), as an array that owns them. Why: the primitive's own layout lives while a primitive
// holds it, and an eager run's primitives go with the run, so a session's first prompt and its
// first decode steps each laid every weight out again; a program keeps these (constant_memo)
// for its lifetime. std::nullopt where cpu_packed_matmul declines, or w is not evaluated.
std::optional<mx::array> cpu_packed_panels(const mx::array& w);
uint64_t cpu_packed_panel_layouts();  // weights laid out as panels in this process (either way)
uint64_t cpu_packed_matmul_runs();  // products computed by it in this process
uint64_t cpu_packed_huge_page_bytes();  // bytes of its weights' panels asked for in 2 MiB pages
uint64_t cpu_packed_prefetch_bytes();  // bytes of next panels its tiles asked into L2
uint64_t cpu_packed_row_splits();  // products whose rows it split over the threads
uint64_t cpu_packed_stream_walks();  // products of one row tile it split by columns, walked ahead
uint64_t cpu_packed_ahead_walks();  // products of several row tiles whose tiles asked for lines ahead
int64_t cpu_packed_default_depth();  // its K blocks' depth where cpu_packed_depth is 0 (from the L2's size)

// A pointwise convolution (1x1 kernel, stride 1, no padding) of float32 NCHW... `x` as it lies
// with groups: y[n, g*Mg + m, p] = bias[g*Mg + m] + sum_k w[g*Mg + m, k] x[n, g*Cg + k, p], then
// max(y, 0) with `relu`; `w` the row-contiguous [M, Cg] weight. The output positions are split
// over the threads with `parallel`, else the stream thread computes them alone. Why: MLX runs
// it as reshapes around a batched product, one OpenBLAS call per group (small calls, whose
// threads then spin), and each reshape is a primitive every run. 6 x 16 register tiles where
// the CPU has AVX2. std::nullopt off the CPU, for other dtypes or shapes, and under
// kPointwiseMinDepth input channels a group (a tile's loads and stores then outweigh its sums).
// Shufflenet's 6-channel groups take the kernel: alone slower than OpenBLAS's sgemm, but that
// call leaves OpenBLAS's worker spinning beside the OpenMP threads for the rest of the run.
inline constexpr int64_t kPointwiseMinDepth = 4;
// `constant_weight`: `w` is a constant of the graph, whose buffer keeps its contents, so the
// kernel's layout of it is made once (else on every run). `residual` (the output's shape): added
// to each output in the tiles before the Relu (a residual block's Add after its last
// convolution).
std::optional<mx::array> cpu_pointwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                            int groups, bool relu, bool parallel, bool constant_weight,
                                            mx::Stream s, const std::optional<mx::array>& residual = std::nullopt);

// A 2-D ConvTranspose whose kernel equals its stride (no padding, dilation 1, one group) of
// float32 NCHW `x` as it lies, `w` [C, O, kh, kw] (ONNX's layout): each input position becomes
// its own kh x kw patch of every output channel, y[n, o, i*kh + a, j*kw + b] = bias[o] +
// sum_c w[c, o, a, b] x[n, c, i, j], written straight into NCHW; input rows split over the
// threads with `parallel`. Why: oneDNN's deconvolution takes a 16-channel blocked layout (a
// one-channel output computed 16 times) and reorders around it; MLX's CPU backend dilates the
// input. std::nullopt off the CPU, for other dtypes or shapes, with the CPU kernels off.
std::optional<mx::array> cpu_patch_deconv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                          bool parallel, mx::Stream s);

// Nearest-neighbour upsampling of float32 NCHW `x` by whole factors kh, kw (each input element
// a kh x kw block of the output), rows split over the threads for outputs of some size. Why:
// MLX forms it as a broadcast and a reshape per axis, two copies through its general strided
// copy on one thread (an FPN's or a DB neck's upsampling). std::nullopt off the CPU, for other
// dtypes or ranks, with the CPU kernels off.
std::optional<mx::array> cpu_nearest_upsample(const mx::array& x, int kh, int kw, mx::Stream s);

// One LSTM step's cell for float32 rows (ONNX's default activations, no peepholes): the gates
// g = xw + hr ([..., 4H], in ONNX's order i, o, f, c) give c' = sigmoid(f) c + sigmoid(i)
// tanh(c~) and h' = sigmoid(o) tanh(c'); returns {h', c'} of c's shape [..., H]. Why: as MLX ops
// those are a dozen small primitives a step, each a task of the stream thread. std::nullopt off
// the CPU, for other dtypes or shapes, with the CPU kernels off.
std::optional<std::vector<mx::array>> cpu_lstm_cell(const mx::array& xw, const mx::array& hr, const mx::array& c,
                                                    mx::Stream s);
uint64_t cpu_lstm_cell_runs();  // steps computed by it in this process

// A 2-D depthwise convolution (groups = channels, one output channel each) of float32 NCHW `x`
// as it lies, `w` [C, 1, kh, kw]: per channel plane, each output row accumulated tap by tap
// over the columns whose input lies inside the row (8 at a time with AVX2, strides 1 and 2),
// zero padding, bias and a first Relu inside; planes split over the threads with `parallel`.
// Why: oneDNN runs it in its blocked layout, so between the EP's NCHW kernels (shufflenet's
// grouped pointwise convolutions, its channel shuffles) every one paid a reorder in and out.
// std::nullopt off the CPU, for other dtypes or shapes, with the CPU kernels off.
std::optional<mx::array> cpu_depthwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                            const std::vector<int>& stride, const std::vector<int>& pad_lo,
                                            const std::vector<int>& pad_hi, const std::vector<int>& dilation,
                                            bool relu, bool parallel, mx::Stream s);

// Layer normalization over the last axis of float32 `x`: (x - mean) / sqrt(var + eps) * scale
// (+ bias), scale and bias float32 vectors over that axis; per row the mean, then the mean of
// squared deviations (8 lanes at a time where the CPU has AVX2), rows split over the threads
// from 64K elements. With `rms`, RMS normalization: the mean taken as 0 (x / sqrt(mean(x^2) +
// eps) * scale). Why: MLX's CPU fast::layer_norm and fast::rms_norm are their composed forms,
// five and four primitives a normalization (single-threaded reductions among them).
// std::nullopt off the CPU, for other dtypes or shapes.
std::optional<mx::array> cpu_layer_norm(const mx::array& x, const mx::array& scale, const std::optional<mx::array>& bias,
                                        float eps, mx::Stream s, bool rms = false);
// The same normalization of x + skip (+ bias) (SkipLayerNormalization, and its RMS form with
// `rms`) as one primitive: each row's sum made and normalized in one pass, returned as a second
// output with `with_sum` (a decoder's residual stream reads it), else left in the output's row
// and normalized in place. Why: MLX's add before the row kernel is a primitive of its own, on
// one thread, with a buffer of the whole sum. x and skip float32 of one shape, bias, scale and
// beta float32 vectors over the last axis; std::nullopt otherwise or off the CPU.
std::optional<std::vector<mx::array>> cpu_skip_norm(const mx::array& x, const mx::array& skip,
                                                    const std::optional<mx::array>& bias, const mx::array& scale,
                                                    const std::optional<mx::array>& beta, float eps, bool rms,
                                                    bool with_sum, mx::Stream s);

// Concatenation of same-dtype arrays along `axis` on MLX's CPU stream, one memcpy per
// contiguous chunk. Why: MLX's CPU concatenate copies each input through its generic strided
// copy; appending a decode step to a 60M model's KV cache at context 1024 (16 MB a step) took
// ~7 ms of the step that way. std::nullopt off the CPU or when the shapes do not fit.
std::optional<mx::array> cpu_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s);

// Float32 convolutions through oneDNN (kernels/cpu/dnnl_conv.cc), in ONNX's layout: x [N, C, D..],
// w [M, C/groups, K..], y [N, M, out..]; transposed (ConvTranspose, oneDNN's deconvolution):
// w [C, M/groups, K..], padding as ONNX's pads less output_padding at the end. Why: MLX's CPU convolution runs at a third of what
// oneDNN's blocked-layout kernels reach on the same cores (docs/performance.md); oneDNN takes the
// plain layouts in and out itself, so no NCHW<->NHWC transposes are added around it either.
// The library is loaded at run time (libdnnl.so.2, this library's folder first).
// An elementwise step oneDNN applies to each block of a convolution's output while it is in
// cache (a post-op), in order.
struct ConvPostOp {
  enum Kind { Relu, Clip, Linear, HardSwish, Logistic, Tanh, Swish, Sum };
  Kind kind = Relu;
  // Relu: the slope below 0; Clip: the bounds; Linear: alpha * y + beta; Swish: y * sigmoid(alpha * y);
  // Sum: y + what the destination held (cpu_dnnl_conv_add's residual), only as the first
  float alpha = 0.f, beta = 0.f;
};
struct DnnlConvShape {
  mx::Shape x, w, y;
  std::vector<int> stride, pad_lo, pad_hi, dilation;  // per spatial dim; padding non-negative
  int groups = 1;
  bool bias = false;
  std::vector<ConvPostOp> post_ops;  // applied by the convolution itself
  bool transposed = false;
  int threads = 0;  // at most this many OpenMP threads for it (0: oneDNN's default, every core)
  // Channels in blocks of 16 (nChw16c) on each side whose channel count is a multiple of 16,
  // rather than the layout oneDNN picks (channels-last on AVX-512 CPUs).
  bool blocked16 = false;
  // With blocked16: oneDNN's Winograd algorithm where it has a kernel for the geometry (2-D,
  // 3 x 3, stride 1, one group), its direct one otherwise.
  bool winograd = false;
  std::string key() const;  // the geometry, for caches
};
struct DnnlConvPlan;  // oneDNN's objects for one geometry, shared by every program of the process
// The plan for a geometry on MLX's CPU stream `s`; null when oneDNN is not loaded, `s` is not a
// CPU stream, or oneDNN has no implementation for it.
std::shared_ptr<const DnnlConvPlan> cpu_dnnl_conv_plan(const DnnlConvShape& g, mx::Stream s);
// The weight w (as in DnnlConvShape, any float dtype) in the plan's own layout: a 1-D array to
// compute once per program and hand to every run's cpu_dnnl_conv.
mx::array cpu_dnnl_conv_weights(const std::shared_ptr<const DnnlConvPlan>& plan, const mx::array& w, mx::Stream s);
// y = conv(x, w) + bias (bias [M] or none; the plan says which), then the plan's post-ops;
// float32. With `blocked_out` the convolution leaves its output in its own (blocked) layout and
// y is an unblocking of it, which a following cpu_dnnl_conv whose plan reads that layout skips
// (it takes the blocked output as it is): no reorder to ONNX's layout and back between them.
mx::array cpu_dnnl_conv(const std::shared_ptr<const DnnlConvPlan>& plan, const DnnlConvShape& g, const mx::array& x,
                        const mx::array& w_prepared, const std::optional<mx::array>& bias, mx::Stream s,
                        bool blocked_out = false);
// y = conv(x, w) + bias + residual, then the plan's other post-ops, in one pass: a plan whose
// post-ops start with Sum, the residual added in the kernel's registers while the output block
// is written (a ResNet's shortcut, ORT's Conv + Add (+ Relu) fusion). The output is the blocked
// one cpu_dnnl_conv's `blocked_out` gives (or plain where the layouts agree), over the
// residual's buffer when nothing else holds it. std::nullopt when the residual does not lie in
// the plan's destination layout (not a convolution's blocked output of that layout, nor plain
// where the layout is plain).
uint64_t cpu_dnnl_conv_add_runs();  // runs in this process (and how many took the residual's buffer)
uint64_t cpu_dnnl_conv_add_in_place();
// `weights` gives the prepared weight (cpu_dnnl_conv_weights), asked for only when the residual
// fits. `over_residual`: nothing reads the residual after this convolution, whatever still holds
// it (graph/fuse_conv_activation.h, kConvResidualFree), so the output takes its buffer.
std::optional<mx::array> cpu_dnnl_conv_add(const std::shared_ptr<const DnnlConvPlan>& plan, const DnnlConvShape& g,
                                           const mx::array& x, const std::function<mx::array()>& weights,
                                           const std::optional<mx::array>& bias, const mx::array& residual,
                                           bool over_residual, mx::Stream s);
// An elementwise f of convolutions' outputs that keeps them blocked: when every x is the
// unblocking of a convolution's blocked output, all in one layout and shape, f of the blocked
// buffers under a new unblocking (so a following convolution takes the result blocked too);
// std::nullopt otherwise. Only for f that maps zeros to zero (Add, Relu): oneDNN's blocked
// layouts pad the channels, and the padding must stay zero.
std::optional<mx::array> cpu_dnnl_blocked_map(const std::vector<mx::array>& xs,
                                              const std::function<mx::array(const std::vector<mx::array>&)>& f,
                                              mx::Stream s);
// A concatenation along the channels of convolutions' blocked outputs (4-D, one channel-blocked
// layout, channels a multiple of its block) in that layout, under a new unblocking: a following
// convolution reading that layout takes it as it is (no unblocking of each input, no reorder
// of the result). std::nullopt otherwise.
std::optional<mx::array> cpu_dnnl_blocked_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s);
// A concatenation along the channels of one image's convolutions in 16-channel blocks (each x a
// oneDNN convolution's blocked output, nChw16c, channels a multiple of 16, nothing else reading
// it: graph/fuse_conv_activation.h, kConcatOfConvs) as one primitive computing each convolution
// into its run of the concatenation's buffer, under a new unblocking. std::nullopt otherwise.
std::optional<mx::array> cpu_dnnl_convs_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s);
uint64_t cpu_dnnl_convs_concats();  // such concatenations run in this process
// f(x, params...) elementwise with per-channel parameters (each C float32 values shaped
// [C, 1, 1] or [1, C, 1, 1] as ONNX broadcasts them over NCHW, or one value) of a convolution's blocked output or such a
// concatenation (4-D, channels a multiple of the layout's block: no padding, so f need not map
// zeros to zero), computed on the blocked buffer with the parameters laid out like it, under a
// new unblocking: BatchNormalization and the Mul/Add/Relu chains before a convolution (densenet's
// layers) stay blocked. std::nullopt otherwise.
std::optional<mx::array> cpu_dnnl_blocked_channel_map(const mx::array& x, const std::vector<mx::array>& params,
                                                      const std::function<mx::array(const std::vector<mx::array>&)>& f,
                                                      mx::Stream s);
// One step of an elementwise chain over a convolution's channel-blocked output: times or plus a
// per-channel parameter ([C] values, as ONNX broadcasts [C, 1, 1] over NCHW, or one value),
// plus another such output of the same layout (a residual), or Relu.
struct CpuBlockedStep {
  enum class Kind { MulChannel, AddChannel, AddBuffer, Relu };
  Kind kind;
  std::optional<mx::array> operand;  // none for Relu
};
// The steps in order on x's blocked buffer, one kernel (kernels/cpu/blocked_steps.cc) split
// over the threads with `split`, under a new unblocking; a chain of such calls is one kernel
// (a BatchNormalization's steps and the Relu after it). std::nullopt where the blocked map
// above would not apply, or an operand is not such a parameter or buffer.
std::optional<mx::array> cpu_dnnl_blocked_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps,
                                                bool split, mx::Stream s);
// The kernel itself over a blocked `buffer` of `channels` in blocks of `block` lanes, `positions`
// a block (operands already laid out: [C] parameters, buffers of buffer's size).
mx::array cpu_blocked_steps(const mx::array& buffer, const std::vector<CpuBlockedStep>& steps, int channels, int block,
                            int64_t positions, bool split, mx::Stream s);
uint64_t cpu_blocked_steps_runs();  // the kernel's runs in this process
// The same kernel over a 4-D float32 NCHW x (each channel's plane a row, its parameters
// broadcast; another operand of x's shape for AddBuffer), x's shape out; a chain of such calls
// is one kernel. std::nullopt for other shapes or operands.
std::optional<mx::array> cpu_channel_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, bool split,
                                           mx::Stream s);
// Whether x is such a kernel's output, not evaluated yet (a chain to continue).
bool cpu_is_channel_steps(const mx::array& x);
// A per-channel parameter of NCHW (C values as [C, 1, 1] or [1, C, 1, 1], or one value) as [C].
std::optional<mx::array> cpu_channel_vector(const mx::array& p, int channels, mx::Stream s);
bool cpu_dnnl_available();
// Convolutions run through oneDNN in this process, and runs that failed inside oneDNN (their
// outputs are NaN).
uint64_t cpu_dnnl_conv_runs();
uint64_t cpu_dnnl_conv_failures();
// Convolutions run on the calling thread alone (DnnlConvShape::threads below OpenMP's count).
uint64_t cpu_dnnl_conv_one_thread_runs();
// Geometries left to MLX because oneDNN offered only a GEMM-based implementation for them (its
// JIT GEMM kernels are not safe against signals: dnnl_conv.cc).
uint64_t cpu_dnnl_conv_gemm_refusals();
// Runs of a oneDNN Winograd convolution (DnnlConvShape::winograd) in this process.
uint64_t cpu_dnnl_conv_winograd_runs();
// The CPU kernels' parallel loops run on OpenMP's threads in this process (openmp_parallel_for).
uint64_t cpu_openmp_regions();
// Pins each OpenMP worker of the CPU stream's team (the threads the kernels above and oneDNN
// share) to one CPU of the process's set, from the second on; the stream thread to the CPUs the
// team leaves (the first, and any beyond the team), so it never shares a worker's CPU. Once
// a process; nothing when the user places OpenMP's threads (OMP_PROC_BIND, OMP_PLACES,
// GOMP_CPU_AFFINITY) or the process has one CPU. Why: a worker woken while the caller ran on
// the other core was queued behind the stream thread, and the scheduler left the pair sharing one
// core, each "cache hot", for milliseconds while the other core idled (docs/performance.md).
void cpu_pin_openmp_workers(mx::Stream s);
int cpu_pinned_openmp_workers();  // workers pinned in this process
bool cpu_pinned_stream_thread();  // the pinned team's master kept off its workers' CPUs

// x @ w for a float32 x [..., M, K] (its rows taken flat: M_total = x.size() / K) and a 2-D
// float32 w [K, N], as one MLX primitive that calls oneDNN's sgemm (kernels/cpu/dnnl_matmul.cc)
// on MLX's CPU stream; the result has x's shape with the last dim N. A w with batch dims
// ([..., K, N], numpy broadcasting against x's) is one sgemm per batch element of M >= 2 rows.
// Why: for the products of several rows of an encoder or a prompt, oneDNN's sgemm ran faster
// than the OpenBLAS sgemm that MLX's CPU Matmul calls (docs/performance.md), and with every
// product of a model on oneDNN, OpenBLAS's idle workers no longer spin beside it. Off by default
// (option cpu_dnnl_matmul): oneDNN's JIT GEMM kernels point the stack register into heap memory
// while they run, so a signal delivered to that thread meanwhile corrupts the heap (oneDNN
// issue 4845, in the versions distributions ship). Transposed views
// (an [N, K] weight, Gemm's transA) go to sgemm as transposed, other views are gathered on the
// stream thread. std::nullopt when `s` is not a CPU stream, oneDNN is not loaded, or the operands
// do not fit (other dtypes, fewer than 2 rows, an empty dim); the caller uses mx::matmul.
std::optional<mx::array> cpu_dnnl_matmul(const mx::array& x, const mx::array& w, mx::Stream s);
// Products run through oneDNN's sgemm in this process, and calls it refused (each then computed
// by the BLAS MLX links, or, without one, NaN).
uint64_t cpu_dnnl_matmul_runs();
uint64_t cpu_dnnl_matmul_failures();

// A function of the BLAS MLX links (libmlx's scope first, then the process's), by name: e.g.
// "cblas_sgemv". Null when there is none.
void* cpu_blas_symbol(const char* name);

// Whether this CPU runs the kernels' AVX2+FMA paths (false off x86-64); detected once.
bool cpu_has_avx2_fma();

// 2-D max or average pooling of a float32 NCHW x on MLX's CPU stream, planes split over threads
// (kernels/cpu/pool.cc). Output [N, C, out_h, out_w]; output position o of an axis reads input
// positions o * stride - pad + j * dil, j < kernel; positions outside the input take no part in a
// max (an all-outside window gives -inf) and add 0 to a sum. Average: the sum divided by
// count_h[oh] * count_w[ow] (the caller's divisor per axis). NaN propagates through a max.
// std::nullopt off the CPU, for other dtypes or ranks.
struct CpuPool2d {
  bool max = true;
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  int pad_top = 0, pad_left = 0;
  int out_h = 0, out_w = 0;
  std::vector<float> count_h, count_w;  // average only: out_h and out_w entries
  bool operator==(const CpuPool2d&) const = default;
};
std::optional<mx::array> cpu_pool_2d(const mx::array& x, const CpuPool2d& g, mx::Stream s);
// The same pooling (max or average) of a convolution's blocked output (or a concatenation or
// per-channel map of such; 4-D, channels a multiple of the layout's block) on its blocked buffer,
// into the same layout under a new unblocking: a following convolution takes it as it is
// (inception's pool branches, squeezenet's pools between fire modules). std::nullopt otherwise.
std::optional<mx::array> cpu_dnnl_blocked_pool(const mx::array& x, const CpuPool2d& g, mx::Stream s);
// The per-channel mean over the positions of a convolution's blocked output (GlobalAveragePool:
// an SE block's squeeze), read from its blocked buffer, as [N, C, 1, 1]: the output then needs no
// unblocking when its other readers take the blocked buffer too (the SE block's rescaling, a
// per-channel map). std::nullopt otherwise.
std::optional<mx::array> cpu_dnnl_blocked_global_mean(const mx::array& x, mx::Stream s);

// The machine's hardware threads (at least 1).
int cpu_threads();
// Runs fn(begin, end) over [0, n) cut into `parts` contiguous ranges (clamped to [1, n]): the
// first on the calling thread (a stream thread takes a share itself), the rest on a pool of one
// fewer worker than the cores (created on first use, shared by all programs); returns when all
// are done. One part runs fn at once: a small kernel's call then makes no std::function (a heap
// allocation for a lambda of a few captures, each run of each kernel).
void cpu_parallel_split(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn);
template <class F>
void cpu_parallel_for(int64_t n, int parts, F&& fn) {
  if (parts <= 1 || n <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  cpu_parallel_split(n, parts, std::function<void(int64_t, int64_t)>(std::forward<F>(fn)));
}
// dst[0, bytes) = src[0, bytes) in pieces of `piece` bytes over `parts` threads (one core's copy
// reaches a fraction of the memory's bandwidth).
inline void cpu_copy_parallel(void* dst, const void* src, size_t bytes, size_t piece, int parts) {
  const auto pieces = static_cast<int64_t>((bytes + piece - 1) / piece);
  cpu_parallel_for(pieces, parts, [&](int64_t p0, int64_t p1) {
    const size_t b = static_cast<size_t>(p0) * piece, e = std::min(bytes, static_cast<size_t>(p1) * piece);
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  });
}


// An input of a CPU kernel, read in row-major order. Made in a primitive's eval_cpu: a
// row-contiguous input is read in place; any other view (broadcast, transposed, sliced) is
// gathered into scratch memory by the dispatched task itself, so the graph needs no Contiguous
// primitive in front of the kernel (each primitive costs a task hand-off, which on small tensors
// is most of the work; and in a compiled trace even a constant is a placeholder whose layout is
// unknown). `rows()` inside the task returns the row-major data.
class RowMajorInput {
 public:
  explicit RowMajorInput(const mx::array& x);
  template <class T = float>
  const T* rows() const {  // call from the dispatched task only
    return static_cast<const T*>(bytes());
  }
  const void* bytes() const;

 private:
  const char* src_;
  size_t item_;
  std::shared_ptr<std::vector<char>> scratch_;  // null when x is row-contiguous
  mx::Shape shape_;
  mx::Strides strides_;
};
// The elements of an available array `x` (any view) into `dst` in row-major order.
void copy_row_major(const mx::array& x, void* dst);
// The same, in place when `x` is row-contiguous, else gathered into `scratch`.
template <class T>
const T* row_major(const mx::array& x, std::vector<T>& scratch) {
  if (x.flags().row_contiguous) return x.data<T>();
  scratch.resize(x.size());
  copy_row_major(x, scratch.data());
  return scratch.data();
}
// The element type a std::vector holds for T (no std::vector<bool>).
template <class T>
using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

}  // namespace ortmlx::ops
