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
};

class OpContext {
 public:
  OpContext(const graph::Node& node, const graph::Graph& graph,
            std::vector<std::optional<mx::array>> inputs, mx::Stream s, const EngineHooks* hooks)
      : node(node), graph(graph), s(s), inputs_(std::move(inputs)), hooks_(hooks) {}

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

  [[noreturn]] void fail(const std::string& why) const;

 private:
  mx::array host_array(size_t i) const;
  std::vector<std::optional<mx::array>> inputs_;
  const EngineHooks* hooks_;
};

using Outputs = std::vector<mx::array>;
using Check = Support (*)(const NodeQuery&);
using Translate = Outputs (*)(OpContext&);

// dtype bridge (ONNX <-> MLX)
std::optional<mx::Dtype> to_mlx_dtype(DType t);
DType from_mlx_dtype(mx::Dtype t);
mx::Dtype mlx_dtype(DType t);  // throws for unsupported dtypes

// Normalises a possibly negative ONNX axis against rank; throws on out-of-range.
int norm_axis(int64_t axis, int rank, const char* what = "axis");
// int64 ONNX dims -> MLX int32 Shape, with a range check.
mx::Shape to_shape(const std::vector<int64_t>& dims);

}  // namespace ortmlx::ops
