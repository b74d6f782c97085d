// Shape families (shape_family.h): what a translation records of each step, how two new
// signatures' steps become compiled segments (ShapeFamily), and a piecewise run (Program).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_set>

#include "engine/caller_eval.h"
#include "engine/index_check.h"
#include "engine/program.h"
#include "engine/program_run.h"
#include "trace/trace.h"

namespace ortmlx::engine {

void ShapeFamily::record_step(size_t k, const StepIO& io, const Slots& slots, bool host_step,
                          bool read_host, StepInfos& infos) {
  if (infos.size() <= k) infos.resize(k + 1);
  StepInfo& info = infos[k];
  info.host = host_step;
  info.fixed = !host_step && !read_host && io.bodies.empty();
  info.shapes.clear();
  for (const auto* list : {&io.in, &io.out})
    for (int sl : *list) {
      if (sl < 0) { info.shapes.push_back({-1}); continue; }
      const ops::Value& v = *slots[sl];
      if (!v.is_tensor()) { info.fixed = false; info.shapes.push_back({-2}); continue; }
      info.shapes.push_back(v.tensor->shape());
    }
}

// A topological order of the plan's steps in which each fixed step is taken as soon as its
// inputs are there and the others as late as possible (Kahn's algorithm, fixed steps first, each
// kind in plan order). An exported decoder layer interleaves its products and rotary nodes with
// the shape arithmetic of the attention (folded on the host, so not fixed); in plan order those
// cut a layer's products into three segments. The option step_order=0 keeps the plan's order.
std::vector<size_t> ShapeFamily::step_order(const Plan& p, const std::function<bool(size_t)>& fixed,
                                        bool reorder) {
  const size_t n = p.steps.size();
  auto plan_order = [n] {
    std::vector<size_t> o(n);
    std::iota(o.begin(), o.end(), size_t{0});
    return o;
  };
  if (!reorder) return plan_order();
  std::vector<size_t> order;
  order.reserve(n);
  std::vector<int> producer(p.num_slots, -1);
  for (size_t k = 0; k < n; ++k)
    for (int sl : p.steps[k].out)
      if (sl >= 0) producer[static_cast<size_t>(sl)] = static_cast<int>(k);
  std::vector<std::vector<size_t>> users(n);
  std::vector<size_t> waiting(n, 0);
  for (size_t k = 0; k < n; ++k) {
    std::vector<int> deps;
    auto need = [&](int sl) {
      if (sl >= 0 && producer[static_cast<size_t>(sl)] >= 0) deps.push_back(producer[static_cast<size_t>(sl)]);
    };
    for (int sl : p.steps[k].in) need(sl);
    for (const auto& body : p.steps[k].bodies)
      for (int sl : body.second) need(sl);
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    waiting[k] = deps.size();
    for (int d : deps) users[static_cast<size_t>(d)].push_back(k);
  }
  std::set<size_t> ready_fixed, ready_other;
  auto ready = [&](size_t k) { (fixed(k) ? ready_fixed : ready_other).insert(k); };
  for (size_t k = 0; k < n; ++k)
    if (waiting[k] == 0) ready(k);
  while (!ready_fixed.empty() || !ready_other.empty()) {
    auto& from = ready_fixed.empty() ? ready_other : ready_fixed;
    const size_t k = *from.begin();
    from.erase(from.begin());
    order.push_back(k);
    for (size_t u : users[k])
      if (--waiting[u] == 0) ready(u);
  }
  return order.size() == n ? order : plan_order();  // (a plan has no cycle; were there one)
}

void ShapeFamily::observe(const Plan& p, const Layout& layout, mx::Device device, StepInfos steps,
                          const IsConstant& is_constant) {
  if (last_steps_ && last_steps_->first == layout) {
    family_ = find(p, last_steps_->second, steps, is_constant);
    if (family_) {
      family_->layout = layout;
      family_->device = device;
    }
  }
  if (family_)
    last_steps_.reset();
  else
    last_steps_.emplace(layout, std::move(steps));
}

std::unique_ptr<ShapeFamily::Piecewise> ShapeFamily::find(const Plan& p, const StepInfos& a,
                                                          const StepInfos& b,
                                                          const IsConstant& is_constant) const {
  if (a.size() != p.steps.size() || b.size() != p.steps.size()) return nullptr;
  // A segment of one step saves its translation but fuses nothing: not worth a compile.
  constexpr size_t kMinSegmentSteps = 2;
  // (Zero-size values stay eager: the GPU runs those graphs on the CPU stream, see Entry.)
  auto stays = [&](size_t k) {
    if (!a[k].fixed || !b[k].fixed || a[k].shapes != b[k].shapes) return false;
    for (const auto& shape : a[k].shapes)
      if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return false;
    return true;
  };
  if (log_level_ >= 2)
    for (size_t k = 0; k < p.steps.size(); ++k)
      if (!stays(k))
        std::cerr << "[MLX EP] " << where_ << ": shape family: " << p.graph->nodes[k].describe()
                  << " stays eager ("
                  << (!a[k].fixed || !b[k].fixed ? "reads a host value, runs a subgraph or takes "
                                                   "a sequence"
                                                 : "its shapes change")
                  << ")\n";
  auto pw = std::make_unique<Piecewise>();
  pw->order = step_order(p, stays, step_order_);
  const auto& order = pw->order;
  const size_t n = order.size();
  // The last position that reads each slot (its bodies' outer values included), and the group's
  // outputs: a segment returns what is read after it.
  std::vector<size_t> last_read(p.num_slots, 0);
  std::vector<uint8_t> group_output(p.num_slots, 0);
  for (size_t j = 0; j < n; ++j) {
    for (int sl : p.steps[order[j]].in)
      if (sl >= 0) last_read[static_cast<size_t>(sl)] = j;
    for (const auto& body : p.steps[order[j]].bodies)
      for (int sl : body.second) last_read[static_cast<size_t>(sl)] = j;
  }
  for (int sl : p.output_slots) group_output[static_cast<size_t>(sl)] = 1;
  size_t fixed_steps = 0;
  for (size_t k = 0; k < n;) {
    if (!stays(order[k])) { ++k; continue; }
    size_t e = k;
    while (e < n && stays(order[e])) ++e;
    if (e - k >= kMinSegmentSteps) {
      Segment seg;
      seg.begin = k;
      seg.end = e;
      std::unordered_set<int> produced, taken;
      for (size_t j = k; j < e; ++j) {
        const auto& io = p.steps[order[j]];
        for (size_t i = 0; i < io.in.size(); ++i) {
          int sl = io.in[i];
          // Constants are not arguments: the trace reads them as they are (see Run).
          if (sl < 0 || produced.count(sl) || is_constant(sl) || !taken.insert(sl).second)
            continue;
          seg.in_slots.push_back(sl);
          seg.in_shapes.push_back(a[order[j]].shapes[i]);
        }
        for (int sl : io.out)
          if (sl >= 0) produced.insert(sl);
      }
      // Outputs: what later steps (or their bodies) read, and the group's outputs.
      for (size_t j = k; j < e; ++j)
        for (int sl : p.steps[order[j]].out)
          if (sl >= 0 && (group_output[static_cast<size_t>(sl)] || last_read[static_cast<size_t>(sl)] >= e))
            seg.out_slots.push_back(sl);
      fixed_steps += e - k;
      pw->segments.push_back(std::move(seg));
    }
    k = e;
  }
  // Two signatures that share only a few steps (a prompt, then the first decode step) are not
  // a family: keep looking (the next pair is two decode steps).
  // Host steps (folds, Shape) do no MLX work: the quarter is of the steps that do, so that
  // folding more of a graph on the host does not turn a family away.
  size_t device_steps = 0;
  for (size_t k = 0; k < p.steps.size(); ++k) device_steps += !(a[k].host && b[k].host);
  if (pw->segments.empty() || fixed_steps * 4 < device_steps) return nullptr;
  if (log_level_ >= 1)
    std::cerr << "[MLX EP] " << where_ << ": shape family: " << pw->segments.size()
              << " compiled segment(s) over " << fixed_steps << " of " << p.steps.size()
              << " steps, the rest eager\n";
  return pw;
}

Program::SegmentFn Program::segment_function(const Segment& seg, const std::vector<size_t>& order,
                                             mx::Stream s) {
  // The segment's steps over placeholders for its inputs: fixed steps read no host value but
  // constants, which the trace's slots hold as themselves.
  return mx::compile(
      [this, b = seg.begin, e = seg.end, ins = seg.in_slots, outs = seg.out_slots,
       steps = std::vector<size_t>(order.begin() + static_cast<std::ptrdiff_t>(seg.begin),
                                   order.begin() + static_cast<std::ptrdiff_t>(seg.end)),
       s](const std::vector<mx::array>& xs) {
        const Plan& p = *top_;
        Slots slots(p.num_slots);
        std::vector<Taint> none(p.num_slots);
        for (size_t i = 0; i < p.num_inputs; ++i)
          if (is_constant_slot(p, static_cast<int>(i)))
            slots[i] = ops::Value::of(constants_[i - input_names_.size()]);
        for (size_t i = 0; i < ins.size(); ++i) slots[ins[i]] = ops::Value::of(xs[i]);
        HostRecord empty;
        Run trace(Mode::Replay, &empty, nullptr, s, nullptr);
        trace.direct_constants = true;
        run_steps(p, slots, none, trace, 0, e - b, &steps);
        std::vector<mx::array> r;
        for (int o : outs) {
          if (!slots[o] || !slots[o]->is_tensor())
            throw std::runtime_error("[engine] a segment's output is not a tensor");
          r.push_back(*slots[o]->tensor);
        }
        index_check::append_flag(r, trace.index_flags, s);  // one more output, past `outs`
        return r;
      },
      /*shapeless=*/false);
}

namespace {
// cpu_caller_replay: a segment's walk is kept from its kSegmentWalkAfterCalls-th compiled call,
// when its arrays hold at most kSegmentWalkMaxBytes (held between runs); a segment whose walks
// were left unfinished twice keeps the compiled call.
constexpr int kSegmentWalkAfterCalls = 3;
constexpr int kSegmentWalkTries = 2;
constexpr size_t kSegmentWalkMaxBytes = size_t{64} << 20;
}  // namespace

void Program::keep_segment_walk(Segment& seg, const std::vector<mx::array>& in, std::vector<mx::array>& outs,
                                mx::Stream s) {
  ++seg.walk_tries;
  // The steps before it first, so that the walk kept holds the segment's own arrays alone. Both
  // walks on the stream thread, where the run's walk computes its kernels: a kernel's parallel
  // work started from a second thread makes OpenMP a second team of workers, and with more
  // workers than cores they sleep between regions from then on.
  std::vector<mx::array> inputs = in;
  if (!evaluate_with_kept_segments(inputs, s, false, std::chrono::microseconds(0), /*stream_thread=*/true))
    mx::eval(inputs);
  std::vector<mx::array> todo = outs;
  keep_next_walk();
  const bool all = evaluate_on_caller(todo, s, false, std::chrono::microseconds(0), /*stream_thread=*/true);
  auto walk = take_kept_walk();
  if (!all) mx::eval(todo);
  if (!walk || walk->bytes() > kSegmentWalkMaxBytes) return;
  seg.walk = std::make_shared<SegmentWalk>(SegmentWalk{std::move(walk), in});
  seg.walk_stream = s.index;
  // The run goes on with arrays of their own over the kept outputs' buffers: MLX's evaluation
  // detaches the evaluated arrays it meets, and must never meet the kept ones.
  outs = seg.walk->walk->shared_outputs();
  seg.walk->walk->let_go_of_small_outputs();
}

std::vector<mx::array> Program::run_piecewise(Piecewise& pw, const std::vector<mx::array>& args,
                                              const Layout& layout, mx::Stream s, bool walks, bool& walked) {
  const auto t0 = std::chrono::steady_clock::now();
  trace::Span span("phase", "build graph");
  if (span.active()) span.arg("mode", "shape family");
  const Plan& p = *top_;
  Run run(Mode::Eager, nullptr, nullptr, s, &stats_);
  run.direct_constants = true;
  std::vector<ops::Value> values;
  std::vector<Taint> taints;
  input_values(args, layout, values, taints);
  Slots slots(p.num_slots);
  std::vector<Taint> taint(p.num_slots);  // unused: eager runs track no taint
  for (size_t i = 0; i < p.num_inputs; ++i) slots[i] = std::move(values[i]);

  bool matched = false;
  size_t next = 0;
  walked = false;
  walks = walks && !pw.walks_missed && !opt_.gpu && s.device == mx::Device::cpu && opt_.cpu_caller_eval &&
          opt_.cpu_caller_replay;
  // A segment's outputs into their slots; one more output past them is its index-check flag.
  auto take_outputs = [&](const Segment& seg, const std::vector<mx::array>& outs) {
    for (size_t j = 0; j < seg.out_slots.size(); ++j) slots[seg.out_slots[j]] = ops::Value::of(outs.at(j));
    if (outs.size() > seg.out_slots.size()) run.index_flags.push_back(outs.back());
    matched = true;
  };
  for (auto& seg : pw.segments) {
    run_steps(p, slots, taint, run, next, seg.begin, &pw.order);
    next = seg.end;
    std::vector<mx::array> in;
    bool match = !seg.broken;
    for (size_t i = 0; match && i < seg.in_slots.size(); ++i) {
      const auto& v = slots[seg.in_slots[i]];
      match = v && v->is_tensor() && v->tensor->shape() == seg.in_shapes[i];
      if (match) in.push_back(*v->tensor);
    }
    if (match && walks && seg.walk && seg.walk_stream == s.index) {
      run.kept_segments = true;
      take_outputs(seg, kept_segment(seg.walk, in, s));
      ++stats_.segment_walks;
      walked = true;
      continue;
    }
    auto fn = seg.fns.find(s.index);
    if (match && fn == seg.fns.end()) {
      fn = seg.fns.emplace(s.index, segment_function(seg, pw.order, s)).first;
      ++stats_.segment_traces;
    }
    if (match) {
      std::optional<std::vector<mx::array>> outs;
      try {
        // With cpu_caller_eval, MLX's own ops (which the walk computes) instead of generated kernels
        // (which it cannot), unless the user chose fusion.
        CompiledCallScope call(s.device == mx::Device::cpu &&
                               (opt_.cpu_fuse == 0 || (opt_.cpu_fuse == 2 && opt_.cpu_caller_eval)));
        outs = fn->second(in);
      } catch (const std::exception& ex) {
        // A trace the steps cannot take (a translator that reads data while tracing): this
        // segment runs eagerly from now on; the eager run below reports a real input error.
        seg.broken = true;
        seg.fns.clear();
        if (opt_.log_level >= 1)
          std::cerr << "[MLX EP] " << where_ << ": segment of steps " << seg.begin << "-" << seg.end
                    << " runs eagerly: " << ex.what() << "\n";
      }
      if (outs) {
        if (walks && !seg.walk && seg.walk_tries < kSegmentWalkTries && ++seg.calls >= kSegmentWalkAfterCalls)
          keep_segment_walk(seg, in, *outs, s);
        take_outputs(seg, *outs);
        ++stats_.segment_calls;
        continue;
      }
    }
    run_steps(p, slots, taint, run, seg.begin, seg.end, &pw.order);
  }
  run_steps(p, slots, taint, run, next, p.steps.size(), &pw.order);
  pw.misses = matched ? 0 : pw.misses + 1;
  std::vector<ops::Value> outs;
  outs.reserve(p.output_slots.size());
  for (int sl : p.output_slots) {
    if (!slots[sl]) throw std::logic_error("[engine] an output nothing produced (slot " + std::to_string(sl) + ")");
    outs.push_back(*slots[sl]);
  }
  auto result = finish_outputs(std::move(outs), s);
  index_check::append_flag(result, run.index_flags, s);
  stats_.translate_ns += elapsed_ns(t0);
  return result;
}

}  // namespace ortmlx::engine
