#include "ep/ep.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <mlx/mlx.h>

#include "engine/device_buffers.h"
#include "ep/device_memory.h"
#include "ep/error_wall.h"
#include "ep/graph_reader.h"
#include "ops/lowp.h"
#include "partition/partition.h"

namespace ortmlx::ep {

namespace mx = mlx::core;

namespace {

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) { o += ' '; continue; }
    o += c;
  }
  return o;
}

// One fused node's runtime: the engine program plus the OrtNodeComputeInfo ORT calls.
// Allocated in Compile, freed in ReleaseNodeComputeInfos.
struct FusedNodeCompute : OrtNodeComputeInfo {
  std::unique_ptr<engine::Program> program;

  explicit FusedNodeCompute(std::unique_ptr<engine::Program> p) : OrtNodeComputeInfo{}, program(std::move(p)) {
    ort_version_supported = g_api_version;
    CreateState = CreateStateImpl;
    Compute = ComputeImpl;
    ReleaseState = ReleaseStateImpl;
  }

  static OrtStatus* ORT_API_CALL CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext*,
                                                 void** state) noexcept {
    *state = static_cast<FusedNodeCompute*>(self)->program.get();  // state is not owned
    return nullptr;
  }
  static void ORT_API_CALL ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {}

  static OrtStatus* ORT_API_CALL ComputeImpl(OrtNodeComputeInfo*, void* state,
                                             OrtKernelContext* ctx) noexcept {
    auto* program = static_cast<engine::Program*>(state);
    // Outputs are allocated by the EP's allocator: try zero-copy outputs.
    const bool device_memory = program->device_memory();
    return guard("Compute of fused node '" + program->name() + "'", [&] {
      const auto t_start = std::chrono::steady_clock::now();
      size_t n_in = 0, n_out = 0;
      check(g_ort->KernelContext_GetInputCount(ctx, &n_in));
      check(g_ort->KernelContext_GetOutputCount(ctx, &n_out));
      if (n_in != program->num_inputs() || n_out != program->num_outputs())
        throw std::runtime_error("ORT passed " + std::to_string(n_in) + " inputs/" +
                                 std::to_string(n_out) + " outputs, compiled for " +
                                 std::to_string(program->num_inputs()) + "/" +
                                 std::to_string(program->num_outputs()));
      auto read_tensor = [](const OrtValue* v, engine::HostTensor& t) {
        OrtTensorTypeAndShapeInfo* raw = nullptr;
        check(g_ort->GetTensorTypeAndShape(v, &raw));
        TypeShapePtr info(raw);
        ONNXTensorElementDataType et;
        check(g_ort->GetTensorElementType(info.get(), &et));
        size_t rank = 0;
        check(g_ort->GetDimensionsCount(info.get(), &rank));
        t.shape.resize(rank);
        check(g_ort->GetDimensions(info.get(), t.shape.data(), rank));
        t.dtype = to_dtype(et);
        check(g_ort->GetTensorData(v, &t.data));
      };
      std::vector<engine::HostTensor> inputs(n_in);
      std::vector<ValuePtr> items;  // a sequence's tensors, copied out by ORT: alive until run
      for (size_t i = 0; i < n_in; ++i) {
        const OrtValue* v = nullptr;
        check(g_ort->KernelContext_GetInput(ctx, i, &v));
        // Sequences and optionals stay inside the group as outputs, but may come in: a graph
        // input, or a value ORT's CPU EP produced. An empty optional has no value.
        int has_value = v ? 1 : 0;
        if (v) check(g_ort->HasValue(v, &has_value));
        if (!has_value) {
          inputs[i].kind = engine::HostTensor::Kind::None;
          continue;
        }
        ONNXType type = ONNX_TYPE_UNKNOWN;
        check(g_ort->GetValueType(v, &type));
        if (type == ONNX_TYPE_SEQUENCE) {
          inputs[i].kind = engine::HostTensor::Kind::Sequence;
          size_t count = 0;
          check(g_ort->GetValueCount(v, &count));
          OrtAllocator* alloc = nullptr;
          check(g_ort->GetAllocatorWithDefaultOptions(&alloc));
          for (size_t k = 0; k < count; ++k) {
            OrtValue* item = nullptr;
            check(g_ort->GetValue(v, static_cast<int>(k), alloc, &item));
            items.emplace_back(item);
            inputs[i].items.emplace_back();
            read_tensor(item, inputs[i].items.back());
          }
          continue;
        }
        if (type != ONNX_TYPE_TENSOR)
          throw std::invalid_argument("input " + std::to_string(i) +
                                      " is neither a tensor nor a sequence of tensors");
        read_tensor(v, inputs[i]);
      }
      auto outputs = program->run(inputs);
      // Outputs bound to existing buffers in EP memory (a shared past/present KV buffer): written
      // there by MLX on the device, all in one evaluation, after the loop.
      std::vector<std::pair<void*, mx::array>> device_writes;
      for (size_t i = 0; i < n_out; ++i) {
        const auto& a = outputs[i];
        std::vector<int64_t> dims(a.shape().begin(), a.shape().end());
        OrtValue* out = nullptr;
        // Zero-copy output (device memory only): when nothing else holds the MLX result's
        // buffer, the allocation ORT makes for this output inside GetOutput (through our
        // allocator, same size) is given that buffer instead of a new one. Proven by the
        // pointer ORT hands back; otherwise the result is copied as usual (device_buffers.h).
        std::optional<engine::device_buffers::Armed> armed;
        if (device_memory && engine::device_buffers::adoptable(outputs[i])) armed.emplace(a);
        check(g_ort->KernelContext_GetOutput(ctx, i, dims.data(), dims.size(), &out));
        void* const taken = armed ? armed->taken() : nullptr;
        void* dst = nullptr;
        check(g_ort->GetTensorMutableData(out, &dst));
        // The element type ORT allocated: 4-bit types are packed two per byte in its buffer.
        OrtTensorTypeAndShapeInfo* out_raw = nullptr;
        check(g_ort->GetTensorTypeAndShape(out, &out_raw));
        TypeShapePtr out_info(out_raw);
        ONNXTensorElementDataType out_et;
        check(g_ort->GetTensorElementType(out_info.get(), &out_et));
        auto& counters = engine::device_buffers::counters();
        if (taken && dst == taken && !ops::lowp::is_lowp(to_dtype(out_et))) {
          counters.outputs_adopted++;
          continue;
        }
        if (device_memory && engine::device_buffers::owns(dst)) counters.outputs_copied++;
        if (a.size() && dst == a.data<void>()) continue;  // already there
        if (device_memory && !ops::lowp::is_lowp(to_dtype(out_et)) && engine::device_buffers::owns(dst)) {
          device_writes.emplace_back(dst, a);
          continue;
        }
        engine::Program::copy_out(a, dst, to_dtype(out_et));
      }
      if (!device_writes.empty()) {
        auto written = engine::device_buffers::write_on_device(device_writes, mx::default_stream(program->device()));
        for (size_t k = 0; k < device_writes.size(); ++k)
          if (!written[k]) engine::Program::copy_out(device_writes[k].second, device_writes[k].first);
      }
      const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - t_start).count());
      program->stats().compute_ns += ns;
      if (engine::Program::last_run_compiled()) program->stats().compute_ns_compiled += ns;
    });
  }
};

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
  if (g_api_version >= 25) Sync = SyncImpl;
  if (g_api_version >= 27) {
    OnSessionInitializationEnd = OnSessionInitializationEndImpl;
    GetDefaultMemoryDevice = GetDefaultMemoryDeviceImpl;
  }
  // Left null (optional, ORT checks): CreateProfiler, graph capture, GetAvailableResource,
  // ReleaseCapturedGraph.
  compat_info_ = std::string(kEpName) + ";version=" + kEpVersion + ";mlx=" + mx::version() +
                 ";device=" + (gpu_ ? "gpu" : "cpu");
}

