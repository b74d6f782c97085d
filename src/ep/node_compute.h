// One fused node's runtime: the engine program plus the OrtNodeComputeInfo ORT calls.
// Allocated in MlxEp::compile, freed in ReleaseNodeComputeInfos.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "ep/ort_api.h"

namespace ortmlx::ep {

struct FusedNodeCompute : OrtNodeComputeInfo {
  std::unique_ptr<engine::FusedProgram> program;
  const void* owner;  // the MlxEp that compiled it: trace events name their session by it
  bool timed;         // Compute's phases timed for the report (report_path set): clock reads per run

  FusedNodeCompute(std::unique_ptr<engine::FusedProgram> p, const void* owner, bool timed);

  static OrtStatus* ORT_API_CALL CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext*,
                                                 void** state) noexcept;
  static void ORT_API_CALL ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept;
  // Reads the inputs (tensor_io), runs the program, writes the outputs, counts the time (timed).
  static OrtStatus* ORT_API_CALL ComputeImpl(OrtNodeComputeInfo*, void* state,
                                             OrtKernelContext* ctx) noexcept;
};

}  // namespace ortmlx::ep
