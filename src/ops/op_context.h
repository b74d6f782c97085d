// What an op's support check and translator see. No ORT types here: checks read the plain
// graph view, translators get mx::arrays plus a hook to read small inputs on the host.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "graph/view.h"

namespace ortmlx::ops {

namespace mx = mlx::core;
using graph::DType;

// A claim-time verdict; `reason` says why a node is declined (shown by the verbose log and the
// Python side).
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Claim-time view of one node inside its graph.
struct NodeQuery {
  const graph::Graph& graph;
  const graph::Node& node;
  bool gpu = false;  // the EP's device is a GPU (float64 unsupported there)

  size_t num_inputs() const { return node.inputs.size(); }
  bool has_input(size_t i) const { return node.has_input(i); }
  const graph::ValueInfo* input_info(size_t i) const;
  const graph::ValueInfo* output_info(size_t i) const;
  DType input_dtype(size_t i) const;
  DType output_dtype(size_t i) const;
  int input_rank(size_t i) const;  // -1 when unknown
  // The constant value of input i when it is a constant initializer, else nullptr.
  const graph::ConstTensor* constant(size_t i) const;
};

// Thrown by translators for inputs they cannot handle at run time (shapes only known then).
struct TranslateError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A value flowing between the nodes of a fused group. Mostly a tensor; ONNX also has sequences
// (seq(tensor)) and optionals. An optional holding an element is carried as that element (a
// tensor or a sequence), so the only new kinds are a sequence -- a host-side list of arrays:
// MLX has no list type, and ONNX sequences may hold tensors of different shapes -- and "none",
// an optional without an element. A sequence's length is therefore structural: it follows
// from the input signature and the recorded host reads (split sizes, loop trip counts,
// positions), so a compiled replay, keyed by those, rebuilds the same list.
struct Value {
  enum class Kind { Tensor, Sequence, None };
  Kind kind = Kind::None;
  std::optional<mx::array> tensor;  // Kind::Tensor
  std::vector<mx::array> items;     // Kind::Sequence
  DType elem = DType::Undefined;    // Kind::Sequence: element dtype (an empty one has no item)

  static Value of(mx::array a) { return {Kind::Tensor, std::move(a), {}, DType::Undefined}; }
  static Value sequence(std::vector<mx::array> items, DType elem) {
    return {Kind::Sequence, std::nullopt, std::move(items), elem};
  }
  static Value none() { return {}; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  bool is_sequence() const { return kind == Kind::Sequence; }
  bool is_none() const { return kind == Kind::None; }
  const char* kind_name() const {
    return kind == Kind::Tensor ? "a tensor" : kind == Kind::Sequence ? "a sequence" : "an empty optional";
  }
};

// Engine services a translator may call back into (filled by the engine).
struct EngineHooks {
  // Evaluate input `index` of the current node on the host. The engine records the value so a
  // compiled replay sees the same number; it decides whether that is valid (shape-derived) or
  // the program must stay eager for this input signature.
  std::function<mx::array(size_t index)> host_value;
  // Translates a subgraph of the current node (If/Loop/Scan body, one of its Graph attributes)
  // on `inputs`, the body's formal inputs in order, and returns its outputs. The engine
  // resolves the body's constants and the outer-scope values it reads (the node's implicit
  // inputs, or values of an enclosing body), and reuses the per-node translate loop, so
  // nested bodies recurse.
  std::function<std::vector<mx::array>(const graph::Graph& body,
                                       const std::vector<mx::array>& inputs)>
      run_subgraph;
  // Evaluates an array the translator built (e.g. a Loop body's condition output) on the
  // host; recorded and tracked exactly like host_value.
  std::function<mx::array(const mx::array& value)> host_eval;
  // run_subgraph for bodies whose inputs or outputs may be sequences or optionals.
  std::function<std::vector<Value>(const graph::Graph& body, const std::vector<Value>& inputs)>
      run_subgraph_values;
  // Prepare-once: when every listed input of the node is a constant initializer, returns the
  // evaluated result of `make` cached for the program's lifetime (keyed by node and `key`);
  // otherwise `make()` itself. For layouts derived from weights (dequantized, repacked, ...),
  // which would otherwise be recomputed by every run that is not a compiled replay. A key that
  // starts with "shared:" is shared by every node of the graph (scope) that uses it: it must name
  // what the result derives from (the initializers' names), e.g. tables all layers read.
  std::function<mx::array(const std::string& key, const std::vector<size_t>& inputs,
                          const std::function<mx::array()>& make)>
      constant_memo;
  // Within one translation (a probe, an eager run, one compile or segment trace): the result of
  // `make` for `key` over exactly these arrays (by identity), built by the first node that asks
  // and shared by the nodes after it. For values many nodes derive alike from the same inputs,
  // which MLX would otherwise compute once per node: the rotary rows every layer gathers for the
  // same position ids. Never across translations (a trace's arrays are its own placeholders).
  std::function<std::vector<mx::array>(const std::string& key, const std::vector<mx::array>& of,
                                       const std::function<std::vector<mx::array>()>& make)>
      translation_memo;
  // Whether input `index` of the node is a constant initializer (so constant_memo caches).
  std::function<bool(size_t index)> is_constant;
  // MatMulNBits with accuracy_level 4: quantize A to int8 per block as ORT's CPU EP does (the
  // reference on the CPU), or keep A in float (what ORT's GPU EPs do; faster on MLX's GPU).
  bool emulate_int8_activations = true;
  // Index tensors (OpContext::checked_indices). Off: indices are only clipped (no error).
  bool index_checks = true;
  // Set while the engine re-translates a run whose flag came back set: check on the host now.
  bool index_diagnose = false;
  // Takes a scalar bool, true when some run-time index is out of range; the engine evaluates
  // it together with the outputs (no extra sync) and fails the run when it is set.
  std::function<void(const mx::array& bad)> index_flag;
  // The constant initializer behind input `index` (a compile trace holds placeholders).
  std::function<std::optional<mx::array>(size_t index)> constant_value;
};

class OpContext {
 public:
  OpContext(const graph::Node& node, const graph::Graph& graph,
            std::vector<std::optional<mx::array>> inputs, mx::Stream s, const EngineHooks* hooks);
  // Inputs of any kind (tensors, sequences, empty optionals); tensor inputs also answer in().
  OpContext(const graph::Node& node, const graph::Graph& graph,
            std::vector<std::optional<Value>> values, mx::Stream s, const EngineHooks* hooks);

