// EPContext models (ORT's compiled-model cache): writing an EPContext node per fused node, and
// rebuilding a fused node from one without re-reading or re-partitioning the original graph.
// The payload is graph/serialize's bytes: embedded in the node (embed_mode=1) or in a side file
// next to the context model (embed_mode=0), whose weights follow the graph in the same file.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ep/options.h"
#include "ep/ort_api.h"
#include "graph/view.h"

namespace ortmlx::ep {

inline constexpr const char* kContextOp = "EPContext";
inline constexpr const char* kContextDomain = "com.microsoft";

// ep.context_enable / ep.context_embed_mode / ep.context_file_path from the session config.
ContextOptions read_context_options(const OrtSessionOptions* so);

// The EPContext nodes (domain com.microsoft) of `g` whose `source` names this EP; nodes with
// another source, or none, are not ours.
std::vector<const OrtNode*> own_context_nodes(const OrtGraph* g);

// Compile's graph when it is a single EPContext node of ours, else null.
const OrtNode* own_context_graph(const OrtGraph* g);

// The EPContext node for a compiled fused node: `g` is the group's view with its inputs and
// outputs set to the fused node's (the program's signature) and its constants still readable.
// ORT owns the returned node.
OrtNode* make_context_node(const ContextOptions& opt, const OrtGraph* graph,
                           const OrtNode* fused, const graph::Graph& g,
                           const std::string& compat);

// Rebuilds the view saved in `ctx`, after checking the saved compatibility string equals
// `compat` (this EP's): a mismatch throws OrtError naming both. Constants keep the bytes alive.
graph::Graph load_context(const OrtGraph* graph, const OrtNode* ctx, const std::string& compat);

// The fused node ORT made for an EPContext node must take and give what the saved group does
// (same names; ORT's order is the one used). Throws naming the difference.
void check_context_signature(const std::string& node, const graph::Graph& g,
                             const std::vector<std::string>& inputs,
                             const std::vector<std::string>& outputs);

// "MLXExecutionProvider;version=..;mlx=..;device=.." -> {"" : EP name, "version": .., ...}.
std::map<std::string, std::string> parse_compat(std::string_view s);

// What differs between two compatibility strings ("mlx 0.30.0 vs 0.31.0; device gpu vs cpu"),
// "" if they are equal.
std::string compat_mismatch(std::string_view found, std::string_view expected);

}  // namespace ortmlx::ep
