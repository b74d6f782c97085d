#include "ep/node_compute.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "ep/error_wall.h"
#include "ep/tensor_io.h"

namespace ortmlx::ep {

FusedNodeCompute::FusedNodeCompute(std::unique_ptr<engine::FusedProgram> p)
    : OrtNodeComputeInfo{}, program(std::move(p)) {
  ort_version_supported = g_api_version;
  CreateState = CreateStateImpl;
  Compute = ComputeImpl;
  ReleaseState = ReleaseStateImpl;
}

OrtStatus* ORT_API_CALL FusedNodeCompute::CreateStateImpl(OrtNodeComputeInfo* self,
                                                          OrtNodeComputeContext*,
                                                          void** state) noexcept {
  *state = static_cast<FusedNodeCompute*>(self)->program.get();  // state is not owned
  return nullptr;
}

void ORT_API_CALL FusedNodeCompute::ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {}

OrtStatus* ORT_API_CALL FusedNodeCompute::ComputeImpl(OrtNodeComputeInfo*, void* state,
                                                      OrtKernelContext* ctx) noexcept {
  auto* program = static_cast<engine::FusedProgram*>(state);
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
    std::vector<ValuePtr> items;  // a sequence's tensors, copied out by ORT: alive until run
    auto inputs = read_inputs(ctx, n_in, items);
    auto outputs = program->run(inputs);
    const auto rows = engine::take_row_updates();
    const auto t_outputs = std::chrono::steady_clock::now();
    // Outputs are allocated by the EP's allocator: try zero-copy outputs.
    write_outputs(ctx, outputs, rows, program->device_memory(),
                  mlx::core::default_stream(program->device()));
    const auto t_end = std::chrono::steady_clock::now();
    auto ns_between = [](auto a, auto b) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
    };
    const auto ns = ns_between(t_start, t_end);
    program->stats().compute_ns += ns;
    if (engine::last_run_compiled()) {
      program->stats().compute_ns_compiled += ns;
      program->stats().outputs_ns_compiled += ns_between(t_outputs, t_end);
    }
  });
}

}  // namespace ortmlx::ep
