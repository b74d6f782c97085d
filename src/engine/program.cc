#include "engine/program.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include <mlx/primitives.h>

#include "engine/caller_eval.h"
#include "engine/device_buffers.h"
#include "engine/stream_hold.h"
#include "graph/fuse_matmuls.h"
#include "graph/fuse_attention.h"
#include "graph/fuse_conv_activation.h"
#include "graph/fuse_gelu.h"
#include "graph/fuse_skip_norm.h"
#include "graph/fuse_swiglu.h"
#include "graph/fuse_matmul_bias.h"
#include "graph/transpose_weights.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/graph_replay.h"
#include "kernels/cuda/write_rows.h"
#include "ops/switches.h"
#include "engine/index_check.h"
#include "engine/memory_guard.h"
#include "engine/program_run.h"
#include "engine/host_fold/host_fold.h"
#include "ops/lowp.h"
#include "trace/trace.h"

namespace ortmlx::engine {

namespace {

std::shared_mutex g_compile_mode_lock;
thread_local int tl_compiled_call_depth = 0;

}  // namespace

CompiledCallScope::CompiledCallScope(bool unfused) : locked_(tl_compiled_call_depth++ == 0) {
  static const bool compile_disabled = std::getenv("MLX_DISABLE_COMPILE") != nullptr;  // MLX reads it once too
  on_ = unfused && !compile_disabled;
  if (locked_) {
    if (on_)
      g_compile_mode_lock.lock();
    else
      g_compile_mode_lock.lock_shared();
  }
  if (on_) mx::set_compile_mode(mx::CompileMode::no_fuse);
}

CompiledCallScope::~CompiledCallScope() {
  if (on_) mx::set_compile_mode(mx::CompileMode::enabled);
  if (locked_) {
    if (on_)
      g_compile_mode_lock.unlock();
    else
      g_compile_mode_lock.unlock_shared();
  }
  --tl_compiled_call_depth;
}

namespace {
// The calling thread's last run: which path it took and its time inside mx::eval (statistics
// for the ABI layer's overhead figure; per thread because runs of a program may interleave).
thread_local bool tl_last_run_compiled = false;
thread_local bool tl_last_run_replayed = false;
thread_local bool tl_last_run_walked = false;
thread_local uint64_t tl_last_eval_ns = 0;
thread_local const char* tl_last_run_path = "";

// On MLX's CPU device an evaluation runs on the stream's thread while the caller sleeps on a
// condition variable, and waking it again costs more than a small program's whole arithmetic.
// After a short polled evaluation (`poll`), the caller polls the results for a while first.
// The choice rests on the last *polled* evaluation: one that slept takes the wake-up's time too,
// so judging by it, one slow evaluation (another process on the core) would stop polling for
// good. Every kPollProbeEvery-th evaluation polls regardless, to find out again.
// The window (how short an evaluation must be, and how long the next one polls) is the option
// cpu_poll_us.
constexpr uint64_t kPollProbeEvery = 16;
// cpu_caller_replay: a compiled signature's walk is kept from its kWalkAfterCalls-th call, when
// its arrays hold at most kWalkMaxBytes (held between runs).
constexpr int kWalkAfterCalls = 3;
constexpr size_t kWalkMaxBytes = size_t{64} << 20;

void evaluate(std::vector<mx::array>& arrays, bool poll, bool hold, std::chrono::microseconds poll_for,
              mx::Stream s) {
  if (!poll) return mx::eval(arrays);
  {
    std::optional<StreamHold> held;
    if (hold) held.emplace(s, poll_for);
    mx::async_eval(arrays);
  }
  const auto until = std::chrono::steady_clock::now() + poll_for;
  do {
    bool done = true;
    for (const auto& a : arrays) done = done && a.is_available();
    if (done) break;
    std::this_thread::yield();  // a kernel's own worker threads may need this core
  } while (std::chrono::steady_clock::now() < until);
  mx::eval(arrays);  // waits for what is left; rethrows the stream's error, as before
}

}  // namespace

bool Program::last_run_compiled() { return tl_last_run_compiled; }
bool last_run_compiled() { return tl_last_run_compiled; }
bool last_run_replayed() { return tl_last_run_replayed; }
bool last_run_walked() { return tl_last_run_walked; }

bool copy_out_on_device(const mx::array& a, void* dst) {
  if (!a.is_available()) return false;
  void* src = kernels::cuda::device_address(a);
  return src && dst && a.flags().row_contiguous && kernels::cuda::copy_bytes(dst, src, a.nbytes());
}
bool finish_copies_on_device() { return kernels::cuda::finish_copies(); }
const char* last_run_path() { return tl_last_run_path; }

namespace {
thread_local std::vector<RowUpdate> tl_row_updates;
thread_local OutputBufferQuery tl_output_buffer;

// Output `out` as slice_update(input, update, start) of a run input held in EP memory (see
// RowUpdate), seen through the final row-contiguous copy, which is a view for it.
std::optional<RowUpdate> row_update_of(const mx::array& out, size_t i, const std::vector<HostTensor>& raw,
                                       std::optional<mx::array>* buffer) {
  const mx::array* a = &out;
  if (a->has_primitive() && std::string_view(a->primitive().name()) == "Contiguous" && a->inputs().size() == 1)
    a = &a->inputs()[0];
  if (a->is_available() || !a->has_primitive()) return std::nullopt;
  // By name: libmlx exports no RTTI for its primitives.
  if (std::string_view(a->primitive().name()) != "DynamicSliceUpdate" || a->inputs().size() != 3)
    return std::nullopt;
  auto* dsu = static_cast<mx::DynamicSliceUpdate*>(&a->primitive());
  const auto& src = a->inputs()[0];
  if (!src.is_available() || src.shape() != out.shape() || src.dtype() != out.dtype() ||
      a->dtype() != out.dtype())
    return std::nullopt;
  for (const auto& t : raw)
    if (t.kind == HostTensor::Kind::Tensor && t.data && t.data == src.data<void>() &&
        device_buffers::owns(t.data)) {
      *buffer = src;
      return RowUpdate{i, t.data, a->inputs()[1], a->inputs()[2], dsu->state()};
    }
  return std::nullopt;
}
}  // namespace

std::vector<RowUpdate> take_row_updates() { return std::exchange(tl_row_updates, {}); }

OutputBufferScope::OutputBufferScope(OutputBufferQuery q) : prev_(std::exchange(tl_output_buffer, std::move(q))) {}
OutputBufferScope::~OutputBufferScope() { tl_output_buffer = std::move(prev_); }

std::unique_ptr<FusedProgram> make_program(std::string name, const graph::Graph& g,
                                           std::vector<std::string> input_names,
                                           std::vector<std::string> output_names, Options opt) {
  // Timing nodes one by one needs eager runs: a compiled function evaluates as one.
  if (opt.profile_ops) opt.compile = opt.shape_family = false;
  return std::make_unique<Program>(std::move(name), g, std::move(input_names),
                                   std::move(output_names), std::move(opt));
}

void copy_out(const mx::array& a, void* dst, graph::DType t, int device_copies) {
  Program::copy_out(a, dst, t, device_copies);
}
void copy_out(const mx::array& a, void* dst, int device_copies) { Program::copy_out(a, dst, device_copies); }
bool holds_data_at(const mx::array& a, const void* dst) {
  // A device buffer is never ORT's host memory; EP memory outputs are host-visible buffers.
  return a.size() && !kernels::cuda::in_device_memory(a) && dst == a.data<void>();
}

using graph::DType;

namespace {

// Visits every array evaluating `outs` involves, each once: the arrays still to compute, and the
// ones with data they read (where the walk stops). `visit` returning true ends the walk.
template <typename Visit>
void walk_graph(const std::vector<mx::array>& outs, Visit visit) {
  std::vector<mx::array> stack(outs.begin(), outs.end());
  std::unordered_set<std::uintptr_t> seen;
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(a.id()).second) continue;
    if (visit(a)) return;
    if (a.is_available() || !a.has_primitive()) continue;
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
}

// Whether evaluating `outs` would touch a zero-size array (an input, a constant or an
// intermediate).
bool touches_empty(const std::vector<mx::array>& outs) {
  bool found = false;
  walk_graph(outs, [&](const mx::array& a) { return found = a.size() == 0; });
  return found;
}

// log_level 3: which MLX primitives an evaluation runs, by name (each is a kernel, or a view):
// the per-op cost of eager runs on the GPU is what this counts.
void print_primitives(const std::map<std::string, int>& count, const std::string& where) {
  std::ostringstream os;
  os << "[MLX EP] " << where << " evaluates:";
  for (const auto& [name, n] : count) os << " " << name << "=" << n;
  std::cerr << os.str() << "\n";
}

void log_primitives(const std::vector<mx::array>& outs, const std::string& where) {
  std::map<std::string, int> count;
  walk_graph(outs, [&](const mx::array& a) {
    if (!a.is_available() && a.has_primitive()) count[a.primitive().name()]++;
    return false;
  });
  print_primitives(count, where);
}

constexpr int64_t kMaxKeyedElements = 4096;  // larger host-read inputs force eager instead

// Gives the program its own copy of every subgraph (recursively), so their constants can be
// dropped once copied into MLX arrays; `owned` collects the copies.
void own_subgraphs(graph::Graph& g, std::vector<graph::Graph*>& owned) {
  for (auto& n : g.nodes)
    for (auto& [name, a] : n.attrs)
      if (a.type == graph::AttrType::Graph && a.g) {
        auto copy = std::make_shared<graph::Graph>(*a.g);
        own_subgraphs(*copy, owned);
        owned.push_back(copy.get());
        a.g = std::move(copy);
      }
}

}  // namespace

