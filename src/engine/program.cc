#include "engine/program.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include <mlx/primitives.h>

#include "engine/device_buffers.h"
#include "engine/memory_guard.h"
#include "engine/program_run.h"
#include "engine/host_fold/host_fold.h"
#include "ops/lowp.h"

namespace ortmlx::engine {

namespace {
// The calling thread's last run: which path it took and its time inside mx::eval (statistics
// for the ABI layer's overhead figure; per thread because runs of a program may interleave).
thread_local bool tl_last_run_compiled = false;
thread_local uint64_t tl_last_eval_ns = 0;
}  // namespace

bool Program::last_run_compiled() { return tl_last_run_compiled; }
bool last_run_compiled() { return tl_last_run_compiled; }

std::unique_ptr<FusedProgram> make_program(std::string name, const graph::Graph& g,
                                           std::vector<std::string> input_names,
                                           std::vector<std::string> output_names, Options opt) {
  return std::make_unique<Program>(std::move(name), g, std::move(input_names),
                                   std::move(output_names), std::move(opt));
}

void copy_out(const mx::array& a, void* dst, graph::DType t) { Program::copy_out(a, dst, t); }
void copy_out(const mx::array& a, void* dst) { Program::copy_out(a, dst); }

using graph::DType;

namespace {

// Host reads of values derived from these ops depend only on shapes, never on tensor data.
// (SequenceLength too: a sequence's length follows from the signature and from host reads
// that were recorded with their own taint.)
bool shape_only_op(const graph::Node& n) {
  return n.domain.empty() &&
         (n.op_type == "Shape" || n.op_type == "Size" || n.op_type == "SequenceLength");
}

std::string shape_str(const mx::array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.shape().size(); ++i) s += (i ? "," : "") + std::to_string(a.shape()[i]);
  return s + "]";
}

std::string value_str(const ops::Value& v) {
  if (v.is_tensor())
    return shape_str(*v.tensor) + " " + graph::dtype_name(ops::from_mlx_dtype(v.tensor->dtype()));
  if (v.is_sequence()) return "sequence of " + std::to_string(v.items.size());
  return "none";
}

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
void log_primitives(const std::vector<mx::array>& outs, const std::string& where) {
  std::map<std::string, int> count;
  walk_graph(outs, [&](const mx::array& a) {
    if (!a.is_available() && a.has_primitive()) count[a.primitive().name()]++;
    return false;
  });
  std::ostringstream os;
  os << "[MLX EP] " << where << " evaluates:";
  for (const auto& [name, n] : count) os << " " << name << "=" << n;
  std::cerr << os.str() << "\n";
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
    : name_(std::move(name)), graph_(g), input_names_(std::move(input_names)),
      output_names_(std::move(output_names)), opt_(opt) {
  where_ = "fused node '" + name_ + "'";
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

std::unique_ptr<Program::Plan> Program::make_plan(const graph::Graph& g,
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
    mx::array a = to_array(HostTensor{c->dtype, c->shape, c->data});
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

void Program::copy_out(const mx::array& a, void* dst) {
  if (a.size() == 0 || !dst) return;
  if (!a.flags().row_contiguous) throw std::logic_error("[engine] output is not row-contiguous");
  std::memcpy(dst, a.data<void>(), a.nbytes());
}

void Program::copy_out(const mx::array& a, void* dst, DType t) {
  if (ops::lowp::is_lowp(t)) return ops::lowp::to_host(a, t, dst);  // packs 4-bit pairs
  copy_out(a, dst);
}

bool Program::is_constant_slot(const Plan& p, int slot) const {
  if (slot < 0) return false;
  if (&p == top_.get())  // the group's constants follow its fused inputs
    return static_cast<size_t>(slot) >= input_names_.size() && static_cast<size_t>(slot) < p.num_inputs;
  for (const auto& c : p.constants)
    if (c.first == slot) return true;
  return false;
}

// A node of shape arithmetic (engine/host_fold/host_fold.h) whose inputs are all known on the host: outputs
// of Shape/Size, of nodes folded before, or constants; in eager runs (piecewise decode steps
// included) also fused inputs already on the host. Not taint: piecewise runs track none, and a
// fused input's data must not be folded into what a compile trace or a shape-keyed segment
// replays (probes record reads for those). A constant inside a compile trace is a
// placeholder there: its value comes from the program's own copy, so a trace folds exactly what
// the probe before it folded (the recorded host reads then line up).
std::optional<std::vector<mx::array>> Program::fold_on_host(
    const Plan& p, const graph::Node& node, const StepIO& io,
    const std::vector<std::optional<ops::Value>>& inputs, const Run& run) const {
  if (!ops::host_foldable_op(node) || !io.bodies.empty()) return std::nullopt;
  std::vector<std::optional<mx::array>> arrays;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) { arrays.emplace_back(); continue; }
    if (!inputs[i]->is_tensor()) return std::nullopt;
    const int sl = io.in[i];
    const mx::array& a = *inputs[i]->tensor;
    if (run.host_known.count(a.id())) {
      arrays.push_back(a);
    } else if (run.mode == Mode::Eager && &p == top_.get() && static_cast<size_t>(sl) < input_names_.size() &&
               a.is_available()) {
      // A fused input on the host (a mask, position ids): in an eager run nothing is replayed
      // later, so its data may be folded too (GroupQueryAttention's seqlens_k from the mask).
      arrays.push_back(a);
    } else if (is_constant_slot(p, sl)) {
      arrays.push_back(a.is_available() || &p != top_.get()
                           ? a : constants_[static_cast<size_t>(sl) - input_names_.size()]);
    } else {
      return std::nullopt;
    }
  }
  return ops::fold_on_host(node, arrays);
}

void Program::run_steps(const Plan& p, Slots& slots, std::vector<Taint>& taint, Run& run,
                        size_t begin, size_t end, const std::vector<size_t>* order) const {
  const bool top = &p == top_.get();
  // Probe only: a value's taint traced through MLX's graph (a sequence: all of its items).
  auto value_taint = [&](const ops::Value& v) {
    Taint t = v.is_tensor() ? run.taint_of(*v.tensor) : Taint{};
    for (const auto& a : v.items) {
      auto ti = run.taint_of(a);
      t.insert(t.end(), ti.begin(), ti.end());
    }
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    return t;
  };
  for (size_t pos = begin; pos < end; ++pos) {
    const size_t k = order ? (*order)[pos] : pos;
    const auto& node = p.graph->nodes[k];
    const auto& io = p.steps[k];
    const size_t reads_before = run.read_calls, constant_reads_before = run.constant_reads;
    std::vector<std::optional<ops::Value>> node_inputs;
    node_inputs.reserve(io.in.size());
    Taint node_taint;
    for (int sl : io.in) {
      if (sl < 0) { node_inputs.emplace_back(); continue; }
      // Every slot a step reads was filled by an earlier step or the inputs; a hole is an
      // engine bug (a segment that did not return a value read later), reported, not followed.
      if (!slots[sl])
        throw std::logic_error("[engine] " + node.describe() + " reads a value nothing produced (slot " +
                               std::to_string(sl) + ")");
      node_inputs.push_back(slots[sl]);
      node_taint.insert(node_taint.end(), taint[sl].begin(), taint[sl].end());
    }
    for (const auto& [body, outer] : io.bodies)
      for (int sl : outer) node_taint.insert(node_taint.end(), taint[sl].begin(), taint[sl].end());
    std::sort(node_taint.begin(), node_taint.end());
    node_taint.erase(std::unique(node_taint.begin(), node_taint.end()), node_taint.end());

    ops::EngineHooks hooks;
    hooks.host_value = [&](size_t idx) -> mx::array {
      int sl = io.in.at(idx);
      if (sl < 0) throw std::logic_error("[engine] host read of an absent input");
      if (!slots[sl]->is_tensor())
        throw ops::TranslateError("[engine] host read of " + std::string(slots[sl]->kind_name()));
      if (is_constant_slot(p, sl)) {
        ++run.constant_reads;
        if (run.direct_constants) return run.read_constant(*slots[sl]->tensor);
      }
      return run.read(*slots[sl]->tensor, taint[sl]);
    };
    hooks.host_eval = [&](const mx::array& v) -> mx::array {
      return run.read(v, run.tracking() ? run.taint_of(v) : Taint{});
    };
    hooks.emulate_int8_activations =
        opt_.int8_emulation == 1 || (opt_.int8_emulation < 0 && run.s.device == mx::Device::cpu);
    hooks.is_constant = [&](size_t i) { return i < io.in.size() && is_constant_slot(p, io.in[i]); };
    hooks.constant_memo = [&](const std::string& key, const std::vector<size_t>& idx,
                              const std::function<mx::array()>& make) -> mx::array {
      for (size_t i : idx)
        if (i >= io.in.size() || !is_constant_slot(p, io.in[i])) return make();
      // "shared:" keys belong to the node's graph scope, not to the node (the caller names the
      // inputs in them; a body's constants may reuse an outer name, hence the scope).
      const bool shared = key.rfind("shared:", 0) == 0;
      const std::string full =
          std::to_string(shared ? reinterpret_cast<std::uintptr_t>(p.graph)
                                : reinterpret_cast<std::uintptr_t>(&node)) + "/" + key;
      if (auto it = prepared_.find(full); it != prepared_.end()) return it->second;
      // A compile trace sees constants as placeholders: it only reuses what a probe prepared.
      if (run.mode == Mode::Replay) return make();
      mx::array a = mx::contiguous(make(), false, run.s);
      a.eval();
      prepared_.emplace(full, a);
      return a;
    };
    hooks.translation_memo = [&](const std::string& key, const std::vector<mx::array>& of,
                                 const std::function<std::vector<mx::array>()>& make) {
      std::pair<std::string, std::vector<std::uintptr_t>> k{key, {}};
      for (const auto& a : of) k.second.push_back(a.id());
      if (auto it = run.memo.find(k); it != run.memo.end()) return it->second.result;
      auto result = make();
      run.memo.emplace(std::move(k), Run::MemoEntry{of, result});
      return result;
    };
    hooks.run_subgraph_values = [&](const graph::Graph& body, const std::vector<ops::Value>& args)
        -> std::vector<ops::Value> {
      auto b = std::find_if(io.bodies.begin(), io.bodies.end(),
                            [&](const auto& e) { return e.first == &body; });
      if (b == io.bodies.end())
        throw std::logic_error("[engine] " + node.describe() + " ran a graph that is not its subgraph");
      const Plan& bp = *body_plans_.at(&body);
      if (args.size() != bp.num_inputs)
        throw std::invalid_argument("subgraph takes " + std::to_string(bp.num_inputs) +
                                    " inputs, got " + std::to_string(args.size()));
      std::vector<ops::Value> values(args);
      std::vector<Taint> taints(args.size());
      if (run.tracking())
        for (size_t i = 0; i < args.size(); ++i) taints[i] = value_taint(args[i]);
      for (int sl : b->second) {
        if (!slots[sl])
          throw std::logic_error("[engine] " + node.describe() + "'s subgraph reads a value nothing produced");
        values.push_back(*slots[sl]);
        taints.push_back(taint[sl]);
      }
      return run_plan(bp, std::move(values), std::move(taints), run);
    };
    hooks.run_subgraph = [&](const graph::Graph& body,
                             const std::vector<mx::array>& args) -> std::vector<mx::array> {
      std::vector<ops::Value> values;
      for (const auto& a : args) values.push_back(ops::Value::of(a));
      std::vector<mx::array> outs;
      for (auto& v : hooks.run_subgraph_values(body, values)) {
        if (!v.is_tensor())
          throw ops::TranslateError("[engine] " + node.describe() + ": a subgraph returned " +
                                    v.kind_name() + " where a tensor is expected");
        outs.push_back(*v.tensor);
      }
      return outs;
    };
    auto folded = opt_.host_fold ? fold_on_host(p, node, io, node_inputs, run) : std::nullopt;
    // For the shape family a folded step, and a Shape/Size step feeding folds, are eager steps:
    // their results must stay host values for the folds and reads after them, where inside a
    // compiled segment they would be placeholders (and a translation a fold replaces may read
    // them, as Reshape's shape or Range's bounds).
    const bool host_step = folded || (opt_.host_fold && shape_only_op(node));
    if (folded) ++stats_.host_folds;
    ops::OpContext ctx(node, *p.graph, std::move(node_inputs), run.s, &hooks);
    ops::Outputs outs;
    try {
      outs = folded ? std::move(*folded) : p.entries[k]->translate(ctx);
    } catch (const std::exception& e) {
      std::ostringstream os;
      if (top) os << "[MLX EP] fused node '" << name_ << "': ";
      os << node.describe() << " failed: " << e.what() << " (inputs:";
      for (size_t i = 0; i < io.in.size(); ++i) {
        if (io.in[i] < 0) { os << " -"; continue; }
        os << " " << node.inputs[i] << " " << value_str(*slots[io.in[i]]);
      }
      os << ")";
      // Keep the category: invalid_argument (bad shapes/values from the caller) becomes
      // ORT_INVALID_ARGUMENT at the error wall, anything else ORT_EP_FAIL. ORT's Python
      // wrapper silently retries EP_FAIL runs on the CPU EP, which would hide input errors.
      if (dynamic_cast<const std::invalid_argument*>(&e)) throw std::invalid_argument(os.str());
      throw std::runtime_error(os.str());
    }
    const auto& set_values = ctx.value_outputs();
    for (size_t j = 0; j < io.out.size(); ++j) {
      if (io.out[j] < 0) continue;
      // A sequence or optional output is set on the context (see OpContext::set_output).
      if (j < set_values.size() && set_values[j]) {
        slots[io.out[j]] = *set_values[j];
      } else if (j < outs.size()) {
        slots[io.out[j]] = ops::Value::of(outs[j]);
      } else {
        throw std::runtime_error("[MLX EP] fused node '" + name_ + "': " + node.describe() +
                                 " failed: translator produced " + std::to_string(outs.size()) +
                                 " outputs, node needs output " + std::to_string(j));
      }
      const ops::Value& v = *slots[io.out[j]];
      if (shape_only_op(node))
        taint[io.out[j]] = {};
      else if (!io.bodies.empty() && run.tracking())
        taint[io.out[j]] = value_taint(v);  // precise: through the bodies' values
      else
        taint[io.out[j]] = node_taint;
      if (top) run.note(v, taint[io.out[j]]);
      if (v.is_tensor() && (folded || shape_only_op(node))) run.host_known.try_emplace(v.tensor->id(), *v.tensor);
    }
    // Reads of constant initializers (a Reshape's shape) do not make a step depend on data.
    if (top && run.steps)
      record_step(k, io, slots, host_step,
                  run.read_calls - reads_before != run.constant_reads - constant_reads_before, *run.steps);
  }
}

std::vector<ops::Value> Program::run_plan(const Plan& p, std::vector<ops::Value> inputs,
                                          std::vector<Taint> input_taints, Run& run) const {
  // Outer-scope values follow the inputs in `inputs` (bodies): see the run_subgraph hook.
  const bool top = &p == top_.get();
  Slots slots(p.num_slots);
  // taint[slot]: the fused inputs whose data flow into the value (shape reads reset it).
  std::vector<Taint> taint(p.num_slots);
  for (size_t i = 0; i < p.num_inputs; ++i) {
    slots[i] = inputs[i];
    taint[i] = std::move(input_taints[i]);
    if (top) run.note(inputs[i], taint[i]);
  }
  for (const auto& [sl, c] : p.constants) slots[sl] = ops::Value::of(c);
  for (size_t j = 0; j < p.outer_slots.size(); ++j) {
    slots[p.outer_slots[j]] = inputs[p.num_inputs + j];
    taint[p.outer_slots[j]] = std::move(input_taints[p.num_inputs + j]);
  }

  run_steps(p, slots, taint, run, 0, p.steps.size());
  std::vector<ops::Value> result;
  result.reserve(p.output_slots.size());
  for (int sl : p.output_slots) {
    if (!slots[sl]) throw std::logic_error("[engine] an output nothing produced (slot " + std::to_string(sl) + ")");
    result.push_back(*slots[sl]);
    if (!top) run.note(*slots[sl], taint[sl]);  // the translator may pass it on (Loop state)
  }
  return result;
}

Program::Layout Program::layout_of(const std::vector<HostTensor>& raw) {
  Layout layout;
  for (const auto& t : raw)
    layout.push_back(t.kind == HostTensor::Kind::Tensor ? -1
                     : t.kind == HostTensor::Kind::None ? -2
                                                        : static_cast<int>(t.items.size()));
  return layout;
}

mx::array Program::input_array(const HostTensor& t) const {
  // Borrowing ORT's input buffer saves a copy of every input on every run (a decode step's
  // whole KV cache). It is safe because nothing keeps these arrays past run(): host reads
  // recorded for replay are owned copies (Run::read), the prepare-once cache takes constants
  // only, outputs are copied out before Compute returns, and MLX never donates (writes into)
  // a buffer it does not own. MLX's GPU backends need their own allocations: copy there,
  // unless the buffer is one: an allocation of the EP's device allocator (device_memory=1) is
  // MLX's own memory, used in place on any backend (device_buffers.h).
  // (The registry lookup takes a lock: only sessions with device memory pay for it.)
  if (opt_.device_memory && !ops::lowp::is_lowp(t.dtype) && t.data)
    if (auto a = device_buffers::borrow(t.data, ops::to_shape(t.shape), ops::mlx_dtype(t.dtype)))
      return *a;
  if (opt_.gpu || ops::lowp::is_lowp(t.dtype) || !t.data) return to_array(t);
  auto dtype = ops::mlx_dtype(t.dtype);
  return mx::array(const_cast<void*>(t.data), ops::to_shape(t.shape), dtype, [](void*) {});
}

std::vector<mx::array> Program::arguments(const std::vector<HostTensor>& raw) const {
  // A sequence's items are arguments of their own, so mx::compile sees them as inputs.
  std::vector<mx::array> args;
  for (const auto& t : raw) {
    if (t.kind == HostTensor::Kind::Tensor) args.push_back(input_array(t));
    for (const auto& item : t.items) args.push_back(input_array(item));
  }
  return args;
}

void Program::input_values(const std::vector<mx::array>& args, const Layout& layout,
                           std::vector<ops::Value>& values, std::vector<Taint>& taints) const {
  size_t next = 0;
  for (size_t i = 0; i < input_names_.size(); ++i) {
    int l = i < layout.size() ? layout[i] : -1;
    if (l == -1) {
      values.push_back(ops::Value::of(args.at(next++)));
    } else if (l == -2) {
      values.push_back(ops::Value::none());
    } else {
      std::vector<mx::array> items(args.begin() + static_cast<std::ptrdiff_t>(next),
                                   args.begin() + static_cast<std::ptrdiff_t>(next + l));
      next += static_cast<size_t>(l);
      const auto* vi = graph_.info(input_names_[i]);
      DType elem = !items.empty() ? ops::from_mlx_dtype(items[0].dtype())
                                  : vi ? vi->dtype : DType::Undefined;
      values.push_back(ops::Value::sequence(std::move(items), elem));
    }
    taints.push_back({static_cast<int>(i)});
  }
  for (; next < args.size(); ++next) {
    values.push_back(ops::Value::of(args[next]));
    taints.emplace_back();
  }
}

std::vector<mx::array> Program::finish_outputs(std::vector<ops::Value> outs, mx::Stream s) const {
  std::vector<mx::array> result;
  result.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    // The partitioner keeps sequences and optionals inside the group: ORT's kernel API has
    // tensor outputs only.
    if (!outs[i].is_tensor())
      throw std::runtime_error("[MLX EP] fused node '" + name_ + "': output '" +
                               output_names_[i] + "' is " + outs[i].kind_name() +
                               ", a fused node can only return tensors");
    mx::array a = *outs[i].tensor;
    // Safety net for declared output dtypes (ONNX promotion rules are stricter than MLX's).
    if (output_dtypes_[i] != DType::Undefined) {
      if (auto d = ops::to_mlx_dtype(output_dtypes_[i]); d && a.dtype() != *d) a = mx::astype(a, *d, s);
    }
    result.push_back(mx::contiguous(a, false, s));
  }
  return result;
}

std::vector<mx::array> Program::translate(const std::vector<mx::array>& args,
                                          const Layout& layout, Mode mode, HostRecord* record,
                                          std::vector<int>* host_deps, mx::Stream s,
                                          StepInfos* info) const {
  const auto t0 = std::chrono::steady_clock::now();
  Run run(mode, record, host_deps, s, &stats_);
  run.steps = info;
  // The fused inputs back from the arguments (see arguments()), then the constants.
  std::vector<ops::Value> values;
  std::vector<Taint> taints;
  input_values(args, layout, values, taints);
  auto result = finish_outputs(run_plan(*top_, std::move(values), std::move(taints), run), s);
  stats_.translate_ns += elapsed_ns(t0);
  return result;
}

std::string Program::signature_of(const std::vector<HostTensor>& raw, std::string* shapes) const {
  std::string key = signature_with(raw, nullptr);
  auto it = keyed_inputs_.find(key);
  std::string sig = it == keyed_inputs_.end() ? key : signature_with(raw, &it->second);
  if (shapes) *shapes = std::move(key);
  return sig;
}

std::string Program::signature_with(const std::vector<HostTensor>& raw,
                                    const std::vector<bool>* keyed_inputs) const {
  std::string sig;
  auto tensor = [&](const HostTensor& t, bool keyed) {
    sig += std::to_string(static_cast<int>(t.dtype)) + ":";
    size_t numel = 1;
    for (auto d : t.shape) {
      sig += std::to_string(d) + ",";
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

std::vector<mx::array> Program::run(const std::vector<HostTensor>& raw) {
  if (raw.size() != input_names_.size())
    throw std::invalid_argument("[MLX EP] fused node '" + name_ + "' expects " +
                                std::to_string(input_names_.size()) + " inputs, got " +
                                std::to_string(raw.size()));
  std::vector<mx::array> args = arguments(raw);
  const Layout layout = layout_of(raw);
  args.insert(args.end(), constants_.begin(), constants_.end());

  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.runs;
  tl_last_run_compiled = false;
  // MLX's default stream is per thread (0.31.2+): compiled functions are keyed by it too.
  mx::Stream s = mx::default_stream(device());
  auto eval_all = [this](std::vector<mx::array> outs) {
    stats_.eval_arrays += check_evaluation(outs, where_);  // before MLX allocates (memory_guard.h)
    if (opt_.log_level >= 3) log_primitives(outs, where_);
    auto t0 = std::chrono::steady_clock::now();
    mx::eval(outs);
    tl_last_eval_ns = elapsed_ns(t0);
    stats_.eval_ns += tl_last_eval_ns;
    return outs;
  };

  // A probe: translate with the real data, learning which host reads the graph makes and
  // whether they depend only on shapes (compilable) or on tensor data (eager only). Returns the
  // outputs; `restart` when an input newly joined the signature (its key changed).
  std::string shapes;  // the run's signature without input data (signature_of)
  auto probe = [&](Entry& entry, bool& restart, StepInfos* steps) {
    HostRecord record;
    std::vector<int> deps;
    auto outs = translate(args, layout, Mode::Probe, &record, &deps, s, steps);
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

  std::string sig = signature_of(raw, &shapes) + "#" + std::to_string(s.index);
  auto it = cache_.find(sig);
  if (it == cache_.end()) {
    // A member of a known shape family (a decode step): compiled segments and eager steps.
    // Not cached: every step of a decode loop is a signature of its own.
    if (piecewise_ && !compile_broken_ && piecewise_->layout == layout &&
        piecewise_->device == s.device) {
      auto outs = run_piecewise(*piecewise_, args, layout, s);
      // The family is gone when no segment has matched for a while: look for another.
      if (piecewise_->misses >= 4) piecewise_.reset();
      if (!opt_.gpu || !touches_empty(outs)) {  // otherwise run again below, on the CPU stream
        ++stats_.piecewise_runs;
        ++stats_.eager_runs;
        return eval_all(std::move(outs));
      }
    }
    Entry entry;
    std::vector<mx::array> outs;
    // Until a family is found, each new signature's steps are kept, to compare with the next.
    StepInfos steps;
    StepInfos* look =
        opt_.compile && opt_.shape_family && !compile_broken_ && !piecewise_ ? &steps : nullptr;
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
        if (cache_.count(sig)) break;
      }
      probed_once_ = true;
    }
    if (look && steps.size() == top_->steps.size()) {
      if (last_steps_ && last_steps_->first == layout) {
        piecewise_ = find_family(last_steps_->second, steps);
        if (piecewise_) {
          piecewise_->layout = layout;
          piecewise_->device = s.device;
        }
      }
      if (piecewise_)
        last_steps_.reset();
      else
        last_steps_.emplace(layout, std::move(steps));
    }
    if (touches_empty(outs)) {
      ++stats_.empty_operand_runs;
      if (opt_.gpu) {
        entry.on_cpu = entry.eager_only = true;
        outs = translate(args, layout, Mode::Eager, nullptr, nullptr, mx::default_stream(mx::Device::cpu));
      }
    }
    ++stats_.eager_runs;
    auto result = eval_all(std::move(outs));
    if (!cache_.count(sig)) {
      entry.hits = 1;
      lru_.push_front(sig);
      cache_.emplace(sig, std::make_pair(std::move(entry), lru_.begin()));
      while (cache_.size() > std::max<size_t>(opt_.cache_capacity, 1)) {
        cache_.erase(lru_.back());
        lru_.pop_back();
      }
    }
    return result;
  }

  lru_.splice(lru_.begin(), lru_, it->second.second);
  Entry& e = it->second.first;
  ++e.hits;
  if (e.on_cpu) {
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
      cache_.erase(it);
      lru_.pop_front();  // spliced to the front above
      ++stats_.eager_runs;
      return eval_all(translate(args, layout, Mode::Eager, nullptr, nullptr, s));
    }
  }
  if (!e.eager_only && !compile_broken_ && !e.fn && e.hits >= opt_.compile_after) {
    auto record = std::make_shared<HostRecord>(e.record);
    e.fn = mx::compile(
        [this, record, layout, s](const std::vector<mx::array>& a) {
          return translate(a, layout, Mode::Replay, record.get(), nullptr, s);
        },
        /*shapeless=*/false);
    ++stats_.traces;
  }
  if (e.fn && !compile_broken_) {
    try {
      auto outs = eval_all(e.fn(args));
      ++stats_.compiled_runs;
      stats_.eval_ns_compiled += tl_last_eval_ns;
      tl_last_run_compiled = true;
      return outs;
    } catch (const MemoryLimitError&) {
      throw;  // the run's size, not the graph's traceability: keep the compiled path
    } catch (const std::exception& ex) {
      // Some graphs cannot be traced (an op that reads data while tracing, an MLX primitive
      // without compile support): fall back to eager for this program, and say so once.
      compile_broken_ = true;
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

}  // namespace ortmlx::engine
