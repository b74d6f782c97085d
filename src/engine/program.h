// A fused group as a function of mx::arrays: translated once per input signature, run through
// mx::compile (one compiled function per signature, LRU-bounded), eager only as the fallback.
// Control-flow bodies (If/Loop/Scan) are translated by the same loop, into the same MLX graph:
// a translator runs a body through EngineHooks::run_subgraph, and the branches it takes and
// the iterations it makes are host reads, recorded and keyed like any other.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <mlx/mlx.h>

#include "engine/caller_eval.h"
#include "engine/engine.h"
#include "kernels/cpu/buffers.h"
#include "engine/plan.h"
#include "engine/shape_family.h"
#include "engine/signature_cache.h"
#include "graph/view.h"
#include "ops/registry.h"
#include "trace/trace.h"

namespace ortmlx::engine {

namespace mx = mlx::core;

// The bytes of a tensor's data (its dtype's size times its elements).
size_t nbytes_of(const HostTensor& t);

// Engine-private: src/ep sees a Program only as an engine::FusedProgram (engine.h).
class Program final : public FusedProgram {
 public:
  // `g` holds the group's nodes (topological order) and its constant initializers; their data
  // is copied into MLX arrays here, because ORT may free initializers after Compile.
  Program(std::string name, const graph::Graph& g, std::vector<std::string> input_names,
          std::vector<std::string> output_names, Options opt);
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // One evaluation. Returns evaluated, row-contiguous arrays in the declared output dtypes.
  std::vector<mx::array> run(const std::vector<HostTensor>& inputs) override;

  const std::string& name() const override { return name_; }
  size_t num_inputs() const override { return input_names_.size(); }
  size_t num_outputs() const override { return output_names_.size(); }
  const Stats& stats() const { return stats_; }
  Stats& stats() override { return stats_; }
  // Whether the calling thread's last run() went through a compiled function.
  static bool last_run_compiled();
  mx::Device device() const override { return opt_.gpu ? mx::Device::gpu : mx::Device::cpu; }
  bool device_memory() const override { return opt_.device_memory; }
  int device_copies() const override { return opt_.device_copies; }

  // Builds an MLX array that owns a copy of `t`.
  static mx::array to_array(const HostTensor& t);
  // A constant stored transposed (graph/transpose_weights.h) as an array of its own shape.
  mx::array transposed_view(const graph::ConstTensor& c) const;
  // Copies an evaluated array into `dst` (nbytes = size * itemsize).
  static void copy_out(const mx::array& a, void* dst, int device_copies = 2);
  // The same for an output of ONNX type `t`: float8/float4/int4/uint4 storage is written in
  // ORT's layout (4-bit values packed two per byte).
  static void copy_out(const mx::array& a, void* dst, graph::DType t, int device_copies = 2);

 private:
  using Taint = std::vector<int>;  // fused inputs whose data flow into a value (sorted, unique)
  // (StepIO, Plan, Slots and Layout: engine/plan.h.)
  // Host values translators read, in the order they read them, so a compiled replay (which
  // takes the same branches and iteration counts, being keyed by them) sees the same numbers.
  using HostRecord = std::vector<mx::array>;
  enum class Mode { Probe, Eager, Replay };
  struct Run;
  struct KeptGraph;  // gpu_graph_replay: a signature's run kept as one CUDA graph (program.cc)
  struct Entry {
    bool eager_only = false;
    // MLX's CUDA kernels fault on zero-size arrays (SIGFPE/SIGSEGV in launch arithmetic): a
    // signature whose graph holds one runs eagerly on the CPU stream instead (unified memory).
    bool on_cpu = false;
    // Whether `record` and `eager_only` come from a probe (first runs of a new signature in a
    // program already probed run eagerly; the probe waits until the signature is compiled).
    bool probed = false;
    int hits = 0;
    HostRecord record;
    // The probe's count of the kernels' work (ops::WorkScope): under
    // cpu_program_parallel_min_flops the compiled trace splits none of them.
    double work_flops = 0;
    std::function<std::vector<mx::array>(const std::vector<mx::array>&)> fn;
    bool unfused = false;  // `fn` was traced without fusion
    // cpu_fuse=2 on the CPU device: `fn` is traced without fusion, and `fn_fused` is the same
    // function with MLX's fusion, tried once the unfused one has run kFusionTrialAfter times
    // (its first call traces it, untimed, then kFusionTrialRuns timed calls); it replaces `fn`
    // only when clearly faster than the unfused runs' best.
    std::function<std::vector<mx::array>(const std::vector<mx::array>&)> fn_fused;
    int unfused_runs = 0, trial_calls = 0;
    double best_fused_ns = 0, best_unfused_ns = 0;
    // gpu_graph_replay: compiled calls so far, the kept graph, and captures tried or dropped
    // (a few, then this signature stays with the compiled call).
    int compiled_calls = 0;
    std::shared_ptr<KeptGraph> kept;
    int kept_tries = 0;
    // cpu_caller_replay: the kept walk of a compiled call, and the arguments its graph reads.
    std::shared_ptr<KeptWalk> walk;
    std::vector<mx::array> walk_args;
  };