  const graph::Node& node;
  const graph::Graph& graph;
  mx::Stream s;  // pass to every MLX op

  size_t num_inputs() const { return inputs_.size(); }
  bool has(size_t i) const { return i < inputs_.size() && inputs_[i].has_value(); }
  const mx::array& in(size_t i) const;
  // The ONNX dtype declared for output i (from shape inference); Undefined when unknown.
  DType out_dtype(size_t i) const;
  DType in_dtype(size_t i) const;

  // Small parameter inputs (shapes, axes, pads, k, ...) read on the host.
  std::vector<int64_t> host_ints(size_t i) const;
  std::vector<double> host_floats(size_t i) const;
  int64_t host_int(size_t i) const;
  double host_float(size_t i) const;

  // Control flow: run a subgraph attribute of this node (see EngineHooks::run_subgraph), and
  // read an array computed during translation on the host (first element, as int64).
  std::vector<mx::array> run_subgraph(const graph::Graph& body,
                                      const std::vector<mx::array>& inputs) const;
  int64_t host_scalar(const mx::array& value) const;
  // See EngineHooks::constant_memo (without an engine: make()).
  mx::array prepared(const std::string& key, const std::vector<size_t>& inputs,
                     const std::function<mx::array()>& make) const;
  // See EngineHooks::translation_memo (without an engine: make()).
  std::vector<mx::array> shared_result(const std::string& key, const std::vector<mx::array>& of,
                                       const std::function<std::vector<mx::array>()>& make) const;
  bool is_constant(size_t i) const { return hooks_ && hooks_->is_constant && hooks_->is_constant(i); }
  bool emulate_int8_activations() const { return !hooks_ || hooks_->emulate_int8_activations; }

  // Sequences and optionals. `given(i)`: input i is there, of any kind (has(i) is true only
  // for tensors). A translator producing a non-tensor output j calls set_output(j, v); the
  // engine takes that instead of the j-th returned array (return fewer arrays, or a placeholder).
  bool given(size_t i) const { return i < values_.size() && values_[i].has_value(); }
  const Value& value(size_t i) const;
  const std::vector<mx::array>& seq_in(size_t i) const;  // fails unless input i is a sequence
  void set_output(size_t j, Value v);
  // Returns `values` as the node's outputs: tensors as arrays, the others through set_output.
  std::vector<mx::array> emit(std::vector<Value> values);
  const std::vector<std::optional<Value>>& value_outputs() const { return value_outs_; }
  std::vector<Value> run_subgraph_values(const graph::Graph& body,
                                         const std::vector<Value>& inputs) const;

  [[noreturn]] void fail(const std::string& why) const;

  // ONNX makes out-of-range indices an error (ORT's INVALID_ARGUMENT). Element e of `idx` must
  // lie in [-d, d - 1] (or [0, d - 1] without `negative`), d = dims[e % dims.size()] (one bound,
  // or one per last-axis column). Indices known on the host (constants, folds, inputs already
  // there) are checked now; others through EngineHooks::index_flag. `input`: the node input
  // `idx` is, unchanged (-1: derived). Returns `idx`, clipped unless checked on the host.
  mx::array checked_indices(const mx::array& idx, const std::vector<int64_t>& dims, bool negative,
                            const std::string& what, int input = -1) const;

 private:
  mx::array host_array(size_t i) const;
  std::vector<std::optional<mx::array>> inputs_;
  std::vector<std::optional<Value>> values_;
  std::vector<std::optional<Value>> value_outs_;
  const EngineHooks* hooks_;
};

using Outputs = std::vector<mx::array>;
using Check = Support (*)(const NodeQuery&);
using Translate = Outputs (*)(OpContext&);

// dtype bridge (ONNX <-> MLX)
std::optional<mx::Dtype> to_mlx_dtype(DType t);
// An evaluated, row-contiguous array's elements as int64 (any numeric dtype; floats truncate).
std::vector<int64_t> evaluated_ints(const mx::array& a);
// The same as double (any numeric dtype).
std::vector<double> evaluated_floats(const mx::array& a);
DType from_mlx_dtype(mx::Dtype t);
mx::Dtype mlx_dtype(DType t);  // throws for unsupported dtypes

// Normalises a possibly negative ONNX axis against rank; throws on out-of-range.
int norm_axis(int64_t axis, int rank, const char* what = "axis");
// int64 ONNX dims -> MLX int32 Shape, with a range check.
mx::Shape to_shape(const std::vector<int64_t>& dims);

}  // namespace ortmlx::ops
