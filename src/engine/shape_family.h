// A shape family (a decode loop: every step a new signature, because the KV cache grows).
// Two consecutive new signatures are compared step by step: the stretches of fixed steps
// whose shapes did not change (a layer's norms, projections and MLP) become segments, each
// run through its own mx::compile'd function, keyed by the segment's input shapes; the steps
// in between (attention over the growing cache, what reads host values) are translated
// eagerly, as before. Correct for any signature: a segment is a function of its input shapes
// only (fixed steps), and one whose shapes differ from the family's runs eagerly.
//
// ShapeFamily holds what a fused program knows of its family (the last new signature's steps,
// the family found) and finds it; the program runs it (Program::run_piecewise, shape_family.cc).
// Engine-private.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "engine/caller_eval.h"
#include "engine/plan.h"

namespace ortmlx::engine {

class ShapeFamily {
 public:
  // What a translation saw of one step of the group: `fixed` when the step read no host value
  // but constant initializers, runs no subgraph, and takes and gives tensors only, so that its
  // MLX graph is a function of its input shapes alone.
  struct StepInfo {
    bool fixed = true;
    bool host = false;  // a host fold or a Shape/Size: no MLX work (not fixed either)
    std::vector<mx::Shape> shapes;  // its inputs' then its outputs' ({-1}: absent, {-2}: not a tensor)
  };
  using StepInfos = std::vector<StepInfo>;
  using SegmentFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;
  struct Segment {
    size_t begin = 0, end = 0;           // positions in Piecewise::order
    std::vector<int> in_slots, out_slots;
    std::vector<mx::Shape> in_shapes;    // the family's: other shapes run eagerly
    // One compiled function per MLX stream (each thread has its own default stream).
    std::unordered_map<int, SegmentFn> fns;
    bool broken = false;                 // a trace failed: eager from then on
    // cpu_caller_replay: the walk of one of its runs, kept (on stream `walk_stream`), which later
    // runs compute again in place of the compiled call's graph (caller_eval.h, kept_segment).
    std::shared_ptr<SegmentWalk> walk;
    int walk_stream = -1;
    int calls = 0, walk_tries = 0;
  };
  struct Piecewise {
    // The order the family's runs take the steps in (a topological order of the plan): steps
    // that stay fixed are taken as early as their inputs allow, so that the steps in between
    // (host folds, shape-changing attention) do not cut them into more segments than needed.
    std::vector<size_t> order;
    Layout layout;
    mx::Device device = mx::Device::cpu;
    std::vector<Segment> segments;
    int misses = 0;  // consecutive runs in which no segment matched its shapes
    bool walks_missed = false;  // a run of kept segments could not be walked: none are kept again
  };
  // Whether a slot of the plan holds a constant initializer (not a segment argument).
  using IsConstant = std::function<bool(int slot)>;

  // step_order: the option (false: the family's runs take the plan's order). `where` names
  // the fused node in log lines.
  ShapeFamily(bool step_order, int log_level, std::string where)
      : step_order_(step_order), log_level_(log_level), where_(std::move(where)) {}

  // The family that runs of `layout` on `device` belong to, or null.
  Piecewise* member(const Layout& layout, mx::Device device) {
    return family_ && family_->layout == layout && family_->device == device ? family_.get() : nullptr;
  }
  // After a run of the family: it is dropped when no segment matched for a while (then new
  // signatures are compared again).
  void after_run() {
    if (family_ && family_->misses >= 4) family_.reset();
  }
  // Whether new signatures' steps are wanted (no family yet).
  bool looking() const { return !family_; }
  // A new signature's steps, as its translation saw them (one per step of `p`): compared with
  // the previous new signature's of the same layout, else kept for the next.
  void observe(const Plan& p, const Layout& layout, mx::Device device, StepInfos steps,
               const IsConstant& is_constant);

  // What a translation records of step k (translation.cc calls it for every step it takes).
  static void record_step(size_t k, const StepIO& io, const Slots& slots, bool host_step,
                          bool read_host, StepInfos& infos);
  // A topological order of the plan's steps in which each fixed step is taken as soon as its
  // inputs are there and the others as late as possible; the plan's own order unless `reorder`.
  static std::vector<size_t> step_order(const Plan& p, const std::function<bool(size_t)>& fixed,
                                        bool reorder);
  // The family of two new signatures' steps `a` and `b` of `p`, or null when they share too
  // little to be one (no segment of two steps, or fixed steps under a quarter of the steps that
  // do MLX work).
  std::unique_ptr<Piecewise> find(const Plan& p, const StepInfos& a, const StepInfos& b,
                                  const IsConstant& is_constant) const;

 private:
  bool step_order_;
  int log_level_;
  std::string where_;
  std::unique_ptr<Piecewise> family_;
  std::optional<std::pair<Layout, StepInfos>> last_steps_;  // the last new signature's steps
};

}  // namespace ortmlx::engine
