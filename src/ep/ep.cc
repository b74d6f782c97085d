#include "ep/ep.h"

#include <fstream>
#include <iostream>

#include <mlx/mlx.h>

#include "ep/device_memory.h"
#include "ep/ep_context.h"
#include "ep/error_wall.h"
#include "ep/graph_reader.h"
#include "ep/node_compute.h"
#include "ep/profiler.h"
#include "ep/report.h"
#include "partition/partition.h"
#include "trace/trace.h"

namespace ortmlx::ep {

namespace mx = mlx::core;

namespace {
// The nodes inside a node's If/Loop/Scan bodies, nested bodies included.
size_t body_node_count(const graph::Node& n) {
  size_t count = 0;
  for (const auto& [attr, body] : n.subgraphs())
    for (const auto& inner : body->nodes) count += 1 + body_node_count(inner);
  return count;
}
}  // namespace

MlxEp::MlxEp(MlxEpFactory& factory, EpOptions options, bool gpu, const OrtLogger* logger)
    : OrtEp{}, factory_(factory), options_(std::move(options)), gpu_(gpu), logger_(logger) {
  options_.engine.gpu = gpu_;
  ort_version_supported = g_api_version;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  Compile = CompileImpl;
  ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
  GetPreferredDataLayout = GetPreferredDataLayoutImpl;
  ShouldConvertDataLayoutForOp = ShouldConvertDataLayoutForOpImpl;
  SetDynamicOptions = SetDynamicOptionsImpl;
  OnRunStart = OnRunStartImpl;
  OnRunEnd = OnRunEndImpl;
  CreateAllocator = CreateAllocatorImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
  GetCompiledModelCompatibilityInfo = GetCompiledModelCompatibilityInfoImpl;
  if (g_api_version >= 24) {
    GetKernelRegistry = GetKernelRegistryImpl;
    IsConcurrentRunSupported = IsConcurrentRunSupportedImpl;
  }
  if (g_api_version >= 25) {
    Sync = SyncImpl;
    CreateProfiler = CreateProfilerImpl;
  }
  if (g_api_version >= 27) {
    OnSessionInitializationEnd = OnSessionInitializationEndImpl;
    GetDefaultMemoryDevice = GetDefaultMemoryDeviceImpl;
  }
  // Left null (optional, ORT checks): graph capture, GetAvailableResource, ReleaseCapturedGraph.
  compat_info_ = std::string(kEpName) + ";version=" + kEpVersion + ";mlx=" + mx::version() +
                 ";device=" + (gpu_ ? "gpu" : "cpu");
}

const char* MlxEp::GetNameImpl(const OrtEp*) noexcept { return kEpName; }

OrtStatus* MlxEp::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                    OrtEpGraphSupportInfo* info) noexcept {
  return guard("GetCapability", [&] { static_cast<MlxEp*>(self)->get_capability(graph, info); });
}

