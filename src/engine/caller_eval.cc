#include "engine/caller_eval.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <mlx/primitives.h>
#include <mlx/scheduler.h>

#include "engine/device_buffers.h"
#include "engine/stream_hold.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/buffers.h"
#include "kernels/cpu/task.h"

namespace ortmlx::engine {

namespace mx = mlx::core;

namespace {

std::atomic<uint64_t> g_arrays{0}, g_stream_arrays{0}, g_left{0}, g_replays{0}, g_released{0};
thread_local bool tl_keep_next = false;
thread_local std::shared_ptr<KeptWalk> tl_kept;

bool pending(const mx::array& a) { return a.status() == mx::array::Status::unscheduled && a.has_primitive(); }
bool ready(const mx::array& a) { return a.status() == mx::array::Status::available || a.is_available(); }

// The outputs of the step a walk computes, in a vector of the thread's (a.outputs() builds a new
// one: a heap allocation a step), emptied again after the step so that it holds no array
// between steps. A kept segment's walk (inside a step) sets it aside while it runs.
thread_local std::vector<mx::array> tl_step_outputs;

// What the walk does with a primitive, by its name (one lookup).
enum class Kind {
  View,        // MLX's eval_cpu only points the output at the input's buffer (no task)
  Reshape,     // ... when the input is row-contiguous; else a row-major copy, as MLX's copy leaves it
  Contiguous,  // ... likewise, under MLX's own size test
  Kernel,      // one of the EP's CPU kernels: its eval_cpu runs the task at once
  Mlx,         // one of MLX's computing primitives: kernels/cpu (cpu_mlx_primitive_on_caller)
  Segment,     // a kept segment (KeptSegment, below): its kept walk, computed again here
};

constexpr std::string_view kKeptSegment = "KeptSegment";

Kind kind_of(std::string_view n) {
  static const std::unordered_map<std::string_view, Kind> kinds = [] {
    std::unordered_map<std::string_view, Kind> m;
    for (auto v : {"Broadcast", "BroadcastAxes", "ExpandDims", "Squeeze", "Transpose", "Slice", "AsStrided",
                   "StopGradient", "Split", "Copy"})
      m.emplace(v, Kind::View);
    for (auto v : {"Reshape", "Flatten", "Unflatten"}) m.emplace(v, Kind::Reshape);
    m.emplace("Contiguous", Kind::Contiguous);
    m.emplace(kKeptSegment, Kind::Segment);
    return m;
  }();
  if (auto it = kinds.find(n); it != kinds.end()) return it->second;
  return ops::is_cpu_kernel(n) ? Kind::Kernel : Kind::Mlx;
}

bool compute_segment(mx::Primitive& prim, const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs);

bool compute(mx::array& a, Kind kind) {
  auto& prim = a.primitive();
  auto& inputs = a.inputs();
  auto& outputs = tl_step_outputs;
  struct Emptied {
    ~Emptied() { tl_step_outputs.clear(); }
  } emptied;
  if (a.siblings().empty())
    outputs.push_back(a);
  else
    outputs = a.outputs();
  bool view = kind == Kind::View;
  if (kind == Kind::Reshape) view = inputs[0].size() == 0 || inputs[0].flags().row_contiguous;
  if (kind == Kind::Contiguous)  // MLX's own test: a row-contiguous input not much larger than the output
    view = inputs[0].flags().row_contiguous && inputs[0].buffer_size() <= outputs[0].nbytes() + 16384;
  if (view) {
    prim.eval_cpu(inputs, outputs);
    return true;
  }
  if (kind == Kind::Reshape || kind == Kind::Contiguous) {
    if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].dtype() != outputs[0].dtype()) return false;
    auto& out = outputs[0];
    ops::allocate_output(out);
    ops::copy_row_major(inputs[0], out.data<void>());
    return true;
  }
  if (kind == Kind::Kernel) {
    ops::CallerTasksScope on_caller;
    prim.eval_cpu(inputs, outputs);
    return true;
  }
  if (kind == Kind::Segment) return compute_segment(prim, inputs, outputs);
  return ops::cpu_mlx_primitive_on_caller(prim, inputs, outputs);
}

// Arrays above this many elements may start parallel work in a kernel.
constexpr size_t kCallerMaxElements = size_t{1} << 14;
// A walk on the stream thread only for graphs whose arrays average at most this many elements.
constexpr size_t kWalkMaxMeanElements = size_t{1} << 14;