Program::Program(std::string name, const graph::Graph& g, std::vector<std::string> input_names,
                 std::vector<std::string> output_names, Options opt)
    : name_(std::move(name)), where_("fused node '" + name_ + "'"), graph_(g),
      input_names_(std::move(input_names)), output_names_(std::move(output_names)), opt_(opt),
      cache_(opt.cache_capacity), family_(opt.step_order, opt.log_level, where_) {
  // (the biases first: sibling products then share theirs too)
  if (!opt_.gpu && opt_.cpu_packed_matmul) graph::fuse_matmul_bias(graph_, output_names_);
  if (opt_.fuse_matmuls) graph::fuse_sibling_matmuls(graph_);
  if (opt_.gpu && opt_.transposed_weights) graph::transpose_matmul_weights(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_dnnl && opt_.fuse_conv_activation) graph::fuse_conv_activation(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_dnnl && opt_.cpu_dnnl_blocked16 && ops::cpu_has_avx512f()) graph::mark_blocked16_convs(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_attention && opt_.cpu_avx512 && ops::cpu_has_avx512f()) graph::fuse_attention(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_gelu) graph::fuse_gelu(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_packed_matmul && opt_.cpu_product_gelu) graph::fuse_matmul_gelu(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_swiglu) graph::fuse_swiglu(graph_, output_names_);
  if (!opt_.gpu && opt_.cpu_skip_norm) graph::fuse_skip_norm(graph_, output_names_);
  std::vector<graph::Graph*> bodies;
  own_subgraphs(graph_, bodies);
  top_ = make_plan(graph_, input_names_, output_names_, /*top=*/true);
  // Constants now live in MLX arrays; their data pointers die with the ORT callback.
  graph_.constants.clear();
  for (auto* b : bodies) b->constants.clear();
  for (const auto& o : output_names_) {
    auto* vi = graph_.info(o);
    output_dtypes_.push_back(vi ? vi->dtype : DType::Undefined);
  }
}