void MlxEp::get_capability(const OrtGraph* graph, OrtEpGraphSupportInfo* info) {
  const trace::ScopedOwner owner(this);
  trace::Span span("session", "claim nodes");
  // A compiled model: each EPContext node of ours is one fused node (its payload is the group),
  // claimed without reading the rest of the graph; other EPs' EPContext nodes are left alone.
  if (auto ctx = own_context_nodes(graph); !ctx.empty()) {
    OrtNodeFusionOptions fusion{};
    fusion.ort_version_supported = g_api_version;
    fusion.drop_constant_initializers = true;
    for (const OrtNode* n : ctx)
      check(g_ep_api->EpGraphSupportInfo_AddNodesToFuse(info, &n, 1, &fusion));
    if (options_.engine.log_level >= 1)
      std::cerr << "[MLX EP] GetCapability: claimed " << ctx.size() << " EPContext node(s)\n";
    return;
  }
  GraphRead read = read_graph(graph);
  const auto& g = read.graph;
  partition::Result result;
  if (g.is_subgraph) {
    // Control-flow bodies are not claimed node by node: a fused node inside a nested body
    // breaks ORT ("no opset import for domain"). An If/Loop/Scan is claimed whole, bodies
    // included, at its parent level (partition::check_node checks every node inside), and
    // reported there: ORT shows a body to the EP before its parent.
    if (options_.engine.log_level >= 2)
      std::cerr << "[MLX EP] GetCapability: a control-flow body of " << g.nodes.size()
                << " node(s), claimed only whole with its If/Loop/Scan (see its line)\n";
    return;
  }
  result = partition::partition(g, partition::Options{gpu_});
  OrtNodeFusionOptions fusion{};
  fusion.ort_version_supported = g_api_version;
  // Constant initializers are copied into MLX arrays at Compile, so ORT need not feed them.
  fusion.drop_constant_initializers = true;
  size_t claimed = 0, in_bodies = 0, with_bodies = 0;
  std::vector<size_t> control_flow;  // claimed nodes that carry bodies
  for (const auto& group : result.groups) {
    std::vector<const OrtNode*> nodes;
    for (size_t i : group) {
      nodes.push_back(read.ort_nodes[i]);
      if (const size_t n = body_node_count(g.nodes[i])) {
        in_bodies += n;
        ++with_bodies;
        control_flow.push_back(i);
      }
    }
    check(g_ep_api->EpGraphSupportInfo_AddNodesToFuse(info, nodes.data(), nodes.size(), &fusion));
    claimed += nodes.size();
  }
  if (options_.engine.log_level >= 1) {
    std::cerr << "[MLX EP] GetCapability: claimed " << claimed << " of " << g.nodes.size() << " nodes";
    if (with_bodies)
      std::cerr << " (and the " << in_bodies << " inside the bodies of " << with_bodies
                << " control-flow node(s), run as part of them)";
    std::cerr << " in " << result.groups.size() << " group(s)\n";
    if (options_.engine.log_level >= 2) {
      for (size_t i : control_flow)
        std::cerr << "[MLX EP]   claimed " << g.nodes[i].describe() << " whole: its bodies' "
                  << body_node_count(g.nodes[i]) << " node(s) run on MLX inside it\n";
      for (const auto& d : result.declined)
        std::cerr << "[MLX EP]   declined " << g.nodes[d.node].describe() << ": " << d.reason << "\n";
    }
  }
  if (!options_.report_path.empty()) {
    std::lock_guard<std::mutex> lock(report_mu_);
    std::ofstream f(options_.report_path, std::ios::app);
    f << declined_lines(g, result);
  }
}

OrtStatus* MlxEp::CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                              size_t count, OrtNodeComputeInfo** infos,
                              OrtNode** ep_context_nodes) noexcept {
  for (size_t i = 0; i < count; ++i) {
    infos[i] = nullptr;
    if (ep_context_nodes) ep_context_nodes[i] = nullptr;
  }
  OrtStatus* st = guard("Compile", [&] {
    static_cast<MlxEp*>(self)->compile(graphs, fused_nodes, count, infos, ep_context_nodes);
  });
  if (st) {  // free what was built before the failure (ORT takes no ownership then)
    for (size_t i = 0; i < count; ++i) {
      delete static_cast<FusedNodeCompute*>(infos[i]);
      infos[i] = nullptr;
      if (ep_context_nodes && ep_context_nodes[i]) {
        g_ort->ReleaseNode(ep_context_nodes[i]);
        ep_context_nodes[i] = nullptr;
      }
    }
  }
  return st;
}

void MlxEp::compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count,
                    OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes) {
  for (size_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    check(g_ort->Node_GetName(fused_nodes[i], &name));
    std::string fused_name = name ? name : "";
    const trace::ScopedOwner owner(this);
    trace::Span span("session", "prepare fused node");
    span.arg("fused_node", fused_name);
    auto inputs = node_input_names(fused_nodes[i]);
    auto outputs = node_output_names(fused_nodes[i]);
    // The OrtGraph is valid only during Compile: the view's constants are copied into MLX
    // arrays by the Program constructor, before we return.
    graph::Graph g;
    if (const OrtNode* ctx = own_context_graph(graphs[i])) {
      g = load_context(graphs[i], ctx, compat_info_);  // the saved group, compatibility checked
      check_context_signature(fused_name, g, inputs, outputs);
    } else {
      g = std::move(read_graph(graphs[i]).graph);
    }
    auto program = engine::make_program(fused_name, g, inputs, outputs, options_.engine);
    // (freed in ReleaseNodeComputeInfos)
    infos[i] = new FusedNodeCompute(std::move(program), this, !options_.report_path.empty());
    // ORT passes the array even when no compiled model is asked for: the session key decides.
    if (ep_context_nodes && options_.context.enable) {
      // The saved graph's inputs and outputs are the program's signature: the fused node's.
      g.inputs = inputs;
      g.outputs = outputs;
      ep_context_nodes[i] =
          make_context_node(options_.context, graphs[i], fused_nodes[i], g, compat_info_);
    }
  }
}