  // gpu_graph_replay: whether this run's inputs allow keeping its graph; the arguments of the
  // capturing run (inputs the graph will copy in each run replaced by buffers of its own) and
  // the graph's input plan in `k`.
  bool keepable(const std::vector<HostTensor>& raw) const;
  // Whether this process can keep graphs on `s` (kernels/cuda/graph_replay.h); says why not
  // once, at log_level 1, and is not asked again.
  bool graph_replay_here(mx::Stream s);
  // Inputs whose rows the run writes into their own buffer (RowUpdate) are read and written
  // where they lie, as are large inputs in EP memory. Empty when a buffer could not be made.
  std::vector<mx::array> capture_arguments(Entry& e, const std::vector<HostTensor>& raw,
                                           const std::vector<mx::array>& args, bool unfused, KeptGraph& k) const;
  // A launch of the kept graph, or nullopt (nothing run) when the bound buffers moved or the
  // driver refused: the caller runs the compiled call.
  std::optional<std::vector<mx::array>> run_kept(Entry& e, const std::vector<HostTensor>& raw, mx::Stream s);
  // An index was out of range: the same run again, eagerly, checking on the host, names it.
  [[noreturn]] void diagnose_index(const std::vector<mx::array>& args, const Layout& layout, mx::Stream s) const;

  // Whether signature `e`'s kernels all run on one thread (its probe's work under
  // cpu_program_parallel_min_flops, on the CPU).
  bool one_thread_program(const Entry& e, mx::Stream s) const {
    return s.device == mx::Device::cpu && e.work_flops < static_cast<double>(opt_.cpu_program_parallel_min_flops);
  }
  // cpu_fuse=2: whether this run of `e` is one of the fused trace's trial calls.
  static bool fusion_trial(const Entry& e);
  // Drops a kept walk's fused trace untried where MLX's fused kernels have too little to take over.
  void skip_fusion_trial(Entry& e);
  // cpu_fuse=2: one timed run of `e` (unfused: its steady state; fused: a trial call); after the
  // trial, keeps the fused trace only when clearly faster.
  void tune_fusion(Entry& e, bool unfused, uint64_t ns);
  // cpu_in_place_io: binds the outputs the EP's CPU kernels compute to ORT's output tensors
  // (`kept`: a kept walk's outputs, computed again by its replay); returns which, and where.
  // After the evaluation, count_in_place counts those that are there (the stats), and files a
  // present written over its own past buffer as rows written in place (RowUpdate::written).
  // cpu_in_place_io: smaller tensors are copied (a copy costs less than the bookkeeping).
  static constexpr size_t kInPlaceMinBytes = size_t{16} << 10;
  struct BoundOutput {
    size_t output;
    const void* dst;
    bool over_input;  // dst is an input's buffer (a shared past/present KV buffer)
  };
  std::vector<BoundOutput> bind_outputs(const std::vector<mx::array>& outs, ops::OutputBinding& bound,
                                        const std::vector<HostTensor>& raw, bool kept = false);
  void count_in_place(const std::vector<mx::array>& outs, const std::vector<BoundOutput>& bound);