std::unique_ptr<Plan> Program::make_plan(const graph::Graph& g,
                                                  const std::vector<std::string>& inputs,
                                                  const std::vector<std::string>& outputs,
                                                  bool top) {
  auto p = std::make_unique<Plan>();
  p->graph = &g;
  std::unordered_map<std::string, int> slot;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].empty()) slot.emplace(inputs[i], static_cast<int>(i));
  int next = static_cast<int>(inputs.size());
  // Constant initializers the scope reads (its nodes, its nested bodies, its outputs) become
  // arrays now: one copy, owned by MLX.
  auto take_constant = [&](const std::string& name) {
    if (name.empty() || slot.count(name)) return;
    const auto* c = g.constant(name);
    if (!c) return;
    mx::array a = c->transposed ? transposed_view(*c) : to_array(HostTensor{c->dtype, c->shape, c->data});
    if (top)
      constants_.push_back(a);
    else
      p->constants.emplace_back(next, a);
    slot.emplace(name, next++);
  };
  for (const auto& n : g.nodes) {
    for (const auto& in : n.inputs) take_constant(in);
    for (const auto& [attr, body] : n.subgraphs())
      for (const auto& name : graph::outer_names(*body)) take_constant(name);
  }
  for (const auto& o : outputs) take_constant(o);
  if (top) {
    p->num_inputs = static_cast<size_t>(next);  // fused inputs, then constants: all arguments
  } else {
    p->num_inputs = inputs.size();
    for (const auto& name : graph::outer_names(g)) {
      p->outer.push_back(name);
      p->outer_slots.push_back(next);
      slot.emplace(name, next++);
    }
  }
  auto lookup = [&](const std::string& value, const graph::Node& n, const char* what) {
    auto it = slot.find(value);
    if (it == slot.end())
      throw std::runtime_error(
          "[engine] " + n.describe() + ": " + what + " '" + value + "' has no producer in " +
          (top ? "the fused group" : "its subgraph") +
          (top && !n.subgraphs().empty()
               ? " (an implicit input missing from the fused node: ORT dropped it?)"
               : ""));
    return it->second;
  };
  for (const auto& n : g.nodes) {
    const auto* e = ops::find_op(n.domain, n.op_type, n.since_version);
    if (!e) throw std::runtime_error("[engine] no translator for " + n.describe());
    p->entries.push_back(e);
    StepIO io;
    for (const auto& in : n.inputs) io.in.push_back(in.empty() ? -1 : lookup(in, n, "input"));
    for (const auto& [attr, body] : n.subgraphs()) {
      auto bp = make_plan(*body, body->inputs, body->outputs, /*top=*/false);
      std::vector<int> outer;
      for (const auto& name : bp->outer) outer.push_back(lookup(name, n, "value read by a subgraph"));
      io.bodies.emplace_back(body, std::move(outer));
      body_plans_[body] = std::move(bp);
    }
    for (const auto& out : n.outputs) {
      if (out.empty()) { io.out.push_back(-1); continue; }
      io.out.push_back(next);
      slot[out] = next++;
    }
    p->steps.push_back(std::move(io));
  }
  for (const auto& o : outputs) {
    auto it = slot.find(o);
    if (it == slot.end())
      throw std::runtime_error("[engine] output '" + o + "' is not produced" +
                               (top ? std::string() : " by its subgraph"));
    p->output_slots.push_back(it->second);
  }
  p->num_slots = static_cast<size_t>(next);
  return p;
}

mx::array Program::transposed_view(const graph::ConstTensor& c) const {
  // Evaluated now: the view (strides {1, rows}) is what the runs take, with no Transpose in them.
  auto a = mx::transpose(to_array(HostTensor{c.dtype, {c.shape.at(1), c.shape.at(0)}, c.data}),
                         mx::default_stream(device()));
  mx::eval(a);
  return a;
}

mx::array Program::to_array(const HostTensor& t) {
  // float8/float4/int4/uint4: unpacked into their byte storage (ops/lowp.h).
  if (ops::lowp::is_lowp(t.dtype)) return ops::lowp::from_host(t.dtype, ops::to_shape(t.shape), t.data);
  auto dtype = ops::mlx_dtype(t.dtype);
  auto shape = ops::to_shape(t.shape);
  size_t numel = 1;
  for (auto d : shape) numel *= static_cast<size_t>(d);
  size_t nbytes = numel * dtype.size();
  check_allocation(nbytes, "a tensor copied into MLX");  // MLX's CPU allocator ignores the limit
  // An explicit copy: ORT's buffer dies after Compute and MLX may keep the array (constants,
  // cached host reads). allocator::malloc + memcpy never aliases, on any backend.
  auto data = mx::allocator::malloc(std::max<size_t>(nbytes, 1));
  if (nbytes) std::memcpy(data.buffer().raw_ptr(), t.data, nbytes);
  return mx::array(std::move(data), std::move(shape), dtype);
}

void Program::copy_out(const mx::array& a, void* dst, int device_copies) {
  if (a.size() == 0 || !dst) return;
  if (!a.flags().row_contiguous) throw std::logic_error("[engine] output is not row-contiguous");
  if (device_copies && kernels::cuda::copy_to_host(a, dst, device_copies == 2)) return;
  // A large output in pieces over the threads: one core's copy reaches a fraction of the
  // memory's bandwidth (a 256 MiB output took a third of its run).
  constexpr size_t kPiece = size_t{4} << 20, kSplitFrom = size_t{16} << 20;
  const size_t n = a.nbytes();
  if (n < kSplitFrom || ops::cpu_threads() < 2) std::memcpy(dst, a.data<void>(), n);
  else ops::cpu_copy_parallel(dst, a.data<void>(), n, kPiece, ops::cpu_threads());
}

void Program::copy_out(const mx::array& a, void* dst, DType t, int device_copies) {
  if (ops::lowp::is_lowp(t)) return ops::lowp::to_host(a, t, dst);  // packs 4-bit pairs
  copy_out(a, dst, device_copies);
}

std::string Program::signature_of(const std::vector<HostTensor>& raw, std::string* shapes) const {
  std::string key = signature_with(raw, nullptr);
  auto it = keyed_inputs_.find(key);
  std::string sig = it == keyed_inputs_.end() ? key : signature_with(raw, &it->second);
  if (shapes) *shapes = std::move(key);
  return sig;
}

