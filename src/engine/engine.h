// The engine's public face: what the ABI layer (src/ep) may see of it. A fused group becomes a
// FusedProgram (make_program); its private machinery (plans, the signature cache, the shape
// family, host folds) stays in program.h and the files beside it, which src/ep never includes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "graph/view.h"

namespace ortmlx::engine {

namespace mx = mlx::core;

struct Options {
  bool compile = true;          // use mx::compile when the graph allows it
  size_t cache_capacity = 32;   // compiled signatures kept per fused node (LRU)
  int compile_after = 2;        // a signature is compiled on its Nth run (1 = at once)
  bool shape_family = true;     // new signatures of a family run compiled segments (Piecewise)
  bool host_fold = true;        // shape arithmetic computed on the host (engine/host_fold)
  bool index_check = true;      // out-of-range indices fail the run (engine/index_check.h)
  bool gpu_kernels = true;      // the EP's own CUDA kernels where an op has one (kernels/cuda)
  bool inplace_rows = true;     // outputs that are an EP-memory input with rows updated: see RowUpdate
  bool step_row_writes = true;  // with inplace_rows on a CUDA GPU: rows written by the run's own evaluation
  bool fuse_matmuls = true;     // products of one input by constant weights as one (graph/fuse_matmuls.h)
  bool gpu = false;             // run on MLX's GPU device
  bool device_memory = false;   // inputs may be the EP's own allocations (device_buffers.h)
  int log_level = 0;            // 0 quiet, 1 info, 2 verbose (stderr)
  // Each ONNX node evaluated on its own and timed (trace "op" spans): no compile, no fusion
  // across nodes, so slower; a tool for finding slow nodes.
  bool profile_ops = false;
  // MLX's CUDA backend: outputs reach ORT's buffers by one copy of the CUDA driver each
  // (kernels/cuda/device_copy.h) instead of MLX's host read: 2 from device and unified memory,
  // 1 from device memory only, 0 = MLX's host read.
  int device_copies = 2;
  // MLX's CUDA backend: an input of at most this many bytes is copied into pinned host memory
  // the GPU reads in place (kernels/cuda/pinned_inputs.h) instead of MLX's managed memory,
  // whose pages the GPU would fault over; 0 = always MLX's managed memory.
  size_t pinned_inputs = 1 << 20;
  // MatMulNBits accuracy_level 4 int8 activations (EngineHooks): -1 on the CPU device only.
  int int8_emulation = -1;
  // Choices between two exact translations, kept for comparisons (docs/options.md; off = the
  // plainer form). step_order: engine/shape_family.cc; the others: ops/switches.h.
  bool step_order = true;    // a shape family's runs take fixed steps as early as they can
  bool fused_rotary = true;  // rotary halves rotated by one compiled kernel
  bool zero_bias = true;     // attention leaves out a bias known to be all zeros
  bool grouped_kv = true;    // MultiHeadAttention reads the grouped cache under a repeated K/V
  bool cpu_gemv = true;      // the EP's CPU kernels (kernels/cpu)
  bool fused_skip_norm = true;  // SkipSimplifiedLayerNormalization as one CUDA kernel (with gpu_kernels)
  bool fused_gqa_step = true;   // a shared-buffer decode step's GroupQueryAttention as one CUDA kernel
                                // from its projections, rotary included (with gpu_kernels)
  bool flat_products = true;    // products by a matrix read their rows flat, without reshape views
  bool transposed_weights = true;  // on the GPU, MatMul weights kept [N, K] (graph/transpose_weights.h)
  bool cpu_dnnl = true;            // on the CPU, float32 convolutions through oneDNN when it loads
  bool fuse_conv_activation = true;  // ... with the activation after a Conv as its post-ops (graph/fuse_conv_activation.h)
  int64_t cpu_dnnl_min_flops = 0;  // ... for convolutions (and products) of at least this many FLOPs
  // ... and on the stream thread alone (one OpenMP thread) below this many
  int64_t cpu_dnnl_parallel_min_flops = 50000;
  // ... and a compiled signature's kernels split only when their whole work is at least this
  // many FLOPs (ops::WorkScope)
  int64_t cpu_program_parallel_min_flops = 4000000;
  // MLX's CPU device: compiled functions fuse elementwise chains into generated kernels (1, MLX's
  // way), keep them as MLX's own vectorized ops (0: compile mode no_fuse while tracing), or
  // (2) time both on a signature's first compiled runs and keep the faster.
  int cpu_fuse = 2;
  bool cpu_packed_matmul = true;   // on the CPU, float32 products of several rows by a constant matrix as the EP's kernel
  bool cpu_packed_blocks = true;   // ... its threads take panels, rows in blocks of 128, the next panel asked into L2
  int64_t cpu_packed_rows = 64;    // ... or rows, where each thread gets this many or more (0: never)
  int64_t cpu_packed_stream = 6144;  // ... or (one row tile) columns in 16s, lines this far ahead asked for (0: off)
  int64_t cpu_packed_ahead = 6144;   // ... (several row tiles) each tile asks for its panel's lines this far ahead (0: off)
  int64_t cpu_packed_depth = 0;      // ... K in blocks this deep (0: from the L2's size)
  bool cpu_packed_prepared = true;   // ... a MatMul's or Gemm's constant weight laid out once for the program
  bool cpu_skip_norm = true;       // on the CPU, a normalization and the Add before it as one kernel (graph/fuse_skip_norm)
  bool cpu_gqa_prompt = true;      // on the CPU, a prompt's GroupQueryAttention q, k, v laid out per head and rotated as one kernel
  bool cpu_dnnl_matmul = false;    // on the CPU, float32 products of several rows through oneDNN's sgemm (not signal-safe)
  bool cpu_dnnl_blocked = true;    // ... convolutions hand the next one their output in oneDNN's blocked layout
  bool cpu_dnnl_add = true;        // ... a residual Add after a convolution as its Sum post-op
  bool cpu_dnnl_blocked16 = true;  // ... (AVX-512) channels in blocks of 16 (nChw16c) where they are multiples of 16
  bool cpu_dnnl_winograd = true;   // ... and 3 x 3 stride-1 ones by oneDNN's Winograd kernels
  bool cpu_dnnl_concat_convs = true;  // ... and a concatenation of such convolutions computed into its buffer
  bool cpu_depthwise = true;       // on the CPU, 2-D float32 depthwise convolutions as the EP's kernel over NCHW
  bool cpu_patch_deconv = true;    // on the CPU, 2-D float32 ConvTranspose with kernel = stride as the EP's kernel
  int int4_dense_rows = 128;       // on the GPU, MatMulNBits of this many rows as dequantize + matmul
  bool int4_dequantize_kernel = true;  // ... dequantized by the EP's CUDA kernel (0: MLX's dequantize)
  // on the GPU, a decode step's attention over a shared KV buffer in blocks of this many rows a
  // head, combined after (0: one block a head)
  int gpu_attention_split_rows = 128;
  bool cpu_avx512 = true;          // on the CPU, the EP's kernels take their AVX-512 forms where the CPU has them
  // MLX's CPU device: after a short evaluation, the next one polls its results for a while
  // before sleeping until MLX's stream thread signals them (engine/program.cc: evaluate).
  bool cpu_poll = true;
  // cpu_poll's window: an evaluation shorter than this makes the next one poll, for this long.
  int64_t cpu_poll_us = 200;
  // ... and such an evaluation keeps MLX's stream thread awake while its tasks are queued and
  // for cpu_poll_us after them (engine/stream_hold.h).
  bool cpu_hold = true;
  // MLX's CPU device: the caller computes what it can of a run's graph itself (views, the EP's
  // CPU kernels, MLX's float32 elementwise primitives) instead of queueing every primitive on
  // MLX's stream thread (engine/caller_eval.h).
  bool cpu_caller_eval = true;
  // ... and a compiled signature's walk that computed its whole graph is kept and computed again
  // over later runs' arguments (engine/caller_eval.h, KeptWalk).
  bool cpu_caller_replay = true;
  bool cpu_walk_large = true;      // ... convolutional graphs of large arrays walked (and kept) too, on the stream thread
  // MLX's CPU device: the stream thread's OpenMP workers each pinned to a CPU (kernels.h:
  // cpu_pin_openmp_workers); once a process, by the first session that evaluates on the CPU.
  bool cpu_pin_workers = true;
  // MLX's CPU device with AVX-512: an encoder's attention nodes as one node and one kernel
  // (graph/fuse_attention.h, kernels/cpu/attention.cc).
  bool cpu_attention = true;
  // MLX's CPU device: GELU written out as nodes as one Gelu node (graph/fuse_gelu.h).
  bool cpu_gelu = true;
  bool cpu_product_gelu = true;  // on the CPU, a Gelu after a product by a constant applied by the product's kernel
  bool cpu_swiglu = true;  // on the CPU, Sigmoid(g) -> Mul(g) -> Mul(up) as one kernel (graph/fuse_swiglu.h)
  // MLX's CPU device with AVX-512 VNNI: MatMulNBits prompt rows with int8 blocks as integer
  // products (kernels/cpu/int4_gemv.cc, cpu_int4_gemm).
  bool cpu_int4_gemm = true;
  // MLX's CPU device: ORT's input tensors read where they are, and outputs the EP's kernels
  // compute written into ORT's output tensors, without a copy (kernels/cpu/buffers.h).
  bool cpu_in_place_io = true;
  // MLX's CUDA backend: a compiled signature's run, once warm, is kept as one CUDA graph and
  // launched again with its inputs copied into the buffers it reads, without MLX's per-array
  // host work (kernels/cuda/graph_replay.h).
  bool gpu_graph_replay = true;
};

struct Stats {
  std::atomic<uint64_t> runs{0}, compiled_runs{0}, eager_runs{0}, traces{0}, compile_fallbacks{0};
  // Time accounting for the overhead figure (bench): the whole ORT Compute call (filled by the
  // ABI layer), and the part of it spent inside mx::eval, where MLX does the arithmetic.
  std::atomic<uint64_t> compute_ns{0}, eval_ns{0};
  // The same for compiled runs only (the steady state, without probes and traces).
  std::atomic<uint64_t> compute_ns_compiled{0}, eval_ns_compiled{0};
  // ... and of those, handing the outputs to ORT (copies to host or EP memory), reading ORT's
  // inputs, and calling the compiled function (MLX replays its trace into new arrays).
  std::atomic<uint64_t> outputs_ns_compiled{0}, inputs_ns_compiled{0}, call_ns_compiled{0};
  // Where the rest goes: translating the graph (probes, eager runs, compile traces; host reads
  // included) and the host reads themselves (count and time: each is a device sync).
  std::atomic<uint64_t> translate_ns{0}, host_reads{0}, host_read_ns{0};
  std::atomic<uint64_t> host_folds{0};  // nodes computed on the host (engine/host_fold)
  std::atomic<uint64_t> eval_arrays{0};  // arrays computed by the runs' final evaluations
  // cpu_in_place_io: inputs read where ORT holds them, outputs written into ORT's tensors
  std::atomic<uint64_t> inputs_in_place{0}, outputs_in_place{0};
  std::atomic<uint64_t> walk_replays{0};  // runs that computed a kept walk again (cpu_caller_replay)
  // Piecewise runs (a shape family: see Program::Piecewise): runs, segment calls that went
  // through a compiled function, and segment traces.
  std::atomic<uint64_t> piecewise_runs{0}, segment_calls{0}, segment_traces{0};
  // ... segments computed from a kept walk instead (cpu_caller_replay), and piecewise runs done
  // again without them (a kept segment that could not be walked; none are kept after one).
  std::atomic<uint64_t> segment_walks{0}, segment_walk_misses{0};
  // Eager runs whose graph touched a zero-size array. On the GPU these ran on the CPU stream
  // (MLX's CUDA kernels fault on such arrays); on the CPU device only a new signature's first
  // run is checked, so a test there can see what the GPU would do.
  std::atomic<uint64_t> empty_operand_runs{0};
  // cpu_fuse=2: compiled signatures that kept MLX's fused kernels, and those that kept its
  // unfused ops, after timing both.
  std::atomic<uint64_t> fusion_kept_fused{0}, fusion_kept_unfused{0};
  // ... and those that kept the unfused ops untimed: their kept walk had too little of MLX's own
  // elementwise work for a fused kernel to save what its trial costs (program.cc).
  std::atomic<uint64_t> fusion_trials_skipped{0};
  // cpu_poll: evaluations whose results the caller polled for before sleeping.
  std::atomic<uint64_t> polled_evals{0};
  std::atomic<uint64_t> after_short_evals{0};  // CPU evaluations after one under cpu_poll's window
  // gpu_graph_replay: runs kept as a CUDA graph, runs that launched one, and kept graphs
  // dropped (a bound buffer moved) or not made (graph_replay.h's reasons; log_level 1 says which).
  std::atomic<uint64_t> replay_captures{0}, replay_runs{0}, replay_drops{0}, replay_failures{0};
};

// Raw bytes of one fused-node input or output (owned by ORT).
struct HostTensor {
  graph::DType dtype = graph::DType::Undefined;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  // An input may also be a sequence of tensors (`items`) or an empty optional (None).
  enum class Kind { Tensor, Sequence, None };
  Kind kind = Kind::Tensor;
  std::vector<HostTensor> items{};
};

// One fused group as a function of its inputs (implemented by Program, program.h).
class FusedProgram {
 public:
  virtual ~FusedProgram() = default;
  // One evaluation. Returns evaluated, row-contiguous arrays in the declared output dtypes, except
  // the outputs take_row_updates() names right after (inputs in EP memory only).
  virtual std::vector<mx::array> run(const std::vector<HostTensor>& inputs) = 0;
  virtual const std::string& name() const = 0;
  virtual size_t num_inputs() const = 0;
  virtual size_t num_outputs() const = 0;
  virtual Stats& stats() = 0;
  virtual bool device_memory() const = 0;
  virtual int device_copies() const = 0;
  virtual mx::Device device() const = 0;
};

// `g` holds the group's nodes (topological order) and its constant initializers; their data
// is copied into MLX arrays here, because ORT may free initializers after Compile.
std::unique_ptr<FusedProgram> make_program(std::string name, const graph::Graph& g,
                                           std::vector<std::string> input_names,
                                           std::vector<std::string> output_names, Options opt);

// Whether the calling thread's last run() went through a compiled function.
bool last_run_compiled();
// Whether it launched a kept CUDA graph (gpu_graph_replay): its outputs are held by the graph,
// to be copied out by the driver, never adopted.
bool last_run_replayed();
// Whether it replayed a kept walk on the CPU: its outputs stay the walk's arrays, computed again
// next run, so they are copied into ORT's buffers (by memcpy: an MLX evaluation reading them
// would detach them from the walk), never adopted.
bool last_run_walked();
// The way the calling thread's last run() went (trace and profile events): "compiled",
// "compiled (new trace)", "shape family", "eager (new signature)", "eager", ...
const char* last_run_path();

// An output the calling thread's last run() left unevaluated because it is one of its inputs in
// EP memory with rows updated (a shared past/present KV buffer: slice_update(past, rows, start)).
// When ORT binds the output to that same buffer, writing `update` at `start` along `axes` there
// (device_buffers::write_rows_in_place) is the output, without the two copies of the whole buffer
// evaluating it and then copying it into place would cost; otherwise the output is evaluated.
struct RowUpdate {
  size_t output = 0;
  const void* input_data = nullptr;
  mx::array update, start;
  std::vector<int> axes;
  // Already written into the bound buffer by the run's own evaluation (on a CUDA GPU, one
  // kernel for all of a run's rows: kernels/cuda/write_rows.h); nothing is left to do.
  bool written = false;
};
std::vector<RowUpdate> take_row_updates();

// The buffer ORT will hand back for output `output` of the run in progress, given its value
// (shape and dtype), or null when not known; the buffer's size in bytes in `*nbytes` (unless
// null). Set by the ABI layer around FusedProgram::run on the calling thread; with it a run can
// write rows, or whole outputs, into ORT's output buffers in its own evaluation.
using OutputBufferQuery = std::function<const void*(size_t output, const mx::array& value, size_t* nbytes)>;
class OutputBufferScope {
 public:
  explicit OutputBufferScope(OutputBufferQuery q);
  ~OutputBufferScope();
  OutputBufferScope(const OutputBufferScope&) = delete;
  OutputBufferScope& operator=(const OutputBufferScope&) = delete;

 private:
  OutputBufferQuery prev_;
};
// Copies an evaluated array into `dst` for an output of ONNX type `t`: float8/float4/int4/uint4
// storage is written in ORT's layout (4-bit values packed two per byte). `device_copies`:
// Options::device_copies.
void copy_out(const mx::array& a, void* dst, graph::DType t, int device_copies = 2);
// The same, byte for byte (nbytes = size * itemsize).
void copy_out(const mx::array& a, void* dst, int device_copies = 2);
// An evaluated array in CUDA device memory (an output of a kept graph's launch, or one bound to
// a buffer in EP memory) into `dst` by one copy of the CUDA driver, which may still be running
// when it returns: finish_copies_on_device waits. False, having done nothing, where it cannot
// (no CUDA backend, a view, not evaluated): the caller copies otherwise.
bool copy_out_on_device(const mx::array& a, void* dst);
bool finish_copies_on_device();
// Whether `dst` already is `a`'s data (an output written in place), asked without moving a
// device buffer to host memory (which array::data would).
bool holds_data_at(const mx::array& a, const void* dst);

}  // namespace ortmlx::engine
