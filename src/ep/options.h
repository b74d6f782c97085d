// EP options: provider options (session config entries "ep.mlxexecutionprovider.<key>") over
// environment variables (ORT_MLX_<KEY>) over defaults. Documented in docs/options.md.
#pragma once

#include <map>
#include <string>

#include "engine/engine.h"

namespace ortmlx::ep {

// EPContext models: ORT's own session keys (ep.context_*), not provider options; read in CreateEp
// (ep_context.cc). embed_mode 0 is ORT's documented default (a side file next to the model).
struct ContextOptions {
  bool enable = false;
  int embed_mode = 0;
  std::string file_path;  // the context model; "" = ORT's default, <model>_ctx.onnx
};

struct EpOptions {
  std::string device = "auto";     // auto | cpu | gpu
  engine::Options engine;
  std::string report_path;         // append claim decisions as JSON lines (Python reads it)
  size_t memory_limit_mb = 0;      // mx::set_memory_limit (0 = MLX default)
  size_t cache_limit_mb = SIZE_MAX;  // mx::set_cache_limit (SIZE_MAX = MLX default)
  // Inputs/outputs in the EP's own memory (IOBinding, KV kept on the device): -1 unset, 0, 1
  // (2: the same, GPU-type memory on the CPU backend too; a test mode, see device_memory.h).
  // Must agree with ORT_MLX_DEVICE_MEMORY when the library was registered (factory.cc).
  int device_memory = -1;
  // MLX's GPU backend runs float32 matmuls as TF32 unless MLX_ENABLE_TF32=0 (~1e-3 relative
  // error; the conformance set had 5 wrong results from it). 0 (default) asks for full float32.
  int tf32 = 0;
  ContextOptions context;
};

// `entries`: the session's provider options (keys without the "ep.<name>." prefix).
// Throws std::invalid_argument naming the key for malformed values.
EpOptions parse_options(const std::map<std::string, std::string>& entries);

}  // namespace ortmlx::ep