namespace {
// Decimal digits appended in place (a run's signature is built every run: no temporaries).
void append_int(std::string& s, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
}  // namespace

std::string Program::signature_with(const std::vector<HostTensor>& raw,
                                    const std::vector<bool>* keyed_inputs) const {
  std::string sig;
  sig.reserve(16 * raw.size() + 16);
  auto tensor = [&](const HostTensor& t, bool keyed) {
    append_int(sig, static_cast<int>(t.dtype));
    sig += ':';
    size_t numel = 1;
    for (auto d : t.shape) {
      append_int(sig, d);
      sig += ',';
      numel *= static_cast<size_t>(d);
    }
    if (keyed && t.data) {
      sig += "=";
      sig.append(static_cast<const char*>(t.data), ops::lowp::host_nbytes(t.dtype, numel));
    }
  };
  for (size_t i = 0; i < raw.size(); ++i) {
    // Sequences: their length and every item; an empty optional: a mark of its own.
    if (raw[i].kind == HostTensor::Kind::None) sig += "none";
    if (raw[i].kind == HostTensor::Kind::Sequence) sig += "seq" + std::to_string(raw[i].items.size()) + "[";
    const bool keyed = keyed_inputs && (*keyed_inputs)[i];
    if (raw[i].kind == HostTensor::Kind::Tensor) tensor(raw[i], keyed);
    for (const auto& item : raw[i].items) {
      tensor(item, keyed);
      sig += "|";
    }
    sig += ";";
  }
  return sig;
}

// gpu_graph_replay. A signature is kept after this many compiled calls (the first traces and
// compiles MLX's kernels); captures tried or kept graphs dropped before it stays with the call.
constexpr int kKeptAfterCalls = 2;
constexpr int kKeptMaxTries = 3;
// A fused input in EP memory larger than this is read by the kept graph where it lies, and
// must be there again on every launch (a bound KV cache); smaller ones are copied in each run.
constexpr size_t kKeptCopyMaxBytes = 64 << 10;

struct Program::KeptGraph {
  std::unique_ptr<kernels::cuda::GraphReplay> graph;
  // Per fused input: the buffer the graph reads, whether each run copies the input into it (else
  // the input must be that buffer), and its size.
  std::vector<void*> reads;
  std::vector<bool> copied;
  std::vector<size_t> nbytes;
  std::vector<mx::array> owned;  // the copied inputs' buffers
  std::vector<mx::array> outs;   // the capturing run's results (the index-check flag included)
  std::vector<RowUpdate> rows;
};

bool Program::graph_replay_here(mx::Stream s) {
  if (replay_unavailable_) return false;  // a process's answer does not change
  std::string why;
  if (kernels::cuda::graph_replay_available(s, &why)) return true;
  if (opt_.log_level >= 1)
    std::cerr << "[MLX EP] fused node '" << name_ << "': runs are not kept as CUDA graphs: " << why << "\n";
  replay_unavailable_ = true;
  return false;
}

// A zero-size input (a prompt's empty past) is taken too: a compiled run never reads one (runs
// that do go to the CPU stream, see touches_empty), so the graph neither copies nor reads it.
bool Program::keepable(const std::vector<HostTensor>& raw) const {
  for (const auto& t : raw) {
    if (t.kind != HostTensor::Kind::Tensor || ops::lowp::is_lowp(t.dtype)) return false;
    int64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0) return false;
      numel *= d;
    }
    if (numel > 0 && !t.data) return false;
  }
  return true;
}

std::vector<mx::array> Program::capture_arguments(Entry& e, const std::vector<HostTensor>& raw,
                                                  const std::vector<mx::array>& args, bool unfused,
                                                  KeptGraph& k) const {
  // Which inputs the run writes rows into (found on a call that is not evaluated): the graph
  // takes those where they lie.
  std::vector<const void*> in_place_rows;
  if (opt_.inplace_rows && device_memory()) {
    auto dry = [&] {
      CompiledCallScope call(unfused);
      return e.fn(args);
    }();
    for (size_t i = 0; i < num_outputs() && i < dry.size(); ++i) {
      std::optional<mx::array> buffer;
      if (auto r = row_update_of(dry[i], i, raw, &buffer)) in_place_rows.push_back(r->input_data);
    }
  }
  std::vector<mx::array> out = args;
  bool copied_any = false;
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto& t = raw[i];
    const size_t n = args[i].nbytes();
    const bool rows = std::find(in_place_rows.begin(), in_place_rows.end(), t.data) != in_place_rows.end();
    const bool in_place = n > 0 && opt_.device_memory && (rows || n > kKeptCopyMaxBytes) && device_buffers::owns(t.data) &&
                          kernels::cuda::device_address(args[i]) == t.data;
    k.nbytes.push_back(n);
    k.copied.push_back(!in_place);
    if (n == 0) {  // nothing to copy or read (see keepable)
      k.reads.push_back(nullptr);
      k.owned.push_back(args[i]);
      continue;
    }
    if (in_place) {
      k.reads.push_back(const_cast<void*>(t.data));
      k.owned.push_back(args[i]);
      continue;
    }
    auto buffer = mx::array(mx::allocator::malloc(n), args[i].shape(), args[i].dtype());
    void* p = kernels::cuda::device_address(buffer);
    if (!p || buffer.nbytes() != n || !kernels::cuda::copy_bytes(p, t.data, n)) return {};
    copied_any = true;
    k.reads.push_back(p);
    k.owned.push_back(buffer);
    out[i] = buffer;
  }
  // The copies above are the driver's (legacy stream); the capture's kernels run on MLX's.
  if (copied_any && !kernels::cuda::finish_copies()) return {};
  return out;
}

std::optional<std::vector<mx::array>> Program::run_kept(Entry& e, const std::vector<HostTensor>& raw, mx::Stream s) {
  KeptGraph& k = *e.kept;
  auto drop = [&]() -> std::optional<std::vector<mx::array>> {
    e.kept.reset();
    ++e.kept_tries;
    ++stats_.replay_drops;
    return std::nullopt;
  };
  if (raw.size() != k.reads.size()) return drop();
  for (size_t i = 0; i < raw.size(); ++i)
    if (!k.copied[i] && raw[i].data != k.reads[i]) return drop();  // a new cache buffer, say
  for (const auto& r : k.rows)
    if (r.written && (!tl_output_buffer || tl_output_buffer(r.output, k.outs[r.output], nullptr) != r.input_data))
      return drop();
  for (size_t i = 0; i < raw.size(); ++i)
    if (k.copied[i] && k.nbytes[i] && !k.graph->copy_in(k.reads[i], raw[i].data, k.nbytes[i])) return drop();
  const auto t0 = std::chrono::steady_clock::now();
  {
    trace::Span span("phase", "launch kept graph");
    if (!k.graph->launch()) return drop();
  }
  tl_last_eval_ns = elapsed_ns(t0);
  stats_.eval_ns += tl_last_eval_ns;
  stats_.eval_ns_compiled += tl_last_eval_ns;
  ++e.hits;
  ++stats_.replay_runs;
  ++stats_.compiled_runs;
  tl_last_run_compiled = tl_last_run_replayed = true;
  tl_last_run_path = "kept graph";
  tl_row_updates = k.rows;
  auto outs = k.outs;
  if (index_check::take_flag(outs, num_outputs(), opt_.device_copies == 2)) {
    auto args = arguments(raw);
    args.insert(args.end(), constants_.begin(), constants_.end());
    diagnose_index(args, layout_of(raw), s);
  }
  return outs;
}

void Program::diagnose_index(const std::vector<mx::array>& args, const Layout& layout, mx::Stream s) const {
  index_check::Diagnose diagnose;
  try {
    (void)translate(args, layout, Mode::Eager, nullptr, nullptr, s);
  } catch (const std::exception& e) {
    throw index_check::IndexError(e.what());
  }
  throw index_check::IndexError("an index is out of range (its node could not be named)");
}