// An array whose buffer a kept walk holds between runs from this size only when nothing reads
// it after the run (KeptWalk::release_after_).
constexpr size_t kReleaseMinBytes = size_t{64} << 10;

// Points `a` at an empty buffer, letting go of the one it held (MLX's cache takes it back when
// nothing else holds it); its next computation allocates again (ops::allocate_output).
void point_at_nothing(mx::array& a) {
  static const mx::array kNone = [] {
    mx::array n(0.0f);
    n.eval();
    return n;
  }();
  a.copy_shared_buffer(kNone, a.strides(), a.flags(), 0, 0);
}

// A kept walk's large array after its last reader (KeptWalk::release_after_), counted.
void let_go(mx::array& a) {
  if (!a.data_shared_ptr()) return;
  point_at_nothing(a);
  g_released.fetch_add(1, std::memory_order_relaxed);
}

// Computes what can be computed of `tape`, in order; returns the arrays computed and left.
// `kinds`: each step's Kind, looked up once for a kept walk (else by name at each step).
// `release_after`: a kept walk's large arrays to let go of after each step (KeptWalk).
std::pair<uint64_t, uint64_t> walk(std::vector<mx::array>& tape, bool detach = true,
                                   const std::vector<uint8_t>* kinds = nullptr,
                                   const std::vector<std::vector<std::pair<uint32_t, uint32_t>>>* release_after = nullptr) {
  uint64_t done = 0, left = 0;
  for (size_t i = 0; i < tape.size(); ++i) {
    auto& a = tape[i];
    bool inputs_ready = true;
    for (const auto& in : a.inputs()) inputs_ready = inputs_ready && ready(in);
    const Kind kind = kinds ? static_cast<Kind>((*kinds)[i]) : kind_of(a.primitive().name());
    if (!inputs_ready || !compute(a, kind)) {
      ++left;
      continue;
    }
    if (a.status() != mx::array::Status::available)  // (a kept walk's arrays already are)
      for (auto& o : a.outputs()) o.set_status(mx::array::Status::available);
    if (detach) a.detach();
    ++done;
    if (release_after)
      for (const auto& [step, k] : (*release_after)[i]) let_go(tape[step].outputs()[k]);
  }
  return {done, left};
}

// The walk as one task of the stream's thread; the caller waits for it.
std::pair<uint64_t, uint64_t> on_stream(const std::function<std::pair<uint64_t, uint64_t>()>& body, mx::Stream s,
                                        bool hold, std::chrono::microseconds poll_for) {
  struct State {
    std::atomic<bool> done{false};
    std::mutex mu;
    std::condition_variable cv;
    std::exception_ptr error;
    std::pair<uint64_t, uint64_t> counts;
  };
  auto st = std::make_shared<State>();
  {
    std::optional<StreamHold> held;
    if (hold) held.emplace(s, poll_for);
    mx::scheduler::enqueue(s, [st, &body] {
      try {
        st->counts = body();
      } catch (...) {
        st->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->done.store(true, std::memory_order_release);
      }
      st->cv.notify_one();
    });
  }
  const auto until = std::chrono::steady_clock::now() + poll_for;
  while (!st->done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->done.load(std::memory_order_acquire); });
  }
  if (st->error) std::rethrow_exception(st->error);
  return st->counts;
}

// `body` (a walk) on the caller or as a task of stream `s`, counted as such.
std::pair<uint64_t, uint64_t> run_walk(const std::function<std::pair<uint64_t, uint64_t>()>& body, bool on_caller,
                                       mx::Stream s, bool hold, std::chrono::microseconds poll_for) {
  std::pair<uint64_t, uint64_t> counts;
  if (on_caller) {
    StreamHold::note_run_begun();  // a lingering stream thread stops spinning beside this thread
    counts = body();
  } else {
    counts = on_stream(body, s, hold, poll_for);
  }
  (on_caller ? g_arrays : g_stream_arrays).fetch_add(counts.first, std::memory_order_relaxed);
  return counts;
}

