// Internal to the engine (program.cc, shape_family.cc): the state of one translation of a
// fused group, and the two helpers it needs. Not part of the engine's interface.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "engine/program.h"
#include "trace/trace.h"

namespace ortmlx::engine {

// An evaluated, row-contiguous array's data in a buffer of its own.
inline mx::array owned_copy(const mx::array& a) {
  auto data = mx::allocator::malloc(std::max<size_t>(a.nbytes(), 1));
  if (a.nbytes()) std::memcpy(data.buffer().raw_ptr(), a.data<void>(), a.nbytes());
  return mx::array(std::move(data), a.shape(), a.dtype());
}

inline uint64_t elapsed_ns(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - t0).count());
}

// Around every call of one of the EP's compiled functions. With `unfused`, the call traces
// (if it traces) with elementwise chains kept as MLX's own ops (CompileMode::no_fuse) instead of
// generated kernels: on MLX's CPU device a generated kernel runs one element at a time, with
// per-element index arithmetic where its operands broadcast, and can be slower than the separate
// vectorized ops (option cpu_fuse). The mode is process-wide and read when a function is traced,
// so an unfused call holds the EP's compile lock exclusively and every other call shares it: no
// other session's trace inherits the mode (a thread already inside a call takes no lock again).
// Left alone when the user disabled compilation (MLX_DISABLE_COMPILE), which this would undo.
class CompiledCallScope {
 public:
  explicit CompiledCallScope(bool unfused);
  ~CompiledCallScope();
  CompiledCallScope(const CompiledCallScope&) = delete;
  CompiledCallScope& operator=(const CompiledCallScope&) = delete;

 private:
  bool on_;
  bool locked_;
};

// State of one translation of the group (a probe, an eager run, or a compile trace).
struct Program::Run {
  Mode mode;
  HostRecord* record;             // Probe: filled in read order; Replay: read back in order
  std::vector<int>* host_deps;    // Probe only: the taint of every host read
  mx::Stream s;
  size_t next_read = 0;
  // Probe only: the taint of the group's values, of bodies' outputs and of what hooks were
  // handed, by array id. Arrays a translator builds between body runs (a Scan slice, a Loop
  // counter, a stack of scan outputs) are traced back through their MLX inputs to known ones.
  // Holding the array keeps its id from being reused. (Values inside a body are not kept: a
  // translator only ever sees a body's outputs.)
  std::unordered_map<std::uintptr_t, std::pair<mx::array, Taint>> lineage;

  Stats* stats = nullptr;
  // Values known on the host (Shape/Size outputs, nodes folded by engine/host_fold/host_fold.h), by array id;
  // holding the array keeps its id from being reused within the run.
  std::unordered_map<std::uintptr_t, mx::array> host_known;

  Run(Mode m, HostRecord* r, std::vector<int>* deps, mx::Stream st, Stats* st_)
      : mode(m), record(r), host_deps(deps), s(st), stats(st_) {}

  bool tracking() const { return host_deps != nullptr; }

  void note(const mx::array& a, const Taint& t) {
    if (tracking()) lineage.try_emplace(a.id(), a, t);
  }
  // A sequence's items are noted one by one (a translator sees and builds on the arrays).
  void note(const ops::Value& v, const Taint& t) {
    if (v.is_tensor()) note(*v.tensor, t);
    for (const auto& a : v.items) note(a, t);
  }

  // EngineHooks::translation_memo: results by key and the ids of the arrays they derive from,
  // with those arrays held (their ids stay unique within the run).
  struct MemoEntry {
    std::vector<mx::array> of, result;
  };
  std::map<std::pair<std::string, std::vector<std::uintptr_t>>, MemoEntry> memo;

  // Run-time index checks of this translation (engine/index_check.h), one scalar each.
  std::vector<mx::array> index_flags;

  StepInfos* steps = nullptr;  // the group's steps, as this translation saw them (optional)
  size_t read_calls = 0;       // host reads asked for (deduplicated ones too) ...
  size_t constant_reads = 0;   // ... of which reads of the group's constant initializers
  // Piecewise runs and segment traces: a constant initializer read on the host is read
  // directly (it holds the constant itself there, never a tracer), not recorded.
  bool direct_constants = false;
  // The graph may hold kept segments (a shape family's run), which only a walk computes: host
  // reads evaluate by walking (caller_eval.h).
  bool kept_segments = false;

  Taint taint_of(const mx::array& a) {
    if (auto it = lineage.find(a.id()); it != lineage.end()) return it->second.second;
    Taint t;
    // A leaf without a known id is a constant the translator made (its data came from host
    // reads at most, and those already recorded their own taint).
    if (a.has_primitive())
      for (const auto& in : a.inputs()) {
        auto ti = taint_of(in);
        t.insert(t.end(), ti.begin(), ti.end());
      }
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    lineage.try_emplace(a.id(), a, t);
    return t;
  }

  // Host reads of this run by the array read (which they keep alive, so ids stay unique): the
  // same value read again (total_sequence_length by every attention layer) is not synced again.
  // Replays dedupe the same way, so they consume the record in the probe's order.
  std::unordered_map<std::uintptr_t, std::pair<mx::array, mx::array>> reads;

  // A constant initializer's data (direct_constants runs): the array itself, already evaluated
  // in the program's constants; no record, no sync.
  mx::array read_constant(const mx::array& c) {
    ++read_calls;
    if (c.is_available() && c.flags().row_contiguous) return c;
    mx::array a = mx::contiguous(c, false, s);
    a.eval();
    return a;
  }

  // A host read: evaluated and recorded (probe), evaluated (eager), or the recorded value.
  mx::array read(const mx::array& v, const Taint& t) {
    ++read_calls;
    if (auto it = reads.find(v.id()); it != reads.end()) return it->second.second;
    mx::array a = read_once(v, t);
    reads.try_emplace(v.id(), v, a);
    return a;
  }

  mx::array read_once(const mx::array& v, const Taint& t) {
    if (mode == Mode::Replay) {
      if (next_read >= record->size())
        throw std::runtime_error("[engine] replay read a host value the probe did not record");
      const mx::array& a = (*record)[next_read++];
      if (a.shape() != v.shape() || a.dtype() != v.dtype())
        throw std::runtime_error("[engine] replay's host read differs from the probe's");
      return a;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // Already on the host (a Shape, a folded value, a borrowed input): no evaluation, no sync.
    const bool ready = v.is_available() && v.flags().row_contiguous;
    mx::array a = ready ? v : mx::contiguous(v, false, s);
    if (!ready) {
      trace::Span span("phase", "host read");
      if (!kept_segments ||
          !evaluate_with_kept_segments({a}, s, false, std::chrono::microseconds(0), /*stream_thread=*/true))
        a.eval();
    }
    if (stats && !ready) {
      stats->host_reads++;
      stats->host_read_ns += elapsed_ns(t0);
    }
    if (host_deps) host_deps->insert(host_deps->end(), t.begin(), t.end());
    // A recorded value outlives the run, and `a` may share a borrowed input's buffer
    // (contiguous() of a contiguous array is a view): keep an owned copy.
    if (record) record->push_back(owned_copy(a));
    return a;
  }
};

}  // namespace ortmlx::engine