// Long: the run's modes (probe, eager, compiled replay, piecewise family segments, the GPU's
// zero-size fallback) share the argument list, the lock and eval_all, and each falls through to
// the next; the modes' own work lives in translation.cc and shape_family.cc.
std::vector<mx::array> Program::run(const std::vector<HostTensor>& raw) {
  if (raw.size() != input_names_.size())
    throw std::invalid_argument("[MLX EP] fused node '" + name_ + "' expects " +
                                std::to_string(input_names_.size()) + " inputs, got " +
                                std::to_string(raw.size()));
  const Layout layout = layout_of(raw);

  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.runs;
  tl_last_run_compiled = false;
  tl_last_run_replayed = false;
  tl_last_run_walked = false;
  tl_last_run_path = "eager";
  // MLX's default stream is per thread (0.31.2+): compiled functions are keyed by it too.
  mx::Stream s = mx::default_stream(device());
  if (!opt_.gpu && opt_.cpu_pin_workers) ops::cpu_pin_openmp_workers(s);
  tl_row_updates.clear();
  std::string shapes;  // the run's signature without input data (signature_of)
  std::string sig = signature_of(raw, &shapes);
  sig += '#';
  append_int(sig, s.index);
  Entry* found = cache_.find(sig);
  if (found && found->kept && opt_.gpu && opt_.gpu_graph_replay)
    if (auto outs = run_kept(*found, raw, s)) return std::move(*outs);
  ops::HostViews views;  // declared before anything that may hold the views
  std::vector<mx::array> args = arguments(raw, opt_.gpu || !opt_.cpu_in_place_io ? nullptr : &views);
  stats_.inputs_in_place += views.count();
  args.insert(args.end(), constants_.begin(), constants_.end());
  // `keep`: the evaluation is kept as a CUDA graph (gpu_graph_replay) into it, when it can be.
  // `walked`: the graph holds kept segments (shape_family.cc), which only a walk computes.
  // The signature's kernels run on one thread (one_thread_program): its walk may take the caller
  // whatever their inputs' sizes (set once the signature's entry is known).
  bool walk_one_thread = false;
  auto eval_all = [&, this](std::vector<mx::array> outs, KeptGraph* keep = nullptr, bool walked = false) {
    // Outputs that may be rows written into their own input buffer (RowUpdate) are left out of
    // the evaluation; their rows and positions are evaluated instead.
    std::vector<mx::array> todo;
    tl_row_updates.clear();
    // Rows whose output ORT binds to the very buffer they update: on a CUDA GPU written by one
    // kernel inside this evaluation (the attention reads only rows below the new ones, and a run
    // that then fails, e.g. an index check, leaves those valid rows as they were).
    std::vector<mx::array> row_buffers, row_updates, row_starts;
    std::vector<size_t> merged;
    for (size_t i = 0; i < outs.size(); ++i) {
      std::optional<RowUpdate> r;
      std::optional<mx::array> buffer;
      if (i < num_outputs() && opt_.inplace_rows && device_memory()) r = row_update_of(outs[i], i, raw, &buffer);
      if (r) {
        if (opt_.gpu && opt_.gpu_kernels && opt_.step_row_writes && tl_output_buffer && r->axes == std::vector<int>{2} &&
            tl_output_buffer(i, outs[i], nullptr) == r->input_data) {
          row_buffers.push_back(*buffer);
          row_updates.push_back(r->update);
          row_starts.push_back(r->start);
          merged.push_back(tl_row_updates.size());
        } else {
          todo.push_back(r->update);
          todo.push_back(r->start);
        }
        tl_row_updates.push_back(std::move(*r));
      } else {
        todo.push_back(outs[i]);
      }
    }
    if (!merged.empty()) {
      if (auto done = kernels::cuda::write_rows(row_buffers, row_updates, row_starts, s)) {
        todo.push_back(*done);
        for (auto k : merged) tl_row_updates[k].written = true;
      } else {
        for (auto k : merged) {
          todo.push_back(tl_row_updates[k].update);
          todo.push_back(tl_row_updates[k].start);
        }
      }
    }
    // On the CPU, outputs the EP's kernels compute are written into ORT's output tensors.
    ops::OutputBinding bound;
    std::vector<BoundOutput> in_place;
    if (!opt_.gpu && opt_.cpu_in_place_io && s.device == mx::Device::cpu && tl_output_buffer && !keep)
      in_place = bind_outputs(outs, bound, raw);
    stats_.eval_arrays += check_evaluation(todo, where_);  // before MLX allocates (memory_guard.h)
    if (opt_.log_level >= 3) log_primitives(todo, where_);
    auto t0 = std::chrono::steady_clock::now();
    const bool after_short = !opt_.gpu && (last_polled_eval_ns_.load(std::memory_order_relaxed) <
                                               static_cast<uint64_t>(opt_.cpu_poll_us) * 1000 ||
                                           evals_.fetch_add(1, std::memory_order_relaxed) % kPollProbeEvery == 0);
    {
      trace::Span span("phase", "evaluate");
      if (span.active()) span.arg("arrays", std::to_string(todo.size()));
      const bool poll = after_short && opt_.cpu_poll;
      stats_.after_short_evals += after_short;
      stats_.polled_evals += poll;
      if (keep) {
        std::string why;
        keep->graph = kernels::cuda::GraphReplay::capture(todo, s, &why);
        if (keep->graph) {
          keep->outs = outs;  // the index-check flag included: each launch reads it
          keep->rows = tl_row_updates;
        } else if (opt_.log_level >= 1) {
          std::cerr << "[MLX EP] fused node '" << name_ << "': run not kept as a CUDA graph: " << why << "\n";
        }
      } else {
        const auto window = std::chrono::microseconds(opt_.cpu_poll_us);
        const auto walk_for = poll ? window : std::chrono::microseconds(0);
        if (!(opt_.cpu_caller_eval && s.device == mx::Device::cpu &&
              (walked ? evaluate_with_kept_segments(todo, s, poll && opt_.cpu_hold, walk_for)
                      : evaluate_on_caller(todo, s, poll && opt_.cpu_hold, walk_for, false, opt_.cpu_walk_large,
                                           walk_one_thread))))
          evaluate(todo, poll, poll && opt_.cpu_hold, window, s);
      }
    }
    tl_last_eval_ns = elapsed_ns(t0);
    if (after_short) last_polled_eval_ns_.store(tl_last_eval_ns, std::memory_order_relaxed);
    stats_.eval_ns += tl_last_eval_ns;
    count_in_place(outs, in_place);
    if (index_check::take_flag(outs, num_outputs(), opt_.device_copies == 2)) diagnose_index(args, layout, s);
    return outs;
  };

  // A probe: translate with the real data, learning which host reads the graph makes and
  // whether they depend only on shapes (compilable) or on tensor data (eager only). Returns the
  // outputs; `restart` when an input newly joined the signature (its key changed).
  auto probe = [&](Entry& entry, bool& restart, StepInfos* steps) {
    HostRecord record;
    std::vector<int> deps;
    std::vector<mx::array> outs;
    // A small program whose kernels chose to split is translated again on one thread, so that
    // what it prepares (a convolution's weight in its plan's layout) is what the trace reuses.
    for (const bool one_thread : {false, true}) {
      record.clear();
      deps.clear();
      if (steps) steps->clear();
      ops::WorkScope work(one_thread);
      outs = translate(args, layout, Mode::Probe, &record, &deps, s, steps);
      if (one_thread) break;
      entry.work_flops = work.flops();
      if (!work.split() || !one_thread_program(entry, s)) break;
    }
    bool data_dependent = false;
    restart = false;
    std::vector<bool>* keyed = nullptr;
    for (int d : deps) {
      if (!keyed) {
        keyed = &keyed_inputs_[shapes];
        if (keyed->empty()) keyed->assign(input_names_.size(), false);
      }
      if ((*keyed)[d]) continue;
      int64_t numel = 1;
      for (auto x : raw[d].shape) numel *= x;
      if (raw[d].kind != HostTensor::Kind::Tensor) numel = 0;  // a sequence: all its items
      for (const auto& item : raw[d].items) {
        int64_t n = 1;
        for (auto x : item.shape) n *= x;
        numel += n;
      }
      if (numel <= kMaxKeyedElements) {
        (*keyed)[d] = true;  // e.g. a shape tensor computed on the CPU EP
        restart = true;
      } else {
        data_dependent = true;
      }
    }
    entry.record = std::move(record);
    entry.eager_only = data_dependent || !opt_.compile;
    entry.probed = true;
    return outs;
  };

  if (!found) {
    // A member of a known shape family (a decode step): compiled segments and eager steps.
    // Not cached: every step of a decode loop is a signature of its own.
    if (Piecewise* pw = compile_broken_ ? nullptr : family_.member(layout, s.device)) {
      std::optional<std::vector<mx::array>> result;
      for (const bool walks : {true, false}) {
        // A kept segment that cannot be computed again (a step its walk cannot take, a graph
        // too large to walk) ends the family's kept segments: the run is done again without.
        try {
          bool walked = false;
          auto outs = run_piecewise(*pw, args, layout, s, walks, walked);
          if (opt_.gpu && touches_empty(outs)) break;  // run again below, on the CPU stream
          tl_last_run_path = walked ? "shape family (kept segments)" : "shape family";
          result = eval_all(std::move(outs), nullptr, walked);
          break;
        } catch (const KeptSegmentMiss& ex) {
          if (!walks) throw;
          pw->walks_missed = true;
          for (auto& seg : pw->segments) seg.walk.reset();
          ++stats_.segment_walk_misses;
          if (opt_.log_level >= 1)
            std::cerr << "[MLX EP] " << where_ << ": shape family: kept segments dropped: " << ex.what() << "\n";
        }
      }
      // The family is gone when no segment has matched for a while: look for another.
      family_.after_run();
      if (result) {
        ++stats_.piecewise_runs;
        ++stats_.eager_runs;
        return std::move(*result);
      }
    }
    Entry entry;
    std::vector<mx::array> outs;
    // Until a family is found, each new signature's steps are kept, to compare with the next.
    StepInfos steps;
    StepInfos* look =
        opt_.compile && opt_.shape_family && !compile_broken_ && family_.looking() ? &steps : nullptr;
    tl_last_run_path = "eager (new signature)";
    if (probed_once_ && opt_.compile) {
      // A new signature of a program already probed: most are seen once (every decode step
      // has a new length), so it runs eagerly without the probe's bookkeeping (~40% of the
      // translation); it is probed when it comes back often enough to be compiled.
      outs = translate(args, layout, Mode::Eager, nullptr, nullptr, s, look);
    } else {
      for (;;) {
        bool restart = false;
        if (look) look->clear();
        outs = probe(entry, restart, look);
        if (!restart) break;
        sig = signature_of(raw) + "#" + std::to_string(s.index);
        if (cache_.contains(sig)) break;
      }
      probed_once_ = true;
    }
    if (look && steps.size() == top_->steps.size())
      family_.observe(*top_, layout, s.device, std::move(steps),
                      [this](int slot) { return is_constant_slot(*top_, slot); });
    if (touches_empty(outs)) {
      ++stats_.empty_operand_runs;
      if (opt_.gpu) {
        tl_last_run_path = "eager (CPU stream: zero-size operand)";
        entry.on_cpu = entry.eager_only = true;
        outs = translate(args, layout, Mode::Eager, nullptr, nullptr, mx::default_stream(mx::Device::cpu));
      }
    }
    ++stats_.eager_runs;
    walk_one_thread = one_thread_program(entry, s);
    auto result = eval_all(std::move(outs));
    if (!cache_.contains(sig)) {
      entry.hits = 1;
      cache_.insert(sig, std::move(entry));
    }
    return result;
  }

  Entry& e = *found;
  ++e.hits;
  walk_one_thread = one_thread_program(e, s);
  if (e.on_cpu) {
    tl_last_run_path = "eager (CPU stream: zero-size operand)";
    ++stats_.eager_runs;
    ++stats_.empty_operand_runs;
    return eval_all(translate(args, layout, Mode::Eager, nullptr, nullptr, mx::default_stream(mx::Device::cpu)));
  }
  if (!e.eager_only && !compile_broken_ && !e.fn && e.hits >= opt_.compile_after && !e.probed) {
    // Deferred probe (its outputs are not evaluated: the compiled call below computes them).
    // If an input joined the signature, this entry's key is stale: run eagerly, and let the
    // next run file itself under the new key.
    bool restart = false;
    (void)probe(e, restart, nullptr);
    if (restart) {
      cache_.erase(sig);
      ++stats_.eager_runs;
      return eval_all(translate(args, layout, Mode::Eager, nullptr, nullptr, s));
    }
  }
  if (!e.eager_only && !compile_broken_ && !e.fn && e.hits >= opt_.compile_after) {
    auto record = std::make_shared<HostRecord>(e.record);
    const bool one_thread = one_thread_program(e, s);
    auto traced_fn = [this, record, layout, s, one_thread](const std::vector<mx::array>& a) {
      ops::WorkScope work(one_thread);
      return translate(a, layout, Mode::Replay, record.get(), nullptr, s);
    };
    e.fn = mx::compile(traced_fn, /*shapeless=*/false);
    e.unfused = s.device == mx::Device::cpu && opt_.cpu_fuse != 1;
    if (s.device == mx::Device::cpu && opt_.cpu_fuse == 2)
      e.fn_fused = mx::compile(traced_fn, /*shapeless=*/false);  // its own cache entry
    ++stats_.traces;
    tl_last_run_path = "compiled (new trace)";
  }
  // The fused trace's trial calls (cpu_fuse=auto) call it; the unfused trace's runs replay its
  // kept walk.
  if (e.fn && !compile_broken_ && e.walk && !fusion_trial(e)) {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<std::vector<mx::array>> outs;
    ops::OutputBinding bound;
    std::vector<BoundOutput> in_place;
    if (opt_.cpu_in_place_io && tl_output_buffer) in_place = bind_outputs(e.walk->outputs(), bound, raw, /*kept=*/true);
    try {
      outs = e.walk->replay(e.walk_args, args, opt_.cpu_poll && opt_.cpu_hold, std::chrono::microseconds(opt_.cpu_poll_us));
    } catch (...) {
      e.walk.reset();  // its arrays' state is unknown
      e.walk_args.clear();
      throw;
    }
    if (outs) {
      tl_last_eval_ns = elapsed_ns(t0);
      if (opt_.log_level >= 3) {  // the same primitives a walk computes
        std::map<std::string, int> count;
        for (const auto& a : e.walk->tape()) count[a.primitive().name()]++;
        print_primitives(count, where_);
      }
      stats_.eval_ns += tl_last_eval_ns;
      stats_.eval_ns_compiled += tl_last_eval_ns;
      ++stats_.compiled_runs;
      tl_last_run_compiled = true;
      tl_last_run_path = "replayed walk";
      tl_last_run_walked = true;
      ++stats_.walk_replays;
      count_in_place(*outs, in_place);
      if (e.fn_fused) tune_fusion(e, /*unfused=*/true, tl_last_eval_ns);
      if (index_check::take_flag(*outs, num_outputs(), opt_.device_copies == 2)) diagnose_index(args, layout, s);
      return std::move(*outs);
    }
    e.walk.reset();
    e.walk_args.clear();
  }
  if (e.fn && !compile_broken_) {
    if (tl_last_run_path == std::string_view("eager")) tl_last_run_path = "compiled";
    // cpu_fuse=2: the unfused trace, but for the fused trace's trial calls.
    const bool trial = fusion_trial(e);
    try {
      const bool use_unfused = e.unfused && !trial;
      // A warm compiled signature is kept as one CUDA graph (gpu_graph_replay): its later runs
      // launch that graph (run_kept, above) instead of calling the compiled function.
      ++e.compiled_calls;
      std::shared_ptr<KeptGraph> kept;
      std::vector<mx::array> kept_args;
      if (opt_.gpu && opt_.gpu_graph_replay && !trial && !e.kept && e.kept_tries < kKeptMaxTries &&
          e.compiled_calls > kKeptAfterCalls && graph_replay_here(s) && keepable(raw)) {
        kept = std::make_shared<KeptGraph>();
        kept_args = capture_arguments(e, raw, args, use_unfused, *kept);
        if (kept_args.empty()) {
          kept.reset();
          ++e.kept_tries;
          ++stats_.replay_failures;
        }
      }
      const auto t_call = std::chrono::steady_clock::now();
      auto traced = [&] {
        CompiledCallScope call(use_unfused);
        return (trial ? e.fn_fused : e.fn)(kept ? kept_args : args);
      }();
      const auto call_ns = elapsed_ns(t_call);
      // A warm signature's walk is kept for its later runs (never a fusion trial's).
      const bool keep_walk = opt_.cpu_caller_eval && opt_.cpu_caller_replay && s.device == mx::Device::cpu &&
                             !opt_.gpu && !trial && !e.walk && !kept &&
                             e.compiled_calls >= kWalkAfterCalls;
      if (keep_walk) keep_next_walk();
      auto outs = eval_all(std::move(traced), kept.get());
      if (keep_walk) {
        auto walk = take_kept_walk();
        if (walk && walk->bytes() <= kWalkMaxBytes &&
            std::all_of(tl_row_updates.begin(), tl_row_updates.end(), [](const RowUpdate& r) { return r.written; })) {
          e.walk = std::move(walk);
          e.walk_args = args;
          tl_last_run_walked = true;  // its outputs are the kept walk's from now on
          skip_fusion_trial(e);
        }
      }
      if (kept) {
        ++(kept->graph ? stats_.replay_captures : stats_.replay_failures);
        if (kept->graph)
          e.kept = std::move(kept);
        else
          ++e.kept_tries;
      }
      if (e.fn_fused) tune_fusion(e, use_unfused, elapsed_ns(t_call));
      stats_.call_ns_compiled += call_ns;
      ++stats_.compiled_runs;
      stats_.eval_ns_compiled += tl_last_eval_ns;
      tl_last_run_compiled = true;
      return outs;
    } catch (const MemoryLimitError&) {
      throw;  // the run's size, not the graph's traceability: keep the compiled path
    } catch (const index_check::IndexError&) {
      throw;  // the data, not the graph
    } catch (const std::exception& ex) {
      if (trial) {
        // The fused trace failed where the unfused one runs: keep that one (this run eager).
        e.fn_fused = nullptr;
        ++stats_.fusion_kept_unfused;
        if (opt_.log_level >= 1)
          std::cerr << "[MLX EP] fused node '" << name_ << "': fused trace failed, kept the unfused one: "
                    << ex.what() << "\n";
        ++stats_.eager_runs;
        return eval_all(translate(args, layout, Mode::Eager, nullptr, nullptr, s));
      }
      // Some graphs cannot be traced (an op that reads data while tracing, an MLX primitive
      // without compile support): fall back to eager for this program, and say so once.
      compile_broken_ = true;
      tl_last_run_path = "eager (compile failed)";
      ++stats_.compile_fallbacks;
      e.fn = nullptr;
      if (opt_.log_level >= 1)
        std::cerr << "[MLX EP] fused node '" << name_ << "': mx::compile failed, running eager: "
                  << ex.what() << "\n";
    }
  }
  ++stats_.eager_runs;
  return eval_all(translate(args, layout, Mode::Eager, nullptr, nullptr, s));
}

