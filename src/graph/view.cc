#include "graph/view.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

namespace ortmlx::graph {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::UInt16: return "uint16";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::String: return "string";
    case DType::Bool: return "bool";
    case DType::Float16: return "float16";
    case DType::Float64: return "float64";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
    case DType::BFloat16: return "bfloat16";
    case DType::Float8E4M3FN: return "float8e4m3fn";
    case DType::Float8E4M3FNUZ: return "float8e4m3fnuz";
    case DType::Float8E5M2: return "float8e5m2";
    case DType::Float8E5M2FNUZ: return "float8e5m2fnuz";
    case DType::UInt4: return "uint4";
    case DType::Int4: return "int4";
    case DType::Float4E2M1: return "float4e2m1";
    case DType::Float8E8M0: return "float8e8m0";
    case DType::UInt2: return "uint2";
    case DType::Int2: return "int2";
    default: return "undefined";
  }
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Bool: case DType::UInt8: case DType::Int8:
    case DType::Float8E4M3FN: case DType::Float8E4M3FNUZ: case DType::Float8E5M2:
    case DType::Float8E5M2FNUZ: return 1;
    case DType::UInt16: case DType::Int16: case DType::Float16: case DType::BFloat16: return 2;
    case DType::Float32: case DType::Int32: case DType::UInt32: return 4;
    case DType::Float64: case DType::Int64: case DType::UInt64: case DType::Complex64: return 8;
    case DType::Complex128: return 16;
    default: return 0;
  }
}

bool is_float(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 ||
         t == DType::Float64;
}
bool is_signed_integer(DType t) {
  return t == DType::Int8 || t == DType::Int16 || t == DType::Int32 || t == DType::Int64;
}
bool is_integer(DType t) {
  return is_signed_integer(t) || t == DType::UInt8 || t == DType::UInt16 ||
         t == DType::UInt32 || t == DType::UInt64;
}

