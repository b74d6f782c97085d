// OrtGraph -> graph::Graph, read once per GetCapability/Compile. Constant initializers keep
// pointers into ORT's memory, valid only during that callback.
#pragma once

#include <vector>

#include "ep/ort_api.h"
#include "graph/view.h"

namespace ortmlx::ep {

struct GraphRead {
  graph::Graph graph;
  std::vector<const OrtNode*> ort_nodes;  // parallel to graph.nodes
};

GraphRead read_graph(const OrtGraph* g);

// ORT's element type enum -> graph::DType (ONNX's TensorProto numbers, which node attributes such
// as Cast's `to` use). They agree up to float4e2m1 (23); after it ORT orders UINT2, INT2,
// FLOAT8E8M0 (24, 25, 26) where ONNX has FLOAT8E8M0, UINT2, INT2.
inline graph::DType to_dtype(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT2: return graph::DType::UInt2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT2: return graph::DType::Int2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E8M0: return graph::DType::Float8E8M0;
    default: return static_cast<graph::DType>(t);
  }
}

// The names of a node's inputs or outputs ("" for omitted optional ones).
std::vector<std::string> node_input_names(const OrtNode* n);
std::vector<std::string> node_output_names(const OrtNode* n);

}  // namespace ortmlx::ep