std::vector<Program::BoundOutput> Program::bind_outputs(const std::vector<mx::array>& outs, ops::OutputBinding& bound,
                                                       const std::vector<HostTensor>& raw, bool kept) {
  std::vector<BoundOutput> done;
  std::unordered_set<std::uintptr_t> seen;  // one buffer for an array that is several outputs
  for (size_t i = 0; i < num_outputs() && i < outs.size(); ++i) {
    mx::array a = outs[i];
    if (a.is_available() && !kept) continue;  // an input, a constant
    // Outputs leave translate() through a Contiguous, a view of a kernel's row-major result.
    if (a.has_primitive() && a.primitive().name() == std::string_view("Contiguous") && a.inputs().size() == 1 &&
        a.inputs()[0].shape() == a.shape() && a.inputs()[0].dtype() == a.dtype())
      a = a.inputs()[0];
    // A kept segment's output: the kept array its walk computes again, as a kept walk's own.
    bool again = kept;
    if (auto source = kept_segment_source(a)) {
      a = *source;
      again = true;
    }
    if ((a.is_available() && !again) || !a.has_primitive() || !ops::is_cpu_kernel(a.primitive().name())) continue;
    // Only a decode step's attention writes a present over its own past (a shared buffer bound
    // as both), whatever its size; with EP memory, other small outputs are better adopted
    // (asking for ORT's buffer allocates it), large ones bound (their buffer from the device
    // allocator's pool, device_buffers.h).
    const bool gqa = a.primitive().name() == std::string_view("DecodeGqa");
    const bool adopt = device_memory() && !gqa && !again && a.nbytes() < device_buffers::kPoolMinBytes;
    if (ops::lowp::is_lowp(output_dtypes_[i]) || (a.nbytes() < kInPlaceMinBytes && !gqa) || adopt ||
        !seen.insert(a.id()).second)
      continue;
    size_t nbytes = 0;  // ORT's tensor, in its element type
    auto* dst = static_cast<char*>(const_cast<void*>(tl_output_buffer(i, a, &nbytes)));
    if (!dst || nbytes != a.nbytes()) continue;
    bool alias = false, overlap = false;
    for (const auto& t : raw) {
      const auto* p = static_cast<const char*>(t.data);
      const size_t n = t.kind == HostTensor::Kind::Tensor ? nbytes_of(t) : 0;
      if (!p || !n || p >= dst + nbytes || dst >= p + n) continue;
      if (p == dst && n == nbytes) alias = true;
      else overlap = true;
    }
    if (overlap || (alias && !gqa)) continue;  // a kernel's output over another input: not written there
    if (bound.bind(a, dst)) done.push_back({i, dst, alias});
  }
  return done;
}

