#include "ep/node_compute.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "ep/error_wall.h"
#include "ep/memory_limits.h"
#include "ep/tensor_io.h"
#include "trace/trace.h"

namespace ortmlx::ep {

FusedNodeCompute::FusedNodeCompute(std::unique_ptr<engine::FusedProgram> p, const void* owner, bool timed)
    : OrtNodeComputeInfo{}, program(std::move(p)), owner(owner), timed(timed) {
  ort_version_supported = g_api_version;
  CreateState = CreateStateImpl;
  Compute = ComputeImpl;
  ReleaseState = ReleaseStateImpl;
}

OrtStatus* ORT_API_CALL FusedNodeCompute::CreateStateImpl(OrtNodeComputeInfo* self,
                                                          OrtNodeComputeContext*,
                                                          void** state) noexcept {
  *state = self;  // not owned: the compute info outlives its states
  return nullptr;
}

void ORT_API_CALL FusedNodeCompute::ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {}

namespace {

std::string shapes_of(const std::vector<engine::HostTensor>& ts) {
  std::string s;
  for (const auto& t : ts) {
    // "float32[2,16]": ORT's profile writes a value that starts with '[' unquoted, as JSON.
    s += (s.empty() ? "" : "; ") + std::string(graph::dtype_name(t.dtype)) + "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
    s += "]";
  }
  return s;
}

// MLX's allocator after the run, on the trace's memory tracks and in the run's event.
void sample_memory(trace::Span& span) {
  const auto active = mlx::core::get_active_memory(), peak = mlx::core::get_peak_memory(),
             cache = mlx::core::get_cache_memory();
  trace::counter("mlx_active_bytes", static_cast<double>(active));
  trace::counter("mlx_peak_bytes", static_cast<double>(peak));
  trace::counter("mlx_cache_bytes", static_cast<double>(cache));
  span.arg("mlx_active_bytes", std::to_string(active));
  span.arg("mlx_peak_bytes", std::to_string(peak));
  span.arg("mlx_cache_bytes", std::to_string(cache));
}

}  // namespace

OrtStatus* ORT_API_CALL FusedNodeCompute::ComputeImpl(OrtNodeComputeInfo*, void* state,
                                                      OrtKernelContext* ctx) noexcept {
  auto* self = static_cast<FusedNodeCompute*>(state);
  auto* program = self->program.get();
  return guard([program] { return "Compute of fused node '" + program->name() + "'"; }, [&] {
    // (a tiny model's run is a few microseconds, of which a clock read takes tens of nanoseconds)
    using Clock = std::chrono::steady_clock;
    const bool timed = self->timed;
    const auto t_start = timed ? Clock::now() : Clock::time_point{};
    const trace::ScopedOwner owner(self->owner);
    // (the last run's buffers are freed by now, its outputs too: see memory_limits.h)
    fit_cache_to_run();
    trace::Span span("fused_node", program->name().c_str());
    size_t n_in = 0, n_out = 0;
    check(g_ort->KernelContext_GetInputCount(ctx, &n_in));
    check(g_ort->KernelContext_GetOutputCount(ctx, &n_out));
    if (n_in != program->num_inputs() || n_out != program->num_outputs())
      throw std::runtime_error("ORT passed " + std::to_string(n_in) + " inputs/" +
                               std::to_string(n_out) + " outputs, compiled for " +
                               std::to_string(program->num_inputs()) + "/" +
                               std::to_string(program->num_outputs()));
    std::vector<ValuePtr> items;  // a sequence's tensors, copied out by ORT: alive until run
    std::vector<engine::HostTensor> inputs;
    {
      trace::Span copy_in("phase", "read inputs");
      inputs = read_inputs(ctx, n_in, items);
    }
    const auto t_inputs = timed ? Clock::now() : t_start;
    if (span.active()) span.arg("inputs", shapes_of(inputs));
    // Which buffer an output goes to, asked before the evaluation (rows of a bound KV buffer
    // are then written by it); ORT hands back the same buffer when write_outputs asks again.
    const engine::OutputBufferScope bound([ctx](size_t i, const mlx::core::array& v, size_t* nbytes) -> const void* {
      const auto& dims = ort_dims(v.shape());
      OrtValue* out = nullptr;
      check(g_ort->KernelContext_GetOutput(ctx, i, dims.data(), dims.size(), &out));
      void* dst = nullptr;
      check(g_ort->GetTensorMutableData(out, &dst));
      if (nbytes) check(g_ort->GetTensorSizeInBytes(out, nbytes));
      return dst;
    });
    auto outputs = program->run(inputs);
    const auto rows = engine::take_row_updates();
    const auto t_outputs = timed ? Clock::now() : t_start;
    {
      trace::Span copy_out("phase", "write outputs");
      // Outputs are allocated by the EP's allocator: try zero-copy outputs.
      write_outputs(ctx, outputs, rows, program->device_memory(), program->device_copies(),
                    mlx::core::default_stream(program->device()));
    }
    if (span.active()) {
      span.arg("path", engine::last_run_path());
      sample_memory(span);
    }
    if (!timed) return;
    const auto t_end = Clock::now();
    auto ns_between = [](auto a, auto b) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
    };
    const auto ns = ns_between(t_start, t_end);
    program->stats().compute_ns += ns;
    if (engine::last_run_compiled()) {
      program->stats().compute_ns_compiled += ns;
      program->stats().outputs_ns_compiled += ns_between(t_outputs, t_end);
      program->stats().inputs_ns_compiled += ns_between(t_start, t_inputs);
    }
  });
}

}  // namespace ortmlx::ep