// A kept segment: its inputs, then its kept walk's outputs (shared buffers: a kept walk computes
// its arrays again in place where nothing else holds them, so a run's results outlive the next).
class KeptSegment : public mx::Primitive {
 public:
  KeptSegment(mx::Stream s, std::shared_ptr<SegmentWalk> walk) : mx::Primitive(s), walk_(std::move(walk)) {}
  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    // (MLX's evaluation would run it out of order with its inputs: the engine never lets it.)
    throw KeptSegmentMiss("a kept segment reached MLX's evaluation");
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw KeptSegmentMiss("a kept segment on the GPU");
  }
  const char* name() const override { return kKeptSegment.data(); }
  bool compute(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
    // The step's outputs vector is the thread's: set aside while the segment's own steps use it.
    std::vector<mx::array> mine = std::move(outputs);
    outputs.clear();
    struct Restore {
      std::vector<mx::array>& to;
      std::vector<mx::array>& from;
      ~Restore() { to = std::move(from); }
    } restore{outputs, mine};
    if (!walk_->walk->compute_here(walk_->args, inputs)) return false;
    const auto& kept = walk_->walk->outputs();
    if (kept.size() != mine.size()) return false;
    for (size_t i = 0; i < kept.size(); ++i) mine[i].copy_shared_buffer(kept[i]);
    walk_->walk->let_go_of_small_outputs();
    return true;
  }
  bool on_caller() const { return walk_->walk->on_caller(); }
  const std::vector<mx::array>& kept_outputs() const { return walk_->walk->outputs(); }

 private:
  std::shared_ptr<SegmentWalk> walk_;
};

bool compute_segment(mx::Primitive& prim, const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  return static_cast<KeptSegment&>(prim).compute(inputs, outputs);
}

// (KeptSegment::name() returns this very pointer: no string comparison per array.)
bool is_kept_segment(const mx::array& a) {
  return a.has_primitive() && a.primitive().name() == static_cast<const char*>(kKeptSegment.data());
}

// The elements an array's primitive computes, for the walk's size rule: a decode step's attention
// writes only its presents' new rows (over its pasts' buffers), so its size is its output's alone,
// and a Contiguous of an EP kernel's (row-major) result shares its buffer.
size_t work_elements(const mx::array& a) {
  const std::string_view name = a.primitive().name();
  if (name == "DecodeGqa") return a.outputs()[0].size();
  if (is_kept_segment(a)) return 0;  // its own walk was one the rule allowed
  if (name == "Contiguous" && a.inputs().size() == 1 && a.inputs()[0].has_primitive() &&
      ops::is_cpu_kernel(a.inputs()[0].primitive().name()))
    return 0;
  return a.size();
}

// An EP kernel reading an input of more elements than the caller's rule allows (a one-row
// product's weight): its output may be small, but it may split its work over the OpenMP threads,
// and regions opened from the caller make a second team, whose workers then sleep between
// regions (each product of a decode step waking one).
bool reads_large_input(const mx::array& a) {
  for (const auto& in : a.inputs())  // (the sizes first: the name is a string lookup)
    if (in.size() > kCallerMaxElements) return ops::is_cpu_kernel(a.primitive().name());
  return false;
}

}  // namespace

bool evaluate_on_caller(const std::vector<mx::array>& outs, mx::Stream s, bool hold,
                        std::chrono::microseconds poll_for, bool stream_thread, bool large, bool one_thread) {
  // The arrays still to compute, inputs before the arrays that read them (siblings, the other
  // outputs of one primitive, once).
  std::vector<mx::array> tape;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<mx::array, bool>> stack;
  bool on_caller = true;
  size_t total_elements = 0;
  bool convolutions = false;  // oneDNN's primitives among the arrays
  for (const auto& o : outs) stack.emplace_back(o, false);
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (expanded) {
      tape.push_back(std::move(a));
      continue;
    }
    if (!pending(a) || !seen.insert(a.id()).second) continue;
    for (const auto& sib : a.siblings()) seen.insert(sib.id());
    total_elements += work_elements(a);
    if (is_kept_segment(a)) {
      on_caller = on_caller && static_cast<const KeptSegment&>(a.primitive()).on_caller();
    } else {
      const bool dnnl = std::string_view(a.primitive().name()).substr(0, 4) == "Dnnl";
      convolutions = convolutions || dnnl;
      on_caller = on_caller && a.size() <= kCallerMaxElements && !dnnl && (one_thread || !reads_large_input(a));
    }
    stack.emplace_back(a, true);
    for (const auto& in : a.inputs())
      if (pending(in) && !seen.count(in.id())) stack.emplace_back(in, false);
  }
  if (tape.empty()) return true;
  // Kernels over large arrays gain little from the walk, and lose MLX's overlap of the caller
  // queueing the next primitive while the stream thread computes one; a convolutional graph's
  // (`large`: cpu_walk_large) is still walked, so that its walk is kept: then a run is its
  // kernels alone, with no graph to build and no MLX bookkeeping of each array.
  if (!on_caller && !(large && convolutions) && total_elements > kWalkMaxMeanElements * tape.size()) return false;
  const bool keep = std::exchange(tl_keep_next, false);
  const auto counts = run_walk([&] { return walk(tape, !keep); }, on_caller && !stream_thread, s, hold, poll_for);
  g_left.fetch_add(counts.second, std::memory_order_relaxed);
  if (keep && !counts.second) tl_kept = std::shared_ptr<KeptWalk>(new KeptWalk(std::move(tape), outs, on_caller, s));
  if (counts.second) return false;
  for (const auto& o : outs)
    if (!ready(o)) return false;
  return true;
}