void Program::count_in_place(const std::vector<mx::array>& outs, const std::vector<BoundOutput>& bound) {
  for (const auto& b : bound) {
    if (b.output >= outs.size() || !holds_data_at(outs[b.output], b.dst)) continue;
    ++stats_.outputs_in_place;
    // A present over its own past: the step's rows written in place, nothing left to copy.
    if (b.over_input) tl_row_updates.push_back({b.output, b.dst, mx::array(0), mx::array(0), {}, true});
  }
}

namespace {
// The fused trace is tried after this many runs of the unfused one (whose walk is kept by
// then: a signature's early runs are its steady state), for one untimed call and these timed.
constexpr int kFusionTrialAfter = 8;
constexpr int kFusionTrialRuns = 2;
// ... only for a kept walk with at least this many elements a run in MLX's own primitives.
constexpr size_t kFusionTrialMinElements = size_t{1} << 20;
}  // namespace

bool Program::fusion_trial(const Entry& e) { return e.fn_fused && e.unfused_runs >= kFusionTrialAfter; }

void Program::skip_fusion_trial(Entry& e) {
  // MLX's generated kernels only merge its own elementwise primitives: a kept walk with few of
  // their elements (a small encoder's, a CNN's of oneDNN and EP kernels) cannot repay the trial
  // (a trace and its calls, a few slow runs), so the unfused trace stays untimed.
  if (!e.fn_fused || !e.walk || e.walk->mlx_elements() >= kFusionTrialMinElements) return;
  e.fn_fused = nullptr;
  ++stats_.fusion_trials_skipped;
  if (opt_.log_level >= 1)
    std::cerr << "[MLX EP] fused node '" << name_ << "': kept the unfused trace untimed (" << e.walk->mlx_elements()
              << " elements a run in MLX's own primitives)\n";
}

