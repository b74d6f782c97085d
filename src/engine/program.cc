#include "engine/program.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace ortmlx::engine {

using graph::DType;

namespace {

// Host reads of values derived from these ops depend only on shapes, never on tensor data.
bool shape_only_op(const graph::Node& n) {
  return n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size");
}

std::string shape_str(const mx::array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.shape().size(); ++i) s += (i ? "," : "") + std::to_string(a.shape()[i]);
  return s + "]";
}

constexpr int64_t kMaxKeyedElements = 4096;  // larger host-read inputs force eager instead

}  // namespace

Program::Program(std::string name, const graph::Graph& g, std::vector<std::string> input_names,
                 std::vector<std::string> output_names, Options opt)
    : name_(std::move(name)), graph_(g), input_names_(std::move(input_names)),
      output_names_(std::move(output_names)), opt_(opt) {
  std::unordered_map<std::string, int> slot;
  for (size_t i = 0; i < input_names_.size(); ++i) slot.emplace(input_names_[i], static_cast<int>(i));
  int next = static_cast<int>(input_names_.size());
  // Constant initializers read by the group become arrays now (one copy, owned by MLX).
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs) {
      if (in.empty() || slot.count(in)) continue;
      if (auto* c = g.constant(in)) {
        HostTensor t{c->dtype, c->shape, c->data};
        constants_.push_back(to_array(t));
        slot.emplace(in, next++);
      }
    }
  graph_.constants.clear();  // their data pointers die with the ORT callback
  for (const auto& n : graph_.nodes) {
    const auto* e = ops::find_op(n.domain, n.op_type, n.since_version);
    if (!e) throw std::runtime_error("[engine] no translator for " + n.describe());
    entries_.push_back(e);
    StepIO io;
    for (const auto& in : n.inputs) {
      if (in.empty()) { io.in.push_back(-1); continue; }
      auto it = slot.find(in);
      if (it == slot.end())
        throw std::runtime_error("[engine] " + n.describe() + ": input '" + in +
                                 "' has no producer in the fused group");
      io.in.push_back(it->second);
    }
    for (const auto& out : n.outputs) {
      if (out.empty()) { io.out.push_back(-1); continue; }
      io.out.push_back(next);
      slot[out] = next++;
    }
    steps_.push_back(std::move(io));
  }
  for (const auto& o : output_names_) {
    auto it = slot.find(o);
    if (it == slot.end()) throw std::runtime_error("[engine] output '" + o + "' is not produced");
    output_slots_.push_back(it->second);
    auto* vi = graph_.info(o);
    output_dtypes_.push_back(vi ? vi->dtype : DType::Undefined);
  }
  num_slots_ = static_cast<size_t>(next);
  keyed_inputs_.assign(input_names_.size(), false);
}

mx::array Program::to_array(const HostTensor& t) {
  auto dtype = ops::mlx_dtype(t.dtype);
  auto shape = ops::to_shape(t.shape);
  size_t numel = 1;
  for (auto d : shape) numel *= static_cast<size_t>(d);
  size_t nbytes = numel * dtype.size();
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

std::string Program::describe_failure(size_t k, const std::vector<mx::array>& args,
                                      const std::string& what) const {
  (void)args;
  const auto& n = graph_.nodes[k];
  std::ostringstream os;
  os << "[MLX EP] fused node '" << name_ << "': " << n.describe() << " failed: " << what;
  return os.str();
}

std::vector<mx::array> Program::translate(const std::vector<mx::array>& args, Mode mode,
                                          HostRecord* record, std::vector<int>* host_deps,
                                          mx::Stream s) const {
  const size_t n_in = input_names_.size();
  std::vector<std::optional<mx::array>> slots(num_slots_);
  // taint[slot]: the fused inputs whose data flow into the value (shape reads reset it).
  std::vector<std::vector<int>> taint(num_slots_);
  for (size_t i = 0; i < args.size(); ++i) slots[i] = args[i];
  for (size_t i = 0; i < n_in; ++i) taint[i] = {static_cast<int>(i)};

  for (size_t k = 0; k < steps_.size(); ++k) {
    const auto& node = graph_.nodes[k];
    const auto& io = steps_[k];
    std::vector<std::optional<mx::array>> inputs;
    inputs.reserve(io.in.size());
    std::vector<int> node_taint;
    for (int sl : io.in) {
      if (sl < 0) { inputs.emplace_back(); continue; }
      inputs.push_back(slots[sl]);
      node_taint.insert(node_taint.end(), taint[sl].begin(), taint[sl].end());
    }
    std::sort(node_taint.begin(), node_taint.end());
    node_taint.erase(std::unique(node_taint.begin(), node_taint.end()), node_taint.end());

    ops::EngineHooks hooks;
    hooks.host_value = [&, k](size_t idx) -> mx::array {
      if (mode == Mode::Replay) {
        auto it = record->find({k, idx});
        if (it == record->end())
          throw std::runtime_error("[engine] replay read a host value the probe did not record");
        return it->second;
      }
      int sl = io.in.at(idx);
      mx::array a = mx::contiguous(*slots.at(sl), false, s);
      a.eval();
      if (host_deps) host_deps->insert(host_deps->end(), taint[sl].begin(), taint[sl].end());
      if (record) record->insert_or_assign({k, idx}, a);
      return a;
    };
    ops::OpContext ctx(node, graph_, std::move(inputs), s, &hooks);
    ops::Outputs outs;
    try {
      outs = entries_[k]->translate(ctx);
    } catch (const std::exception& e) {
      std::ostringstream os;
      os << e.what() << " (inputs:";
      for (size_t i = 0; i < io.in.size(); ++i) {
        if (io.in[i] < 0) { os << " -"; continue; }
        const auto& a = *slots[io.in[i]];
        os << " " << node.inputs[i] << " " << shape_str(a) << " "
           << graph::dtype_name(ops::from_mlx_dtype(a.dtype()));
      }
      os << ")";
      // Keep the category: invalid_argument (bad shapes/values from the caller) becomes
      // ORT_INVALID_ARGUMENT at the error wall, anything else ORT_EP_FAIL. ORT's Python
      // wrapper silently retries EP_FAIL runs on the CPU EP, which would hide input errors.
      if (dynamic_cast<const std::invalid_argument*>(&e))
        throw std::invalid_argument(describe_failure(k, args, os.str()));
      throw std::runtime_error(describe_failure(k, args, os.str()));
    }
    for (size_t j = 0; j < io.out.size(); ++j) {
      if (io.out[j] < 0) continue;
      if (j >= outs.size())
        throw std::runtime_error(describe_failure(k, args, "translator produced " +
                                 std::to_string(outs.size()) + " outputs, node needs output " +
                                 std::to_string(j)));
      slots[io.out[j]] = outs[j];
      if (!shape_only_op(node)) taint[io.out[j]] = node_taint;
    }
  }
  std::vector<mx::array> result;
  result.reserve(output_slots_.size());
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    mx::array a = *slots[output_slots_[i]];
    // Safety net for declared output dtypes (ONNX promotion rules are stricter than MLX's).
    if (output_dtypes_[i] != DType::Undefined) {
      if (auto d = ops::to_mlx_dtype(output_dtypes_[i]); d && a.dtype() != *d) a = mx::astype(a, *d, s);
    }
    result.push_back(mx::contiguous(a, false, s));
  }
  return result;
}