void keep_next_walk() { tl_keep_next = true; }
std::shared_ptr<KeptWalk> take_kept_walk() {
  tl_keep_next = false;
  return std::exchange(tl_kept, nullptr);
}

KeptWalk::KeptWalk(std::vector<mx::array> tape, std::vector<mx::array> outs, bool on_caller, mx::Stream s)
    : tape_(std::move(tape)), outs_(std::move(outs)), on_caller_(on_caller), stream_(s) {
  kinds_.reserve(tape_.size());
  for (const auto& a : tape_) {
    kinds_.push_back(static_cast<uint8_t>(kind_of(a.primitive().name())));
    if (static_cast<Kind>(kinds_.back()) == Kind::Mlx) mlx_elements_ += a.size();
  }
  // Each large array's last reader among the steps (its own step when none reads it); the
  // outputs are read after the run and stay.
  std::unordered_map<std::uintptr_t, std::pair<uint32_t, uint32_t>> step_of;  // id -> (step, output)
  std::unordered_map<std::uintptr_t, size_t> last_read;
  std::unordered_set<std::uintptr_t> outputs;
  for (const auto& o : outs_) outputs.insert(o.id());
  for (size_t i = 0; i < tape_.size(); ++i) {
    for (const auto& in : tape_[i].inputs())
      if (step_of.count(in.id())) last_read[in.id()] = i;
    const auto outs = tape_[i].outputs();
    for (size_t k = 0; k < outs.size(); ++k) {
      bytes_ += outs[k].nbytes();
      if (outs[k].nbytes() < kReleaseMinBytes || outputs.count(outs[k].id())) continue;
      step_of[outs[k].id()] = {static_cast<uint32_t>(i), static_cast<uint32_t>(k)};
      last_read[outs[k].id()] = i;
    }
  }
  release_after_.resize(tape_.size());
  for (const auto& [id, at] : step_of) {
    release_after_[last_read[id]].push_back(at);
    bytes_ -= tape_[at.first].outputs()[at.second].nbytes();
  }
}

std::optional<std::vector<mx::array>> KeptWalk::replay(std::vector<mx::array>& kept_args,
                                                       const std::vector<mx::array>& args, bool hold,
                                                       std::chrono::microseconds poll_for) {
  if (!repoint(kept_args, args)) return std::nullopt;
  // The kept arrays stay available and attached: the same walk, over the new data.
  const auto counts = run_walk(
      [this] {
        ops::ReuseOutputsScope reuse;  // the same arrays again: their own buffers where nothing else holds them
        return walk(tape_, /*detach=*/false, &kinds_, &release_after_);
      },
      on_caller_, stream_, hold, poll_for);
  if (counts.second) return std::nullopt;
  g_replays.fetch_add(1, std::memory_order_relaxed);
  // Arrays of their own over this run's buffers: the next replay points the kept ones at new
  // buffers, while ORT may still be reading these.
  return shared_outputs();
}

void KeptWalk::let_go_of_small_outputs() {
  for (auto& k : outs_)
    if (k.has_primitive() && k.nbytes() < device_buffers::kPoolMinBytes && k.data_shared_ptr()) point_at_nothing(k);
}

std::vector<mx::array> KeptWalk::shared_outputs() const {
  std::vector<mx::array> outs;
  outs.reserve(outs_.size());
  for (const auto& o : outs_) {
    mx::array r(o.shape(), o.dtype(), nullptr, {});
    r.copy_shared_buffer(o);
    r.set_status(mx::array::Status::available);
    outs.push_back(std::move(r));
  }
  return outs;
}