  std::unique_ptr<Plan> make_plan(const graph::Graph& g, const std::vector<std::string>& inputs,
                                  const std::vector<std::string>& outputs, bool top);
  static Layout layout_of(const std::vector<HostTensor>& raw);
  // On the CPU device the fused inputs are borrowed, not copied: views over ORT's buffers
  // (host_views.h), held by `views` and valid for this run only (see input_array).
  std::vector<mx::array> arguments(const std::vector<HostTensor>& raw, ops::HostViews* views = nullptr) const;
  mx::array input_array(const HostTensor& t, ops::HostViews* views) const;
  // What a translation saw of each step of the group (collected while looking for a shape
  // family: engine/shape_family.h).
  using StepInfos = ShapeFamily::StepInfos;
  std::vector<mx::array> translate(const std::vector<mx::array>& args, const Layout& layout,
                                   Mode mode,
                                   HostRecord* record, std::vector<int>* host_deps,
                                   mx::Stream s, StepInfos* info = nullptr) const;
  // The fused inputs as values (sequences and optionals back from their arguments), then the
  // constants; each with its taint (a fused input taints itself).
  void input_values(const std::vector<mx::array>& args, const Layout& layout,
                    std::vector<ops::Value>& values, std::vector<Taint>& taints) const;
  // The group's results as ORT takes them: declared dtypes, row-contiguous.
  std::vector<mx::array> finish_outputs(std::vector<ops::Value> outs, mx::Stream s) const;
  // Values, not arrays: inside a group (and its bodies) a value may be a sequence or an empty
  // optional (ops::Value); the group's own inputs and outputs are tensors.
  std::vector<ops::Value> run_plan(const Plan& p, std::vector<ops::Value> inputs,
                                   std::vector<Taint> input_taints, Run& run) const;
  // Translates steps [begin, end) of `p` over `slots`, or with `order` the steps at those
  // positions of it (run_plan's loop; piecewise runs call it for the stretches between
  // compiled segments, in the family's order).
  void run_steps(const Plan& p, Slots& slots, std::vector<Taint>& taint, Run& run, size_t begin,
                 size_t end, const std::vector<size_t>* order = nullptr) const;
  std::optional<std::vector<mx::array>> fold_on_host(const Plan& p, const graph::Node& node,
                                                     const StepIO& io,
                                                     const std::vector<std::optional<ops::Value>>& inputs,
                                                     const Run& run) const;

  // Shape families (engine/shape_family.h): their runs, compiled segments and eager steps.
  using Segment = ShapeFamily::Segment;
  using Piecewise = ShapeFamily::Piecewise;
  using SegmentFn = ShapeFamily::SegmentFn;
  // The segment's steps as one mx::compile'd function of its inputs, traced on stream `s`.
  SegmentFn segment_function(const Segment& seg, const std::vector<size_t>& order, mx::Stream s);
  // `walks`: segments with a kept walk are computed from it (`walked` says whether one was).
  std::vector<mx::array> run_piecewise(Piecewise& pw, const std::vector<mx::array>& args,
                                       const Layout& layout, mx::Stream s, bool walks, bool& walked);
  // cpu_caller_replay: evaluates a segment's compiled call (`outs`, of `in`) apart from the rest
  // of the run and keeps its walk for the segment's later runs.
  // `outs` become arrays of their own over the kept outputs.
  void keep_segment_walk(Segment& seg, const std::vector<mx::array>& in, std::vector<mx::array>& outs,
                         mx::Stream s);
  // The cache key of a run: its inputs' dtypes and shapes (`shapes`, the key alone), and the
  // data of the inputs keyed for those shapes.
  std::string signature_of(const std::vector<HostTensor>& raw, std::string* shapes = nullptr) const;
  std::string signature_with(const std::vector<HostTensor>& raw, const std::vector<bool>* keyed) const;

  std::string name_;
  std::string where_;  // "fused node '<name>'", for messages built on every run
  graph::Graph graph_;  // nodes + value infos (constants' data are not kept here, nor in bodies)
  std::vector<std::string> input_names_, output_names_;
  Options opt_;
  std::unique_ptr<Plan> top_;
  std::unordered_map<const graph::Graph*, std::unique_ptr<Plan>> body_plans_;
  std::vector<graph::DType> output_dtypes_;
  std::vector<mx::array> constants_;  // the group's constants: slots [num_inputs, +constants)
  // Fused inputs whose *values* feed host reads (shape tensors computed outside the group):
  // they become part of the signature, per shape signature (a prompt that reads its attention
  // mask on the host leaves the mask out of a decode step's key). Guarded by mu_.
  std::unordered_map<std::string, std::vector<bool>> keyed_inputs_;
  // Prepare-once results (EngineHooks::constant_memo), by node and key. Guarded by mu_ (runs,
  // traces included, translate under it).
  mutable std::unordered_map<std::string, mx::array> prepared_;
  bool is_constant_slot(const Plan& p, int slot) const;
  void describe_step(trace::Span& span, const graph::Node& node, const StepIO& io,
                     const Slots& slots, Mode mode, bool folded) const;

  std::mutex mu_;
  SignatureCache<Entry> cache_;
  mutable Stats stats_;  // translate() (const) counts its own time
  // Options::cpu_poll: the last polled evaluation's time, and a count of the evaluations
  std::atomic<uint64_t> last_polled_eval_ns_{0}, evals_{0};
  bool compile_broken_ = false;  // mx::compile failed once: eager for the rest (logged once)
  bool probed_once_ = false;     // a probe has run: the program's host reads are known
  bool replay_unavailable_ = false;  // gpu_graph_replay: this process cannot keep graphs (said once)
  ShapeFamily family_;
};

}  // namespace ortmlx::engine