const char* MlxEp::GetNameImpl(const OrtEp*) noexcept { return kEpName; }

OrtStatus* MlxEp::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                    OrtEpGraphSupportInfo* info) noexcept {
  return guard("GetCapability", [&] { static_cast<MlxEp*>(self)->get_capability(graph, info); });
}

void MlxEp::get_capability(const OrtGraph* graph, OrtEpGraphSupportInfo* info) {
  GraphRead read = read_graph(graph);
  const auto& g = read.graph;
  partition::Result result;
  if (g.is_subgraph) {
    // Control-flow bodies are not claimed node by node: a fused node inside a nested body
    // breaks ORT ("no opset import for domain"). An If/Loop/Scan is claimed whole, bodies
    // included, at its parent level (partition::check_node checks every node inside).
    for (size_t i = 0; i < g.nodes.size(); ++i)
      result.declined.push_back(
          {i, "inside a control-flow subgraph (claimed only whole, with its If/Loop/Scan)"});
  } else {
    result = partition::partition(g, partition::Options{gpu_});
  }
  OrtNodeFusionOptions fusion{};
  fusion.ort_version_supported = g_api_version;
  // Constant initializers are copied into MLX arrays at Compile, so ORT need not feed them.
  fusion.drop_constant_initializers = true;
  size_t claimed = 0;
  for (const auto& group : result.groups) {
    std::vector<const OrtNode*> nodes;
    for (size_t i : group) nodes.push_back(read.ort_nodes[i]);
    check(g_ep_api->EpGraphSupportInfo_AddNodesToFuse(info, nodes.data(), nodes.size(), &fusion));
    claimed += nodes.size();
  }
  if (options_.engine.log_level >= 1) {
    std::cerr << "[MLX EP] GetCapability: claimed " << claimed << " of " << g.nodes.size()
              << " nodes in " << result.groups.size() << " group(s)\n";
    if (options_.engine.log_level >= 2)
      for (const auto& d : result.declined)
        std::cerr << "[MLX EP]   declined " << g.nodes[d.node].describe() << ": " << d.reason << "\n";
  }
  if (!options_.report_path.empty()) {
    std::lock_guard<std::mutex> lock(report_mu_);
    std::ofstream f(options_.report_path, std::ios::app);
    for (const auto& d : result.declined) {
      const auto& n = g.nodes[d.node];
      if (n.domain == kEpName) continue;  // our own fused nodes, seen by a later ORT pass
      f << "{\"node\":\"" << json_escape(n.name) << "\",\"op\":\"" << json_escape(n.op_type)
        << "\",\"domain\":\"" << json_escape(n.domain) << "\",\"reason\":\""
        << json_escape(d.reason) << "\"}\n";
    }
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
    static_cast<MlxEp*>(self)->compile(graphs, fused_nodes, count, infos);
  });
  if (st) {  // free what was built before the failure
    for (size_t i = 0; i < count; ++i) {
      delete static_cast<FusedNodeCompute*>(infos[i]);
      infos[i] = nullptr;
    }
  }
  return st;
}

