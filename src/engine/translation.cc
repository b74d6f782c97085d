// Translation: a plan's steps turned into MLX arrays (run_steps, with host folds and host
// reads), the group's inputs as values and its results as ORT takes them. Program's other half
// (signatures, the compiled cache, the run modes) is program.cc; shape families shape_family.cc.
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
#include "engine/host_fold/host_fold.h"
#include "engine/index_check.h"
#include "engine/memory_guard.h"
#include "engine/program.h"
#include "engine/program_run.h"
#include "kernels/cuda/pinned_inputs.h"
#include "ops/lowp.h"
#include "ops/switches.h"
#include "trace/trace.h"

namespace ortmlx::engine {

using graph::DType;

namespace {

// Whether unevaluated `x` is a view whose elements in row-major order are its input's in
// row-major order: a reshape by another name, or a transpose that moves only axes of size 1.
bool order_preserving_view(const mx::array& x) {
  if (x.is_available() || !x.has_primitive() || x.inputs().size() != 1 || !x.siblings().empty()) return false;
  const std::string_view name = x.primitive().name();
  if (name == "Reshape" || name == "Squeeze" || name == "ExpandDims" || name == "Flatten" || name == "Unflatten")
    return true;
  if (name != "Transpose") return false;
  const auto& in = x.inputs()[0];
  int last = -1;  // (by name: libmlx exports no RTTI for its primitives)
  for (int axis : static_cast<mx::Transpose&>(x.primitive()).state())
    if (in.shape(axis) != 1) {
      if (axis < last) return false;
      last = axis;
    }
  return true;
}

// A Reshape of such views reads the first input before them instead (MLX's Reshape evaluates
// from its input's shape and its own alone), so the views between drop out of the graph where
// nothing else reads them: on MLX's CPU device every primitive, a view too, is a task of the
// stream thread (translations stack them: Unsqueeze after Squeeze, a 1-D convolution's reshapes
// around a 2-D one, a recurrent step's reshapes of one row).
void shorten_reshape_chains(const std::vector<mx::array>& outs) {
  std::vector<mx::array> stack(outs.begin(), outs.end());
  std::unordered_set<std::uintptr_t> seen;
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(a.id()).second || a.is_available() || !a.has_primitive()) continue;
    if (a.inputs().size() == 1 && std::string_view(a.primitive().name()) == "Reshape") {
      mx::array source = a.inputs()[0];
      while (order_preserving_view(source)) source = mx::array(source.inputs()[0]);
      if (source.id() != a.inputs()[0].id()) a.inputs()[0] = source;
    }
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
}

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

// "float32[2,16]": trace arguments lead with the dtype (ORT's profile writes a value that
// starts with '[' unquoted, as JSON).
std::string trace_str(const ops::Value& v) {
  if (v.is_tensor())
    return graph::dtype_name(ops::from_mlx_dtype(v.tensor->dtype())) + shape_str(*v.tensor);
  return value_str(v);
}

std::string values_str(const std::vector<std::optional<ops::Value>>& vs) {
  std::string s;
  for (const auto& v : vs) s += (s.empty() ? "" : "; ") + (v ? trace_str(*v) : std::string("-"));
  return s;
}

}  // namespace

