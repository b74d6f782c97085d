// ORT's profiler interface (OrtEp::CreateProfiler, ORT >= 1.25): with enable_profiling, the
// EP's trace events (trace/trace.h) for one session, or one profiled run, join ORT's profile.
#pragma once

#include "ep/ort_api.h"

namespace ortmlx::ep {

// A new profiler for the session of `ep` (ORT releases it through OrtEpProfilerImpl::Release).
OrtEpProfilerImpl* make_profiler(const void* ep);

}  // namespace ortmlx::ep
