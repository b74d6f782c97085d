// A small, plain-C++ copy of the part of an ONNX graph the EP needs: nodes, attributes, value
// infos and constant initializers. The ABI layer fills it from ORT's OrtGraph; everything below
// (partitioner, op translators, engine) reads only this, so it can be unit-tested without ORT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ortmlx::graph {

// Values are ONNX's TensorProto.DataType numbers (node attributes use them). ORT's element type
// enum agrees up to float4e2m1 (23) and orders the 2-bit types and float8e8m0 differently: the
// ABI layer converts with ep::to_dtype.
enum class DType : int32_t {
  Undefined = 0, Float32 = 1, UInt8 = 2, Int8 = 3, UInt16 = 4, Int16 = 5, Int32 = 6, Int64 = 7,
  String = 8, Bool = 9, Float16 = 10, Float64 = 11, UInt32 = 12, UInt64 = 13, Complex64 = 14,
  Complex128 = 15, BFloat16 = 16, Float8E4M3FN = 17, Float8E4M3FNUZ = 18, Float8E5M2 = 19,
  Float8E5M2FNUZ = 20, UInt4 = 21, Int4 = 22, Float4E2M1 = 23, Float8E8M0 = 24, UInt2 = 25,
  Int2 = 26,
};

const char* dtype_name(DType t);
size_t dtype_size(DType t);  // bytes per element; 0 for sub-byte/string/undefined
bool is_float(DType t);      // fp16/bf16/fp32/fp64
bool is_integer(DType t);    // signed or unsigned integer (not bool)
bool is_signed_integer(DType t);

// A constant tensor: an initializer or a tensor attribute. `data` is only guaranteed valid
// during the ORT callback that produced the view (ORT owns initializer memory) unless `owned`
// keeps alive the memory it points into (tensor attributes, tests, a loaded EPContext payload).
struct ConstTensor {
  DType dtype = DType::Undefined;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owned;
  // The data holds the 2-D constant's transpose ([shape[1], shape[0]] row-major); `shape` stays
  // the constant's own (graph/transpose_weights.h).
  bool transposed = false;

  int64_t numel() const;
  // Element i converted to int64/double (any numeric dtype). Throws on unsupported dtypes.
  int64_t int_at(size_t i) const;
  double float_at(size_t i) const;
  std::vector<int64_t> to_ints() const;
  std::vector<double> to_floats() const;
  static ConstTensor from_bytes(DType dtype, std::vector<int64_t> shape, const void* src,
                                size_t nbytes);
};

// Static knowledge about a value: dtype and (possibly partial) shape. dims[i] < 0 = unknown.
struct ValueInfo {
  std::string name;
  bool is_tensor = true;  // false for sequences, maps, optionals
  // Non-tensors: the container (optional(T) is kind Tensor with `optional` set; optional(seq)
  // is kind Sequence with `optional` set), and `dtype` is the element type of its tensors.
  enum class Kind { Tensor, Sequence, Map, Other };
  Kind kind = Kind::Tensor;
  bool optional = false;
  DType dtype = DType::Undefined;
  bool has_shape = false;
  std::vector<int64_t> dims;
  std::vector<std::string> dim_names;  // symbolic names where ORT gives them

  int rank() const { return has_shape ? static_cast<int>(dims.size()) : -1; }
  bool is_static() const;
};

struct Graph;

enum class AttrType { Undefined, Int, Ints, Float, Floats, String, Strings, Tensor, Graph };

struct Attribute {
  AttrType type = AttrType::Undefined;
  int64_t i = 0;
  float f = 0.f;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  std::shared_ptr<ConstTensor> t;
  std::shared_ptr<const Graph> g;
};

struct Node {
  size_t index = 0;  // position in Graph::nodes (topological order)
  std::string name, op_type, domain;
  int since_version = 0;
  std::vector<std::string> inputs;   // "" marks an omitted optional input
  std::vector<std::string> outputs;  // "" marks an unused optional output
  std::map<std::string, Attribute, std::less<>> attrs;
  // Outer-scope values read inside this node's subgraphs (If/Loop/Scan), as ORT reports them.
  // They are data edges too: the partitioner orders and groups by them.
  std::vector<std::string> implicit_inputs;

  bool has_attr(std::string_view n) const { return attrs.find(n) != attrs.end(); }
  const Attribute* attr(std::string_view n) const;
  int64_t attr_int(std::string_view n, int64_t def) const;
  float attr_float(std::string_view n, float def) const;
  std::string attr_string(std::string_view n, std::string_view def) const;
  std::vector<int64_t> attr_ints(std::string_view n, std::vector<int64_t> def = {}) const;
  std::vector<float> attr_floats(std::string_view n, std::vector<float> def = {}) const;
  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  bool has_output(size_t i) const { return i < outputs.size() && !outputs[i].empty(); }
  std::string describe() const;  // "Op 'name'" for messages
  // The subgraph attributes (then_branch, else_branch, body), in attribute-name order.
  std::vector<std::pair<std::string, const Graph*>> subgraphs() const;
};

struct Graph {
  std::vector<Node> nodes;             // topological order
  std::vector<std::string> inputs;     // graph inputs (non-initializer)
  std::vector<std::string> outputs;    // graph outputs
  std::unordered_map<std::string, ValueInfo> values;
  std::unordered_map<std::string, ConstTensor> constants;  // constant initializers
  std::map<std::string, int> opsets;   // domain -> version
  bool is_subgraph = false;            // a control-flow body

  const ValueInfo* info(std::string_view name) const;
  const ConstTensor* constant(std::string_view name) const;
};

// The names a subgraph reads from enclosing scopes: values its nodes (and, recursively, their
// own subgraphs) use, or it returns, that it neither receives as an input, holds as a constant,
// nor produces. Sorted, unique. An outer-scope *constant* initializer is read into the body's
// `constants` by the ABI layer, so it is not listed here.
std::vector<std::string> outer_names(const Graph& body);

// What a rewrite of a graph's nodes (the fusion passes) needs to know of its values: who reads
// each (node indices, one a read), who produces each, and which must stay as they are (the graph's
// outputs and the values its control-flow bodies read).
struct ValueUses {
  ValueUses(const Graph& g, const std::vector<std::string>& graph_outputs);
  std::unordered_map<std::string, std::vector<size_t>> readers;
  std::unordered_map<std::string, size_t> producer;
  std::unordered_set<std::string> kept;
  // The one node reading `v` (once), when `v` is not kept; else nullptr.
  Node* only_reader(Graph& g, const std::string& v) const;
};

// Drops the nodes marked in `gone` (by index) and renumbers the rest, in order.
void erase_nodes(Graph& g, const std::vector<bool>& gone);

}  // namespace ortmlx::graph