// The "op" span's arguments: the node, its outputs and their bytes, how it ran. With
// profile_ops an eager step's outputs are evaluated here, so the span times the node itself.
void Program::describe_step(trace::Span& span, const graph::Node& node, const StepIO& io,
                            const Slots& slots, Mode mode, bool folded) const {
  span.arg("node", node.name.empty() ? node.op_type : node.name);
  if (!node.domain.empty()) span.arg("domain", node.domain);
  std::vector<mx::array> arrays;
  std::string outs;
  size_t bytes = 0;
  for (int sl : io.out) {
    if (sl < 0 || !slots[sl]) continue;
    const ops::Value& v = *slots[sl];
    outs += (outs.empty() ? "" : "; ") + trace_str(v);
    if (v.is_tensor()) arrays.push_back(*v.tensor);
    arrays.insert(arrays.end(), v.items.begin(), v.items.end());
  }
  for (const auto& a : arrays) bytes += a.nbytes();
  span.arg("outputs", outs);
  span.arg("output_bytes", std::to_string(bytes));
  span.arg("step", folded ? "folded on the host"
                          : mode == Mode::Replay ? "compile trace" : mode == Mode::Probe ? "probe" : "eager");
  if (opt_.profile_ops && mode == Mode::Eager && !folded) {
    const auto t0 = std::chrono::steady_clock::now();
    mx::eval(arrays);
    span.arg("eval_us", std::to_string(elapsed_ns(t0) / 1000));
    span.arg("evaluated", "1");
  }
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
  const ops::SwitchesScope switches(
      {opt_.fused_rotary, opt_.zero_bias, opt_.grouped_kv, opt_.cpu_gemv, opt_.gpu_kernels,
       opt_.gpu_kernels && opt_.fused_skip_norm, opt_.gpu_kernels && opt_.fused_gqa_step, opt_.flat_products,
       opt_.cpu_dnnl, opt_.cpu_dnnl_min_flops, opt_.cpu_dnnl_parallel_min_flops, opt_.int4_dense_rows,
       opt_.int4_dequantize_kernel, opt_.cpu_dnnl_matmul, opt_.cpu_dnnl_blocked, opt_.cpu_depthwise, opt_.cpu_patch_deconv, opt_.gpu_attention_split_rows,
       opt_.cpu_avx512, opt_.cpu_packed_matmul, opt_.cpu_caller_eval, opt_.cpu_int4_gemm, opt_.cpu_attention,
       opt_.fused_gqa_step, opt_.cpu_packed_blocks, opt_.cpu_skip_norm, opt_.cpu_gqa_prompt, opt_.cpu_packed_rows,
       opt_.cpu_packed_stream, opt_.cpu_packed_ahead, opt_.cpu_packed_depth, opt_.cpu_packed_prepared,
       opt_.cpu_dnnl_add, opt_.cpu_dnnl_winograd,
       opt_.cpu_dnnl_concat_convs});
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
    trace::Span op_span("op", node.op_type.c_str());
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
    hooks.index_checks = opt_.index_check;
    hooks.index_diagnose = index_check::diagnosing();
    hooks.index_flag = [&](const mx::array& bad) { run.index_flags.push_back(bad); };
    hooks.constant_value = [&](size_t i) -> std::optional<mx::array> {
      if (i >= io.in.size() || !is_constant_slot(p, io.in[i]) || !slots[io.in[i]]->is_tensor())
        return std::nullopt;
      const mx::array& a = *slots[io.in[i]]->tensor;
      if (a.is_available() || &p != top_.get()) return a;
      return constants_[static_cast<size_t>(io.in[i]) - input_names_.size()];
    };
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
    if (op_span.active()) op_span.arg("inputs", values_str(node_inputs));
    ops::OpContext ctx(node, *p.graph, std::move(node_inputs), run.s, &hooks);
    ops::Outputs outs;
    try {
      outs = folded ? std::move(*folded) : p.entries[k]->translate(ctx);
    } catch (const KeptSegmentMiss&) {
      throw;  // not the node's: the run is done again without kept segments
    } catch (const std::exception& e) {
      std::ostringstream os;
      // (The fused node is named once, by the error wall.)
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
    if (op_span.active()) describe_step(op_span, node, io, slots, run.mode, folded.has_value());
    // Reads of constant initializers (a Reshape's shape) do not make a step depend on data.
    if (top && run.steps)
      ShapeFamily::record_step(k, io, slots, host_step,
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

size_t nbytes_of(const HostTensor& t) {
  size_t n = graph::dtype_size(t.dtype);
  for (auto d : t.shape) n *= static_cast<size_t>(std::max<int64_t>(d, 0));
  return n;
}

Layout Program::layout_of(const std::vector<HostTensor>& raw) {
  Layout layout;
  for (const auto& t : raw)
    layout.push_back(t.kind == HostTensor::Kind::Tensor ? -1
                     : t.kind == HostTensor::Kind::None ? -2
                                                        : static_cast<int>(t.items.size()));
  return layout;
}

mx::array Program::input_array(const HostTensor& t, ops::HostViews* views) const {
  // Borrowing ORT's input buffer saves a copy of every input on every run (a decode step's
  // whole KV cache). It is safe because nothing reads these arrays past run(): host reads
  // recorded for replay are owned copies (Run::read), the prepare-once cache takes constants
  // only, outputs are copied out before Compute returns, and MLX never donates (writes into)
  // a borrowed buffer (kernels/cpu/buffers.h). MLX's GPU backends need their own allocations: copy there (a
  // small input into pinned host memory on CUDA: kernels/cuda/pinned_inputs.h), unless the
  // buffer is one: an allocation of the EP's device allocator (device_memory=1) is
  // MLX's own memory, used in place on any backend (device_buffers.h).
  // (The registry lookup takes a lock: only sessions with device memory pay for it.)
  if (opt_.device_memory && !ops::lowp::is_lowp(t.dtype) && t.data)
    if (auto a = device_buffers::borrow(t.data, ops::to_shape(t.shape), ops::mlx_dtype(t.dtype)))
      return *a;
  if (opt_.gpu && t.data && !ops::lowp::is_lowp(t.dtype) && nbytes_of(t) <= opt_.pinned_inputs)
    if (auto a = kernels::cuda::pinned_copy(t.data, ops::to_shape(t.shape), ops::mlx_dtype(t.dtype))) return *a;
  if (opt_.gpu || ops::lowp::is_lowp(t.dtype) || !t.data) return to_array(t);
  auto dtype = ops::mlx_dtype(t.dtype);
  if (views && nbytes_of(t) >= kInPlaceMinBytes)  // (smaller ones: a copy costs less than a view)
    if (auto a = views->view(t.data, ops::to_shape(t.shape), dtype)) return *a;
  // (Where MLX's allocator can wrap foreign memory, this is a view too; else a copy.)
  return mx::array(const_cast<void*>(t.data), ops::to_shape(t.shape), dtype, [](void*) {});
}

std::vector<mx::array> Program::arguments(const std::vector<HostTensor>& raw, ops::HostViews* views) const {
  // A sequence's items are arguments of their own, so mx::compile sees them as inputs.
  std::vector<mx::array> args;
  for (const auto& t : raw) {
    if (t.kind == HostTensor::Kind::Tensor) args.push_back(input_array(t, views));
    for (const auto& item : t.items) args.push_back(input_array(item, views));
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
  trace::Span span("phase", "build graph");
  if (span.active())
    span.arg("mode", mode == Mode::Probe ? "probe" : mode == Mode::Eager ? "eager" : "compile trace");
  Run run(mode, record, host_deps, s, &stats_);
  run.steps = info;
  // The fused inputs back from the arguments (see arguments()), then the constants.
  std::vector<ops::Value> values;
  std::vector<Taint> taints;
  input_values(args, layout, values, taints);
  auto result = finish_outputs(run_plan(*top_, std::move(values), std::move(taints), run), s);
  if (s.device == mx::Device::cpu) shorten_reshape_chains(result);
  index_check::append_flag(result, run.index_flags, s);
  stats_.translate_ns += elapsed_ns(t0);
  return result;
}

}  // namespace ortmlx::engine