void Program::tune_fusion(Entry& e, bool unfused, uint64_t ns) {
  if (unfused) {  // the first run traces (untimed)
    if (e.unfused_runs++ > 0)
      e.best_unfused_ns = e.best_unfused_ns == 0 ? static_cast<double>(ns) : std::min(e.best_unfused_ns, static_cast<double>(ns));
    return;
  }
  if (e.trial_calls++ > 0)
    e.best_fused_ns = e.best_fused_ns == 0 ? static_cast<double>(ns) : std::min(e.best_fused_ns, static_cast<double>(ns));
  if (e.trial_calls < 1 + kFusionTrialRuns) return;
  // Fused only when clearly faster: the unfused trace's runs are walked, and MLX's generated
  // kernels win only over large elementwise chains.
  const bool fused = e.best_fused_ns < 0.95 * e.best_unfused_ns;
  if (fused) {
    e.fn = std::move(e.fn_fused);
    e.unfused = false;
    e.walk.reset();  // a kept walk is the unfused trace's
    e.walk_args.clear();
    ++stats_.fusion_kept_fused;
  } else {
    ++stats_.fusion_kept_unfused;
  }
  e.fn_fused = nullptr;  // releases the other trace (MLX drops its cache entry with it)
  if (opt_.log_level >= 1)
    std::cerr << "[MLX EP] fused node '" << name_ << "': kept the " << (fused ? "fused" : "unfused")
              << " trace (best run " << (fused ? e.best_fused_ns : e.best_unfused_ns) / 1e6 << " ms against "
              << (fused ? e.best_unfused_ns : e.best_fused_ns) / 1e6 << " ms)\n";
}

}  // namespace ortmlx::engine
