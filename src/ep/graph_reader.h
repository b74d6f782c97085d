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

// The names of a node's inputs or outputs ("" for omitted optional ones).
std::vector<std::string> node_input_names(const OrtNode* n);
std::vector<std::string> node_output_names(const OrtNode* n);

}  // namespace ortmlx::ep