std::string Program::signature_of(const std::vector<mx::array>& inputs,
                                  const std::vector<HostTensor>& raw) const {
  std::string sig;
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto& a = inputs[i];
    sig += std::to_string(static_cast<int>(raw[i].dtype)) + ":";
    for (auto d : a.shape()) sig += std::to_string(d) + ",";
    if (keyed_inputs_[i]) sig.append(static_cast<const char*>(raw[i].data) ? "=" : "");
    if (keyed_inputs_[i] && raw[i].data)
      sig.append(static_cast<const char*>(raw[i].data), a.nbytes());
    sig += ";";
  }
  return sig;
}

std::vector<mx::array> Program::run(const std::vector<HostTensor>& raw) {
  if (raw.size() != input_names_.size())
    throw std::invalid_argument("[MLX EP] fused node '" + name_ + "' expects " +
                                std::to_string(input_names_.size()) + " inputs, got " +
                                std::to_string(raw.size()));
  std::vector<mx::array> args;
  args.reserve(raw.size() + constants_.size());
  for (const auto& t : raw) args.push_back(to_array(t));
  args.insert(args.end(), constants_.begin(), constants_.end());

  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.runs;
  // MLX's default stream is per thread (0.31.2+): compiled functions are keyed by it too.
  mx::Stream s = mx::default_stream(device());
  auto eval_all = [](std::vector<mx::array> outs) {
    mx::eval(outs);
    return outs;
  };

  std::string sig = signature_of(args, raw) + "#" + std::to_string(s.index);
  auto it = cache_.find(sig);
  if (it == cache_.end()) {
    // Probe: translate with the real data, learning which host reads the graph makes and
    // whether they depend only on shapes (compilable) or on tensor data (eager only).
    Entry entry;
    std::vector<mx::array> outs;
    for (;;) {
      HostRecord record;
      std::vector<int> deps;
      outs = translate(args, Mode::Probe, &record, &deps, s);
      bool restart = false, data_dependent = false;
      for (int d : deps) {
        if (keyed_inputs_[d]) continue;
        int64_t numel = 1;
        for (auto x : raw[d].shape) numel *= x;
        if (numel <= kMaxKeyedElements) {
          keyed_inputs_[d] = true;  // e.g. a shape tensor computed on the CPU EP
          restart = true;
        } else {
          data_dependent = true;
        }
      }
      entry.record = std::move(record);
      entry.eager_only = data_dependent || !opt_.compile;
      if (!restart) break;
      sig = signature_of(args, raw) + "#" + std::to_string(s.index);
      if (cache_.count(sig)) break;
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
  if (!e.eager_only && !compile_broken_ && !e.fn && e.hits >= opt_.compile_after) {
    auto record = std::make_shared<HostRecord>(e.record);
    e.fn = mx::compile(
        [this, record, s](const std::vector<mx::array>& a) {
          return translate(a, Mode::Replay, record.get(), nullptr, s);
        },
        /*shapeless=*/false);
    ++stats_.traces;
  }
  if (e.fn && !compile_broken_) {
    try {
      auto outs = eval_all(e.fn(args));
      ++stats_.compiled_runs;
      return outs;
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
  return eval_all(translate(args, Mode::Eager, nullptr, nullptr, s));
}

}  // namespace ortmlx::engine