bool KeptWalk::repoint(std::vector<mx::array>& kept_args, const std::vector<mx::array>& args) {
  if (kept_args.size() != args.size()) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (kept_args[i].id() == args[i].id()) continue;  // a constant: the same array every run
    if (kept_args[i].shape() != args[i].shape() || kept_args[i].dtype() != args[i].dtype()) return false;
    kept_args[i].copy_shared_buffer(args[i]);
  }
  return true;
}

bool KeptWalk::compute_here(std::vector<mx::array>& kept_args, const std::vector<mx::array>& args) {
  if (!repoint(kept_args, args)) return false;
  ops::ReuseOutputsScope reuse;
  return walk(tape_, /*detach=*/false, &kinds_, &release_after_).second == 0;
}

std::vector<mx::array> kept_segment(const std::shared_ptr<SegmentWalk>& walk, const std::vector<mx::array>& inputs,
                                    mx::Stream s) {
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  for (const auto& o : walk->walk->outputs()) {
    shapes.push_back(o.shape());
    dtypes.push_back(o.dtype());
  }
  return mx::array::make_arrays(std::move(shapes), dtypes, std::make_shared<KeptSegment>(s, walk), inputs);
}

namespace {
// When the graph of `outs` holds kept segments still to compute: the arrays still to compute
// that they read and that no such segment precedes (what MLX may evaluate for them); else none.
std::optional<std::vector<mx::array>> kept_segment_frontier(const std::vector<mx::array>& outs) {
  // Depth-first, inputs first: whether each pending array has a pending kept segment at or above it.
  std::unordered_map<std::uintptr_t, bool> above;
  std::vector<std::pair<mx::array, bool>> stack;
  for (const auto& o : outs) stack.emplace_back(o, false);
  std::vector<mx::array> frontier;
  std::unordered_set<std::uintptr_t> taken;
  bool any = false;
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (!pending(a)) continue;
    if (!expanded) {
      if (above.count(a.id())) continue;
      above.emplace(a.id(), false);
      stack.emplace_back(a, true);
      for (const auto& in : a.inputs())
        if (pending(in) && !above.count(in.id())) stack.emplace_back(in, false);
      continue;
    }
    const bool segment = is_kept_segment(a);
    bool up = segment;
    for (const auto& in : a.inputs())
      if (pending(in)) up = up || above[in.id()];
    above[a.id()] = up;
    if (!segment) continue;
    any = true;
    for (const auto& in : a.inputs())
      if (pending(in) && !above[in.id()] && taken.insert(in.id()).second) frontier.push_back(in);
  }
  if (!any) return std::nullopt;
  return frontier;
}
}  // namespace

std::optional<mx::array> kept_segment_source(const mx::array& a) {
  if (!is_kept_segment(a) || a.is_available()) return std::nullopt;
  const auto& kept = static_cast<const KeptSegment&>(a.primitive()).kept_outputs();
  const auto outs = a.outputs();
  for (size_t i = 0; i < outs.size() && i < kept.size(); ++i)
    if (outs[i].id() == a.id()) return kept[i];
  return std::nullopt;
}

bool evaluate_with_kept_segments(const std::vector<mx::array>& outs, mx::Stream s, bool hold,
                                 std::chrono::microseconds poll_for, bool stream_thread) {
  // Each pass computes at least the frontier: a graph of n kept segments takes at most n + 1.
  for (;;) {
    if (evaluate_on_caller(outs, s, hold, poll_for, stream_thread)) return true;
    auto frontier = kept_segment_frontier(outs);
    if (!frontier) return false;
    if (frontier->empty()) throw KeptSegmentMiss("a kept segment could not be walked");
    mx::eval(*frontier);
  }
}

uint64_t caller_eval_replays() { return g_replays.load(std::memory_order_relaxed); }
uint64_t caller_eval_released() { return g_released.load(std::memory_order_relaxed); }

uint64_t caller_eval_arrays() { return g_arrays.load(std::memory_order_relaxed); }
uint64_t caller_eval_stream_arrays() { return g_stream_arrays.load(std::memory_order_relaxed); }
uint64_t caller_eval_left() { return g_left.load(std::memory_order_relaxed); }

}  // namespace ortmlx::engine