void MlxEp::ReleaseNodeComputeInfosImpl(OrtEp* self, OrtNodeComputeInfo** infos, size_t count) noexcept {
  auto* ep = static_cast<MlxEp*>(self);
  for (size_t i = 0; i < count; ++i) {
    auto* info = static_cast<FusedNodeCompute*>(infos[i]);
    // Per fused node run statistics (the bench's overhead figure), one JSON line each.
    if (info && !ep->options_.report_path.empty()) {
      try {
        const auto line = stats_line(info->program->name(), info->program->stats());
        std::lock_guard<std::mutex> lock(ep->report_mu_);
        std::ofstream f(ep->options_.report_path, std::ios::app);
        f << line;
      } catch (...) {  // a statistics line is not worth failing a release over
      }
    }
    delete info;
  }
}

void MlxEp::report_device_memory() {
  if (options_.device_memory != 1 || options_.report_path.empty()) return;
  try {
    const auto line = device_memory_line();
    std::lock_guard<std::mutex> lock(report_mu_);
    std::ofstream f(options_.report_path, std::ios::app);
    f << line;
  } catch (...) {  // a statistics line is not worth failing a release over
  }
}

OrtStatus* MlxEp::GetPreferredDataLayoutImpl(OrtEp*, OrtEpDataLayout* layout) noexcept {
  *layout = OrtEpDataLayout::OrtEpDataLayout_NCHW;
  return nullptr;
}
OrtStatus* MlxEp::ShouldConvertDataLayoutForOpImpl(OrtEp*, const char*, const char*,
                                                   OrtEpDataLayout, int* should_convert) noexcept {
  *should_convert = -1;  // let ORT decide
  return nullptr;
}
OrtStatus* MlxEp::SetDynamicOptionsImpl(OrtEp*, const char* const*, const char* const*,
                                        size_t n) noexcept {
  if (n == 0) return nullptr;
  return g_ort->CreateStatus(ORT_INVALID_ARGUMENT, "[MLX EP] no dynamic options are supported");
}
OrtStatus* MlxEp::OnRunStartImpl(OrtEp*, const OrtRunOptions*) noexcept { return nullptr; }
OrtStatus* MlxEp::OnRunEndImpl(OrtEp*, const OrtRunOptions*, bool) noexcept { return nullptr; }
OrtStatus* MlxEp::CreateAllocatorImpl(OrtEp* self, const OrtMemoryInfo* info,
                                      OrtAllocator** a) noexcept {
  *a = nullptr;  // CPU memory (the default): ORT's CPU allocator
  auto* ep = static_cast<MlxEp*>(self);
  // The session's allocator for the EP's memory: the same kind the factory makes for the
  // environment (set to null here, ORT would have no allocator for the EP's device at all).
  if (ep->options_.device_memory == 1 && ep->factory_.device_memory())
    return ep->factory_.device_memory()->create_allocator(info, a);
  return nullptr;
}
OrtStatus* MlxEp::CreateSyncStreamForDeviceImpl(OrtEp*, const OrtMemoryDevice*,
                                                OrtSyncStreamImpl** s) noexcept {
  *s = nullptr;
  return nullptr;
}
const char* MlxEp::GetCompiledModelCompatibilityInfoImpl(OrtEp* self, const OrtGraph*) noexcept {
  return static_cast<MlxEp*>(self)->compat_info_.c_str();
}
OrtStatus* MlxEp::GetKernelRegistryImpl(OrtEp*, const OrtKernelRegistry** reg) noexcept {
  *reg = nullptr;  // compile-based EP
  return nullptr;
}
OrtStatus* MlxEp::IsConcurrentRunSupportedImpl(OrtEp*, bool* out) noexcept {
  *out = true;  // each fused node serialises its own runs; MLX streams are per thread
  return nullptr;
}
OrtStatus* MlxEp::SyncImpl(OrtEp*) noexcept {
  return guard("Sync", [] { mx::synchronize(); });
}
OrtStatus* MlxEp::CreateProfilerImpl(OrtEp* self, OrtEpProfilerImpl** profiler) noexcept {
  *profiler = nullptr;
  return guard("CreateProfiler", [&] { *profiler = make_profiler(self); });
}
OrtStatus* MlxEp::OnSessionInitializationEndImpl(OrtEp*) noexcept { return nullptr; }
OrtStatus* MlxEp::GetDefaultMemoryDeviceImpl(const OrtEp*, const OrtMemoryDevice** d) noexcept {
  *d = nullptr;  // ORT's CPU memory
  return nullptr;
}

}  // namespace ortmlx::ep