void MlxEp::compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count,
                    OrtNodeComputeInfo** infos) {
  for (size_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    check(g_ort->Node_GetName(fused_nodes[i], &name));
    std::string fused_name = name ? name : "";
    // The OrtGraph is valid only during Compile: the view's constants are copied into MLX
    // arrays by the Program constructor, before we return.
    GraphRead read = read_graph(graphs[i]);
    auto program = std::make_unique<engine::Program>(
        fused_name, read.graph, node_input_names(fused_nodes[i]),
        node_output_names(fused_nodes[i]), options_.engine);
    infos[i] = new FusedNodeCompute(std::move(program));  // freed in ReleaseNodeComputeInfos
  }
}

void MlxEp::ReleaseNodeComputeInfosImpl(OrtEp* self, OrtNodeComputeInfo** infos, size_t count) noexcept {
  auto* ep = static_cast<MlxEp*>(self);
  for (size_t i = 0; i < count; ++i) {
    auto* info = static_cast<FusedNodeCompute*>(infos[i]);
    // Per fused node run statistics (the bench's overhead figure), one JSON line each.
    if (info && !ep->options_.report_path.empty()) {
      try {
        const auto& st = info->program->stats();
        std::lock_guard<std::mutex> lock(ep->report_mu_);
        std::ofstream f(ep->options_.report_path, std::ios::app);
        f << "{\"fused_node\":\"" << json_escape(info->program->name()) << "\",\"runs\":" << st.runs
          << ",\"compiled_runs\":" << st.compiled_runs << ",\"eager_runs\":" << st.eager_runs
          << ",\"traces\":" << st.traces << ",\"compute_ns\":" << st.compute_ns
          << ",\"eval_ns\":" << st.eval_ns << ",\"translate_ns\":" << st.translate_ns
          << ",\"host_reads\":" << st.host_reads << ",\"host_read_ns\":" << st.host_read_ns
          << ",\"host_folds\":" << st.host_folds
          << ",\"eval_arrays\":" << st.eval_arrays << ",\"piecewise_runs\":" << st.piecewise_runs
          << ",\"segment_calls\":" << st.segment_calls << ",\"segment_traces\":" << st.segment_traces
          << ",\"empty_operand_runs\":" << st.empty_operand_runs
          << ",\"compute_ns_compiled\":" << st.compute_ns_compiled
          << ",\"eval_ns_compiled\":" << st.eval_ns_compiled << "}\n";
      } catch (...) {  // a statistics line is not worth failing a release over
      }
    }
    delete info;
  }
}

void MlxEp::report_device_memory() {
  if (options_.device_memory != 1 || options_.report_path.empty()) return;
  try {
    namespace db = engine::device_buffers;
    const auto& c = db::counters();
    std::lock_guard<std::mutex> lock(report_mu_);
    std::ofstream f(options_.report_path, std::ios::app);
    f << "{\"device_memory\":{\"allocations\":" << c.allocations << ",\"frees\":" << c.frees
      << ",\"live_buffers\":" << db::count() << ",\"live_bytes\":" << db::bytes()
      << ",\"inputs_borrowed\":" << c.inputs_borrowed << ",\"outputs_adopted\":"
      << c.outputs_adopted << ",\"outputs_copied\":" << c.outputs_copied
      << ",\"outputs_written_on_device\":" << c.outputs_written_on_device
      << ",\"copies_h2d\":" << c.copies_h2d << ",\"copies_d2h\":" << c.copies_d2h
      << ",\"copies_d2d\":" << c.copies_d2d << ",\"bytes_h2d\":" << c.bytes_h2d
      << ",\"bytes_d2h\":" << c.bytes_d2h << ",\"bytes_d2d\":" << c.bytes_d2d << "}}\n";
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
OrtStatus* MlxEp::OnSessionInitializationEndImpl(OrtEp*) noexcept { return nullptr; }
OrtStatus* MlxEp::GetDefaultMemoryDeviceImpl(const OrtEp*, const OrtMemoryDevice** d) noexcept {
  *d = nullptr;  // ORT's CPU memory
  return nullptr;
}

}  // namespace ortmlx::ep
