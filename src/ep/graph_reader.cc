#include "ep/graph_reader.h"

#include <cstring>

namespace ortmlx::ep {

namespace {

struct TypeInfoDeleter {
  void operator()(OrtTypeInfo* t) const { if (t) g_ort->ReleaseTypeInfo(t); }
};

std::string value_name(const OrtValueInfo* v) {
  if (!v) return {};
  const char* name = nullptr;
  check(g_ort->GetValueInfoName(v, &name));
  return name ? name : "";
}

graph::ValueInfo read_value_info(const OrtValueInfo* v) {
  graph::ValueInfo vi;
  vi.name = value_name(v);
  const OrtTypeInfo* type = nullptr;
  check(g_ort->GetValueInfoTypeInfo(v, &type));
  if (!type) return vi;
  ONNXType onnx_type = ONNX_TYPE_UNKNOWN;
  check(g_ort->GetOnnxTypeFromTypeInfo(type, &onnx_type));
  // Optionals and sequences: note the container, then read the tensor type inside (its
  // element type; an optional tensor's shape too). The inner OrtTypeInfos are copies we free.
  std::vector<std::unique_ptr<OrtTypeInfo, TypeInfoDeleter>> inner;
  auto descend = [&](OrtTypeInfo* t) {
    inner.emplace_back(t);
    type = t;
    onnx_type = ONNX_TYPE_UNKNOWN;
    if (t) check(g_ort->GetOnnxTypeFromTypeInfo(t, &onnx_type));
  };
  if (onnx_type == ONNX_TYPE_OPTIONAL) {
    vi.is_tensor = false;
    vi.optional = true;
    const OrtOptionalTypeInfo* o = nullptr;
    check(g_ort->CastTypeInfoToOptionalTypeInfo(type, &o));
    OrtTypeInfo* contained = nullptr;
    if (o) check(g_ort->GetOptionalContainedTypeInfo(o, &contained));
    descend(contained);
  }
  if (onnx_type == ONNX_TYPE_SEQUENCE) {
    vi.is_tensor = false;
    vi.kind = graph::ValueInfo::Kind::Sequence;
    const OrtSequenceTypeInfo* sq = nullptr;
    check(g_ort->CastTypeInfoToSequenceTypeInfo(type, &sq));
    OrtTypeInfo* elem = nullptr;
    if (sq) check(g_ort->GetSequenceElementType(sq, &elem));
    descend(elem);
    if (onnx_type != ONNX_TYPE_TENSOR) {  // a sequence of maps or of sequences
      vi.kind = graph::ValueInfo::Kind::Other;
      return vi;
    }
    const OrtTensorTypeAndShapeInfo* einfo = nullptr;
    check(g_ort->CastTypeInfoToTensorInfo(type, &einfo));
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    if (einfo) check(g_ort->GetTensorElementType(einfo, &et));
    vi.dtype = to_dtype(et);  // items may differ in shape: none is kept
    return vi;
  }
  if (onnx_type != ONNX_TYPE_TENSOR) {
    vi.is_tensor = false;
    vi.kind = onnx_type == ONNX_TYPE_MAP ? graph::ValueInfo::Kind::Map
                                         : graph::ValueInfo::Kind::Other;
    return vi;
  }
  const OrtTensorTypeAndShapeInfo* tinfo = nullptr;
  check(g_ort->CastTypeInfoToTensorInfo(type, &tinfo));
  if (!tinfo) return vi;
  ONNXTensorElementDataType et;
  check(g_ort->GetTensorElementType(tinfo, &et));
  vi.dtype = to_dtype(et);
  size_t rank = 0;
  check(g_ort->GetDimensionsCount(tinfo, &rank));
  vi.dims.resize(rank);
  check(g_ort->GetDimensions(tinfo, vi.dims.data(), rank));
  std::vector<const char*> sym(rank, nullptr);
  check(g_ort->GetSymbolicDimensions(tinfo, sym.data(), rank));
  vi.dim_names.resize(rank);
  for (size_t i = 0; i < rank; ++i) vi.dim_names[i] = sym[i] ? sym[i] : "";
  // ORT reports an unknown rank as rank 0 with no dims, as it does for a real scalar; from API
  // 1.24 TensorTypeAndShape_HasShape tells them apart. Reading "unknown" as rank 0 would make
  // rank checks decline nodes (MatMul's "rank >= 1") whose inputs simply had no inferred shape.
  // Older hosts lack the call: their rank-0 reports stay trusted, and run time checks catch the
  // difference.
  vi.has_shape = g_api_version < 24 || g_ort->TensorTypeAndShape_HasShape(tinfo);
  return vi;
}

// Reads a constant initializer (pointer into ORT memory). Returns false for non-constants.
bool read_constant(const OrtValueInfo* v, graph::ConstTensor& out) {
  bool is_const = false;
  check(g_ort->ValueInfo_IsConstantInitializer(v, &is_const));
  if (!is_const) return false;
  const OrtValue* value = nullptr;
  check(g_ort->ValueInfo_GetInitializerValue(v, &value));
  if (!value) return false;
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(g_ort->GetTensorTypeAndShape(value, &raw));
  TypeShapePtr info(raw);
  ONNXTensorElementDataType et;
  check(g_ort->GetTensorElementType(info.get(), &et));
  size_t rank = 0;
  check(g_ort->GetDimensionsCount(info.get(), &rank));
  out.shape.resize(rank);
  check(g_ort->GetDimensions(info.get(), out.shape.data(), rank));
  out.dtype = to_dtype(et);
  if (out.dtype == graph::DType::String) return false;
  const void* data = nullptr;
  check(g_ort->GetTensorData(value, &data));
  size_t nbytes = 0;
  check(g_ort->GetTensorSizeInBytes(value, &nbytes));
  out.data = data;
  out.nbytes = nbytes;
  return true;
}

std::vector<const OrtValueInfo*> inputs_of(const OrtNode* n) {
  size_t count = 0;
  check(g_ort->Node_GetNumInputs(n, &count));
  std::vector<const OrtValueInfo*> v(count);
  if (count) check(g_ort->Node_GetInputs(n, v.data(), count));
  return v;
}
std::vector<const OrtValueInfo*> outputs_of(const OrtNode* n) {
  size_t count = 0;
  check(g_ort->Node_GetNumOutputs(n, &count));
  std::vector<const OrtValueInfo*> v(count);
  if (count) check(g_ort->Node_GetOutputs(n, v.data(), count));
  return v;
}

graph::Attribute read_attribute(const OrtOpAttr* a) {
  graph::Attribute out;
  OrtOpAttrType type;
  // Attribute kinds the C API has no type for (a TypeProto, e.g. Optional's `type`, or sparse
  // tensors) fail here: keep them as Undefined rather than failing the whole graph read.
  if (OrtStatus* st = g_ort->OpAttr_GetType(a, &type)) {
    g_ort->ReleaseStatus(st);
    return out;
  }
  size_t size = 0;
  auto read_raw = [&](void* dst, size_t len) {
    check(g_ort->ReadOpAttr(a, type, dst, len, &size));
  };
  // Probe the needed size: ReadOpAttr fails with the required byte count when len is too small.
  auto needed = [&]() -> size_t {
    size_t req = 0;
    OrtStatus* st = g_ort->ReadOpAttr(a, type, nullptr, 0, &req);
    if (st) g_ort->ReleaseStatus(st);
    return req;
  };
  switch (type) {
    case ORT_OP_ATTR_INT:
      out.type = graph::AttrType::Int;
      read_raw(&out.i, sizeof(out.i));
      break;
    case ORT_OP_ATTR_FLOAT:
      out.type = graph::AttrType::Float;
      read_raw(&out.f, sizeof(out.f));
      break;
    case ORT_OP_ATTR_INTS: {
      out.type = graph::AttrType::Ints;
      size_t n = needed();
      out.ints.resize(n / sizeof(int64_t));
      if (n) read_raw(out.ints.data(), n);
      break;
    }
    case ORT_OP_ATTR_FLOATS: {
      out.type = graph::AttrType::Floats;
      size_t n = needed();
      out.floats.resize(n / sizeof(float));
      if (n) read_raw(out.floats.data(), n);
      break;
    }
    case ORT_OP_ATTR_STRING: {
      out.type = graph::AttrType::String;
      size_t n = needed();
      out.s.resize(n);
      if (n) read_raw(out.s.data(), n);
      while (!out.s.empty() && out.s.back() == '\0') out.s.pop_back();
      break;
    }
    case ORT_OP_ATTR_STRINGS: {
      // Packed as consecutive NUL-terminated strings.
      out.type = graph::AttrType::Strings;
      size_t n = needed();
      std::string buf(n, '\0');
      if (n) read_raw(buf.data(), n);
      size_t start = 0;
      for (size_t i = 0; i < buf.size(); ++i)
        if (buf[i] == '\0') {
          out.strings.push_back(buf.substr(start, i - start));
          start = i + 1;
        }
      break;
    }
    case ORT_OP_ATTR_TENSOR: {
      out.type = graph::AttrType::Tensor;
      OrtValue* raw_value = nullptr;
      check(g_ort->OpAttr_GetTensorAttributeAsOrtValue(a, &raw_value));
      ValuePtr value(raw_value);
      OrtTensorTypeAndShapeInfo* raw = nullptr;
      check(g_ort->GetTensorTypeAndShape(value.get(), &raw));
      TypeShapePtr info(raw);
      ONNXTensorElementDataType et;
      check(g_ort->GetTensorElementType(info.get(), &et));
      size_t rank = 0;
      check(g_ort->GetDimensionsCount(info.get(), &rank));
      std::vector<int64_t> shape(rank);
      check(g_ort->GetDimensions(info.get(), shape.data(), rank));
      auto dtype = to_dtype(et);
      if (dtype == graph::DType::String) break;  // not representable; checks decline
      const void* data = nullptr;
      check(g_ort->GetTensorData(value.get(), &data));
      size_t nbytes = 0;
      check(g_ort->GetTensorSizeInBytes(value.get(), &nbytes));
      out.t = std::make_shared<graph::ConstTensor>(
          graph::ConstTensor::from_bytes(dtype, std::move(shape), data, nbytes));
      break;
    }
    case ORT_OP_ATTR_GRAPH:
      out.type = graph::AttrType::Graph;  // filled from Node_GetSubgraphs by read_graph
      break;
    default:
      break;
  }
  return out;
}

}  // namespace

std::vector<std::string> node_input_names(const OrtNode* n) {
  std::vector<std::string> names;
  for (auto* v : inputs_of(n)) names.push_back(value_name(v));
  return names;
}
std::vector<std::string> node_output_names(const OrtNode* n) {
  std::vector<std::string> names;
  for (auto* v : outputs_of(n)) names.push_back(value_name(v));
  return names;
}

GraphRead read_graph(const OrtGraph* g) {
  GraphRead r;
  auto& out = r.graph;
  const OrtNode* parent = nullptr;
  check(g_ort->Graph_GetParentNode(g, &parent));
  out.is_subgraph = parent != nullptr;

  size_t n_opsets = 0;
  check(g_ort->Graph_GetNumOperatorSets(g, &n_opsets));
  if (n_opsets) {
    std::vector<const char*> domains(n_opsets);
    std::vector<int64_t> versions(n_opsets);
    check(g_ort->Graph_GetOperatorSets(g, domains.data(), versions.data(), n_opsets));
    for (size_t i = 0; i < n_opsets; ++i)
      out.opsets[domains[i] ? domains[i] : ""] = static_cast<int>(versions[i]);
  }

  auto note_value = [&](const OrtValueInfo* v) -> std::string {
    if (!v) return {};
    auto vi = read_value_info(v);
    std::string name = vi.name;
    if (name.empty()) return name;
    if (!out.values.count(name)) {
      graph::ConstTensor c;
      if (read_constant(v, c)) out.constants.emplace(name, c);
      out.values.emplace(name, std::move(vi));
    }
    return name;
  };

  size_t n_in = 0, n_out = 0;
  check(g_ort->Graph_GetNumInputs(g, &n_in));
  std::vector<const OrtValueInfo*> ins(n_in);
  if (n_in) check(g_ort->Graph_GetInputs(g, ins.data(), n_in));
  for (auto* v : ins) out.inputs.push_back(note_value(v));
  check(g_ort->Graph_GetNumOutputs(g, &n_out));
  std::vector<const OrtValueInfo*> outs(n_out);
  if (n_out) check(g_ort->Graph_GetOutputs(g, outs.data(), n_out));
  for (auto* v : outs) out.outputs.push_back(note_value(v));

  size_t n_nodes = 0;
  check(g_ort->Graph_GetNumNodes(g, &n_nodes));
  r.ort_nodes.resize(n_nodes);
  if (n_nodes) check(g_ort->Graph_GetNodes(g, r.ort_nodes.data(), n_nodes));
  out.nodes.reserve(n_nodes);
  for (size_t i = 0; i < n_nodes; ++i) {
    const OrtNode* on = r.ort_nodes[i];
    graph::Node node;
    node.index = i;
    const char* s = nullptr;
    check(g_ort->Node_GetName(on, &s));
    node.name = s ? s : "";
    check(g_ort->Node_GetOperatorType(on, &s));
    node.op_type = s ? s : "";
    check(g_ort->Node_GetDomain(on, &s));
    node.domain = s ? s : "";
    if (node.domain == "ai.onnx") node.domain.clear();
    check(g_ort->Node_GetSinceVersion(on, &node.since_version));
    for (auto* v : inputs_of(on)) node.inputs.push_back(note_value(v));
    for (auto* v : outputs_of(on)) node.outputs.push_back(note_value(v));
    size_t n_attr = 0;
    check(g_ort->Node_GetNumAttributes(on, &n_attr));
    std::vector<const OrtOpAttr*> attrs(n_attr);
    if (n_attr) check(g_ort->Node_GetAttributes(on, attrs.data(), n_attr));
    for (auto* a : attrs) {
      const char* an = nullptr;
      check(g_ort->OpAttr_GetName(a, &an));
      node.attrs.emplace(an ? an : "", read_attribute(a));
    }
    // Control-flow bodies, read recursively (ORT hands them out as OrtGraphs, not attributes).
    // Outer-scope constant initializers a body reads come with it: ORT flags them constant in
    // the body's view and ValueInfo_GetInitializerValue finds them in the enclosing graph.
    size_t n_sub = 0;
    check(g_ort->Node_GetNumSubgraphs(on, &n_sub));
    if (n_sub) {
      std::vector<const OrtGraph*> subs(n_sub);
      std::vector<const char*> sub_names(n_sub, nullptr);
      check(g_ort->Node_GetSubgraphs(on, subs.data(), n_sub, sub_names.data()));
      for (size_t k = 0; k < n_sub; ++k) {
        graph::Attribute a;
        a.type = graph::AttrType::Graph;
        if (subs[k]) a.g = std::make_shared<const graph::Graph>(read_graph(subs[k]).graph);
        node.attrs.insert_or_assign(sub_names[k] ? sub_names[k] : "", std::move(a));
      }
      size_t n_implicit = 0;
      check(g_ort->Node_GetNumImplicitInputs(on, &n_implicit));
      std::vector<const OrtValueInfo*> implicit(n_implicit);
      if (n_implicit) check(g_ort->Node_GetImplicitInputs(on, implicit.data(), n_implicit));
      for (auto* v : implicit)
        if (auto name = note_value(v); !name.empty()) node.implicit_inputs.push_back(name);
    }
    out.nodes.push_back(std::move(node));
  }
  return r;
}

}  // namespace ortmlx::ep