int64_t ConstTensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {
template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const std::byte*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

double ConstTensor::float_at(size_t i) const {
  if (static_cast<int64_t>(i) >= numel() || !data) throw std::out_of_range("[ConstTensor] index out of range");
  switch (dtype) {
    case DType::Float32: return load<float>(data, i);
    case DType::Float64: return load<double>(data, i);
    case DType::Float16: return half_to_float(load<uint16_t>(data, i));
    case DType::BFloat16: {
      uint32_t bits = static_cast<uint32_t>(load<uint16_t>(data, i)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: return static_cast<double>(int_at(i));
  }
}

int64_t ConstTensor::int_at(size_t i) const {
  if (static_cast<int64_t>(i) >= numel() || !data) throw std::out_of_range("[ConstTensor] index out of range");
  switch (dtype) {
    case DType::Bool: case DType::UInt8: return load<uint8_t>(data, i);
    case DType::Int8: return load<int8_t>(data, i);
    case DType::UInt16: return load<uint16_t>(data, i);
    case DType::Int16: return load<int16_t>(data, i);
    case DType::Int32: return load<int32_t>(data, i);
    case DType::UInt32: return load<uint32_t>(data, i);
    case DType::Int64: return load<int64_t>(data, i);
    case DType::UInt64: return static_cast<int64_t>(load<uint64_t>(data, i));
    case DType::Float32: case DType::Float64: case DType::Float16: case DType::BFloat16:
      return static_cast<int64_t>(float_at(i));
    default:
      throw std::invalid_argument(std::string("[ConstTensor] cannot read dtype ") + dtype_name(dtype));
  }
}

std::vector<int64_t> ConstTensor::to_ints() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = int_at(i);
  return out;
}
std::vector<double> ConstTensor::to_floats() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = float_at(i);
  return out;
}

ConstTensor ConstTensor::from_bytes(DType dtype, std::vector<int64_t> shape, const void* src,
                                    size_t nbytes) {
  ConstTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  auto bytes = std::make_shared<std::vector<std::byte>>(nbytes);
  if (nbytes) std::memcpy(bytes->data(), src, nbytes);
  t.data = bytes->data();
  t.owned = std::move(bytes);
  t.nbytes = nbytes;
  return t;
}

bool ValueInfo::is_static() const {
  if (!has_shape) return false;
  for (auto d : dims)
    if (d < 0) return false;
  return true;
}

const Attribute* Node::attr(std::string_view n) const {
  auto it = attrs.find(n);
  return it == attrs.end() ? nullptr : &it->second;
}
int64_t Node::attr_int(std::string_view n, int64_t def) const {
  auto* a = attr(n);
  return a && a->type == AttrType::Int ? a->i : def;
}
float Node::attr_float(std::string_view n, float def) const {
  auto* a = attr(n);
  return a && a->type == AttrType::Float ? a->f : def;
}
std::string Node::attr_string(std::string_view n, std::string_view def) const {
  auto* a = attr(n);
  return a && a->type == AttrType::String ? a->s : std::string(def);
}
std::vector<int64_t> Node::attr_ints(std::string_view n, std::vector<int64_t> def) const {
  auto* a = attr(n);
  return a && a->type == AttrType::Ints ? a->ints : def;
}
std::vector<float> Node::attr_floats(std::string_view n, std::vector<float> def) const {
  auto* a = attr(n);
  return a && a->type == AttrType::Floats ? a->floats : def;
}
std::string Node::describe() const {
  std::string d = domain.empty() ? op_type : domain + "." + op_type;
  return d + " '" + name + "'";
}

std::vector<std::pair<std::string, const Graph*>> Node::subgraphs() const {
  std::vector<std::pair<std::string, const Graph*>> out;
  for (const auto& [name, a] : attrs)
    if (a.type == AttrType::Graph && a.g) out.emplace_back(name, a.g.get());
  return out;
}

std::vector<std::string> outer_names(const Graph& body) {
  std::set<std::string, std::less<>> defined(body.inputs.begin(), body.inputs.end());
  for (const auto& [name, c] : body.constants) defined.insert(name);
  for (const auto& n : body.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) defined.insert(o);
  std::set<std::string> free;
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name)) free.insert(name);
  };
  for (const auto& n : body.nodes) {
    for (const auto& in : n.inputs) use(in);
    for (const auto& [attr, sub] : n.subgraphs())
      for (const auto& name : outer_names(*sub)) use(name);
  }
  for (const auto& o : body.outputs) use(o);
  return {free.begin(), free.end()};
}

const ValueInfo* Graph::info(std::string_view name) const {
  auto it = values.find(std::string(name));
  return it == values.end() ? nullptr : &it->second;
}
const ConstTensor* Graph::constant(std::string_view name) const {
  auto it = constants.find(std::string(name));
  return it == constants.end() ? nullptr : &it->second;
}

ValueUses::ValueUses(const Graph& g, const std::vector<std::string>& graph_outputs)
    : kept(graph_outputs.begin(), graph_outputs.end()) {
  for (const auto& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.has_input(i)) readers[n.inputs[i]].push_back(n.index);
    for (const auto& o : n.outputs) producer[o] = n.index;
    for (const auto& [attr, body] : n.subgraphs())
      for (const auto& name : outer_names(*body)) kept.insert(name);
  }
}

Node* ValueUses::only_reader(Graph& g, const std::string& v) const {
  auto r = readers.find(v);
  if (kept.count(v) || r == readers.end() || r->second.size() != 1) return nullptr;
  return &g.nodes[r->second[0]];
}

void erase_nodes(Graph& g, const std::vector<bool>& gone) {
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (auto& n : g.nodes)
    if (!gone[n.index]) nodes.push_back(std::move(n));
  for (size_t i = 0; i < nodes.size(); ++i) nodes[i].index = i;
  g.nodes = std::move(nodes);
}

}  // namespace ortmlx::graph
