#include "ops/op_context.h"

#include <climits>

namespace ortmlx::ops {

const graph::ValueInfo* NodeQuery::input_info(size_t i) const {
  return has_input(i) ? graph.info(node.inputs[i]) : nullptr;
}
const graph::ValueInfo* NodeQuery::output_info(size_t i) const {
  return node.has_output(i) ? graph.info(node.outputs[i]) : nullptr;
}
DType NodeQuery::input_dtype(size_t i) const {
  if (auto* c = constant(i)) return c->dtype;
  auto* v = input_info(i);
  return v ? v->dtype : DType::Undefined;
}
DType NodeQuery::output_dtype(size_t i) const {
  auto* v = output_info(i);
  return v ? v->dtype : DType::Undefined;
}
int NodeQuery::input_rank(size_t i) const {
  if (auto* c = constant(i)) return static_cast<int>(c->shape.size());
  auto* v = input_info(i);
  return v ? v->rank() : -1;
}
const graph::ConstTensor* NodeQuery::constant(size_t i) const {
  return has_input(i) ? graph.constant(node.inputs[i]) : nullptr;
}

OpContext::OpContext(const graph::Node& node, const graph::Graph& graph,
                     std::vector<std::optional<mx::array>> inputs, mx::Stream s,
                     const EngineHooks* hooks)
    : node(node), graph(graph), s(s), inputs_(std::move(inputs)), hooks_(hooks) {
  values_.reserve(inputs_.size());
  for (const auto& a : inputs_)
    values_.push_back(a ? std::optional<Value>(Value::of(*a)) : std::nullopt);
}

OpContext::OpContext(const graph::Node& node, const graph::Graph& graph,
                     std::vector<std::optional<Value>> values, mx::Stream s,
                     const EngineHooks* hooks)
    : node(node), graph(graph), s(s), values_(std::move(values)), hooks_(hooks) {
  // Tensor-only translators keep reading in(i)/has(i): a non-tensor input is "not a tensor".
  inputs_.reserve(values_.size());
  for (const auto& v : values_)
    inputs_.push_back(v && v->is_tensor() ? v->tensor : std::nullopt);
}

const Value& OpContext::value(size_t i) const {
  if (!given(i)) fail("input " + std::to_string(i) + " is missing");
  return *values_[i];
}

const std::vector<mx::array>& OpContext::seq_in(size_t i) const {
  const Value& v = value(i);
  if (!v.is_sequence())
    fail("input " + std::to_string(i) + " is " + v.kind_name() + ", expected a sequence");
  return v.items;
}

void OpContext::set_output(size_t j, Value v) {
  if (value_outs_.size() <= j) value_outs_.resize(j + 1);
  value_outs_[j] = std::move(v);
}

std::vector<mx::array> OpContext::emit(std::vector<Value> values) {
  std::vector<mx::array> out;
  out.reserve(values.size());
  for (size_t j = 0; j < values.size(); ++j) {
    if (values[j].is_tensor()) {
      out.push_back(*values[j].tensor);
    } else {
      out.push_back(mx::array(false));  // placeholder: the engine takes the set output
      set_output(j, std::move(values[j]));
    }
  }
  return out;
}

std::vector<Value> OpContext::run_subgraph_values(const graph::Graph& body,
                                                  const std::vector<Value>& inputs) const {
  if (!hooks_ || !hooks_->run_subgraph_values)
    fail("subgraphs need the engine (no run_subgraph_values hook)");
  return hooks_->run_subgraph_values(body, inputs);
}

const mx::array& OpContext::in(size_t i) const {
  if (!has(i))
    fail("input " + std::to_string(i) +
         (given(i) ? " is " + std::string(values_[i]->kind_name()) + ", expected a tensor"
                   : std::string(" is missing")));
  return *inputs_[i];
}

DType OpContext::out_dtype(size_t i) const {
  if (!node.has_output(i)) return DType::Undefined;
  auto* v = graph.info(node.outputs[i]);
  return v ? v->dtype : DType::Undefined;
}

DType OpContext::in_dtype(size_t i) const { return from_mlx_dtype(in(i).dtype()); }

mx::array OpContext::host_array(size_t i) const {
  if (!has(i)) fail("input " + std::to_string(i) + " is missing");
  // The engine hands back an evaluated, row-contiguous array (recorded for compiled replays).
  // Without an engine (unit tests) evaluate here.
  if (hooks_ && hooks_->host_value) return hooks_->host_value(i);
  mx::array a = mx::contiguous(*inputs_[i], false, s);
  a.eval();
  return a;
}

namespace {
// Reads an evaluated, row-contiguous array element by element without building MLX ops, so it
// also works on recorded arrays inside an mx::compile trace.
template <typename Out>
std::vector<Out> read_host(const mx::array& a) {
  std::vector<Out> out(a.size());
  auto copy = [&](auto* p) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<Out>(p[k]);
  };
  switch (a.dtype().val()) {
    case mx::Dtype::Val::bool_: copy(a.data<bool>()); break;
    case mx::Dtype::Val::uint8: copy(a.data<uint8_t>()); break;
    case mx::Dtype::Val::uint16: copy(a.data<uint16_t>()); break;
    case mx::Dtype::Val::uint32: copy(a.data<uint32_t>()); break;
    case mx::Dtype::Val::uint64: copy(a.data<uint64_t>()); break;
    case mx::Dtype::Val::int8: copy(a.data<int8_t>()); break;
    case mx::Dtype::Val::int16: copy(a.data<int16_t>()); break;
    case mx::Dtype::Val::int32: copy(a.data<int32_t>()); break;
    case mx::Dtype::Val::int64: copy(a.data<int64_t>()); break;
    case mx::Dtype::Val::float16: copy(a.data<mx::float16_t>()); break;
    case mx::Dtype::Val::bfloat16: copy(a.data<mx::bfloat16_t>()); break;
    case mx::Dtype::Val::float32: copy(a.data<float>()); break;
    case mx::Dtype::Val::float64: copy(a.data<double>()); break;
    default: throw TranslateError("[host read] unsupported dtype");
  }
  return out;
}
}  // namespace

