// Shape families (program.h, Program::Piecewise): what a translation records of each step,
// how two new signatures' steps become compiled segments, and a piecewise run.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <unordered_set>

#include "engine/program.h"
#include "engine/program_run.h"

namespace ortmlx::engine {

void Program::record_step(size_t k, const StepIO& io, const Slots& slots, bool host_step,
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

std::unique_ptr<Program::Piecewise> Program::find_family(const StepInfos& a,
                                                        const StepInfos& b) const {
  const Plan& p = *top_;
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
  if (opt_.log_level >= 2)
    for (size_t k = 0; k < p.steps.size(); ++k)
      if (!stays(k))
        std::cerr << "[MLX EP] " << where_ << ": shape family: " << p.graph->nodes[k].describe()
                  << " stays eager ("
                  << (!a[k].fixed || !b[k].fixed ? "reads a host value, runs a subgraph or takes "
                                                   "a sequence"
                                                 : "its shapes change")
                  << ")\n";
  // The last step that reads each slot (its bodies' outer values included), and the group's
  // outputs: a segment returns what is read after it.
  std::vector<size_t> last_read(p.num_slots, 0);
  std::vector<uint8_t> group_output(p.num_slots, 0);
  for (size_t j = 0; j < p.steps.size(); ++j) {
    for (int sl : p.steps[j].in)
      if (sl >= 0) last_read[static_cast<size_t>(sl)] = j;
    for (const auto& body : p.steps[j].bodies)
      for (int sl : body.second) last_read[static_cast<size_t>(sl)] = j;
  }
  for (int sl : p.output_slots) group_output[static_cast<size_t>(sl)] = 1;
  auto pw = std::make_unique<Piecewise>();
  size_t fixed_steps = 0;
  for (size_t k = 0; k < p.steps.size();) {
    if (!stays(k)) { ++k; continue; }
    size_t e = k;
    while (e < p.steps.size() && stays(e)) ++e;
    if (e - k >= kMinSegmentSteps) {
      Segment seg;
      seg.begin = k;
      seg.end = e;
      std::unordered_set<int> produced, taken;
      for (size_t j = k; j < e; ++j) {
        const auto& io = p.steps[j];
        for (size_t i = 0; i < io.in.size(); ++i) {
          int sl = io.in[i];
          // Constants are not arguments: the trace reads them as they are (see Run).
          if (sl < 0 || produced.count(sl) || is_constant_slot(p, sl) || !taken.insert(sl).second)
            continue;
          seg.in_slots.push_back(sl);
          seg.in_shapes.push_back(a[j].shapes[i]);
        }
        for (int sl : io.out)
          if (sl >= 0) produced.insert(sl);
      }
      // Outputs: what later steps (or their bodies) read, and the group's outputs.
      for (size_t j = k; j < e; ++j)
        for (int sl : p.steps[j].out)
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
  if (opt_.log_level >= 1)
    std::cerr << "[MLX EP] " << where_ << ": shape family: " << pw->segments.size()
              << " compiled segment(s) over " << fixed_steps << " of " << p.steps.size()
              << " steps, the rest eager\n";
  return pw;
}

Program::SegmentFn Program::segment_function(const Segment& seg, mx::Stream s) {
  // The segment's steps over placeholders for its inputs: fixed steps read no host value but
  // constants, which the trace's slots hold as themselves.
  return mx::compile(
      [this, b = seg.begin, e = seg.end, ins = seg.in_slots, outs = seg.out_slots,
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
        run_steps(p, slots, none, trace, b, e);
        std::vector<mx::array> r;
        for (int o : outs) {
          if (!slots[o] || !slots[o]->is_tensor())
            throw std::runtime_error("[engine] a segment's output is not a tensor");
          r.push_back(*slots[o]->tensor);
        }
        return r;
      },
      /*shapeless=*/false);
}

std::vector<mx::array> Program::run_piecewise(Piecewise& pw, const std::vector<mx::array>& args,
                                              const Layout& layout, mx::Stream s) {
  const auto t0 = std::chrono::steady_clock::now();
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
  for (auto& seg : pw.segments) {
    run_steps(p, slots, taint, run, next, seg.begin);
    next = seg.end;
    std::vector<mx::array> in;
    bool match = !seg.broken;
    for (size_t i = 0; match && i < seg.in_slots.size(); ++i) {
      const auto& v = slots[seg.in_slots[i]];
      match = v && v->is_tensor() && v->tensor->shape() == seg.in_shapes[i];
      if (match) in.push_back(*v->tensor);
    }
    auto fn = seg.fns.find(s.index);
    if (match && fn == seg.fns.end()) {
      fn = seg.fns.emplace(s.index, segment_function(seg, s)).first;
      ++stats_.segment_traces;
    }
    if (match) {
      try {
        auto outs = fn->second(in);
        for (size_t j = 0; j < seg.out_slots.size(); ++j) slots[seg.out_slots[j]] = ops::Value::of(outs.at(j));
        ++stats_.segment_calls;
        matched = true;
        continue;
      } catch (const std::exception& ex) {
        // A trace the steps cannot take (a translator that reads data while tracing): this
        // segment runs eagerly from now on; the eager run below reports a real input error.
        seg.broken = true;
        seg.fns.clear();
        if (opt_.log_level >= 1)
          std::cerr << "[MLX EP] " << where_ << ": segment of steps " << seg.begin << "-" << seg.end
                    << " runs eagerly: " << ex.what() << "\n";
      }
    }
    run_steps(p, slots, taint, run, seg.begin, seg.end);
  }
  run_steps(p, slots, taint, run, next, p.steps.size());
  pw.misses = matched ? 0 : pw.misses + 1;
  std::vector<ops::Value> outs;
  outs.reserve(p.output_slots.size());
  for (int sl : p.output_slots) {
    if (!slots[sl]) throw std::logic_error("[engine] an output nothing produced (slot " + std::to_string(sl) + ")");
    outs.push_back(*slots[sl]);
  }
  auto result = finish_outputs(std::move(outs), s);
  stats_.translate_ns += elapsed_ns(t0);
  return result;
}

}  // namespace ortmlx::engine