std::vector<int64_t> evaluated_ints(const mx::array& a) { return read_host<int64_t>(a); }
std::vector<double> evaluated_floats(const mx::array& a) { return read_host<double>(a); }

std::vector<int64_t> OpContext::host_ints(size_t i) const { return read_host<int64_t>(host_array(i)); }
std::vector<double> OpContext::host_floats(size_t i) const { return read_host<double>(host_array(i)); }

int64_t OpContext::host_int(size_t i) const {
  auto v = host_ints(i);
  if (v.empty()) fail("input " + std::to_string(i) + " is empty where a scalar is expected");
  return v[0];
}
double OpContext::host_float(size_t i) const {
  auto v = host_floats(i);
  if (v.empty()) fail("input " + std::to_string(i) + " is empty where a scalar is expected");
  return v[0];
}

std::vector<mx::array> OpContext::run_subgraph(const graph::Graph& body,
                                               const std::vector<mx::array>& inputs) const {
  if (!hooks_ || !hooks_->run_subgraph) fail("subgraphs need the engine (no run_subgraph hook)");
  return hooks_->run_subgraph(body, inputs);
}

std::vector<mx::array> OpContext::shared_result(const std::string& key, const std::vector<mx::array>& of,
                                                const std::function<std::vector<mx::array>()>& make) const {
  if (hooks_ && hooks_->translation_memo) return hooks_->translation_memo(key, of, make);
  return make();
}

mx::array OpContext::prepared(const std::string& key, const std::vector<size_t>& inputs,
                              const std::function<mx::array()>& make) const {
  if (hooks_ && hooks_->constant_memo) return hooks_->constant_memo(key, inputs, make);
  return make();
}

int64_t OpContext::host_scalar(const mx::array& value) const {
  mx::array a = value;
  if (hooks_ && hooks_->host_eval) {
    a = hooks_->host_eval(value);
  } else {
    a = mx::contiguous(value, false, s);
    a.eval();
  }
  auto v = read_host<int64_t>(a);
  if (v.empty()) fail("an empty tensor where a scalar is expected");
  return v[0];
}

void OpContext::fail(const std::string& why) const {
  // The engine names the node (op and name) around this, once.
  throw TranslateError(why);
}

std::optional<mx::Dtype> to_mlx_dtype(DType t) {
  switch (t) {
    case DType::Float32: return mx::float32;
    case DType::Float16: return mx::float16;
    case DType::BFloat16: return mx::bfloat16;
    case DType::Float64: return mx::float64;
    case DType::Int8: return mx::int8;
    case DType::Int16: return mx::int16;
    case DType::Int32: return mx::int32;
    case DType::Int64: return mx::int64;
    case DType::UInt8: return mx::uint8;
    case DType::UInt16: return mx::uint16;
    case DType::UInt32: return mx::uint32;
    case DType::UInt64: return mx::uint64;
    case DType::Bool: return mx::bool_;
    default: return std::nullopt;
  }
}

mx::Dtype mlx_dtype(DType t) {
  auto d = to_mlx_dtype(t);
  if (!d) throw std::invalid_argument(std::string("[dtype] MLX has no ") + graph::dtype_name(t));
  return *d;
}

DType from_mlx_dtype(mx::Dtype t) {
  switch (t.val()) {
    case mx::Dtype::Val::float32: return DType::Float32;
    case mx::Dtype::Val::float16: return DType::Float16;
    case mx::Dtype::Val::bfloat16: return DType::BFloat16;
    case mx::Dtype::Val::float64: return DType::Float64;
    case mx::Dtype::Val::int8: return DType::Int8;
    case mx::Dtype::Val::int16: return DType::Int16;
    case mx::Dtype::Val::int32: return DType::Int32;
    case mx::Dtype::Val::int64: return DType::Int64;
    case mx::Dtype::Val::uint8: return DType::UInt8;
    case mx::Dtype::Val::uint16: return DType::UInt16;
    case mx::Dtype::Val::uint32: return DType::UInt32;
    case mx::Dtype::Val::uint64: return DType::UInt64;
    case mx::Dtype::Val::bool_: return DType::Bool;
    case mx::Dtype::Val::complex64: return DType::Complex64;
    default: return DType::Undefined;
  }
}

int norm_axis(int64_t axis, int rank, const char* what) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1))
    throw TranslateError(std::string("[") + what + "] " + std::to_string(axis) +
                         " is out of range for rank " + std::to_string(rank));
  return static_cast<int>(a);
}

mx::Shape to_shape(const std::vector<int64_t>& dims) {
  mx::Shape s;
  s.reserve(dims.size());
  for (auto d : dims) {
    if (d < 0 || d > INT32_MAX)
      throw TranslateError("[shape] dimension " + std::to_string(d) +
                           " does not fit MLX's int32 dims");
    s.push_back(static_cast<int32_t>(d));
  }
  return s;
}

}  // namespace ortmlx::ops
