// A plain C++ host for the MLX EP, for sanitizer runs without Python in the process (so
// LeakSanitizer sees only ORT, MLX and the EP): registers the EP library with ORT's C API,
// then creates, runs and destroys sessions round-robin over a set of prepared cases, checking
// every output against ORT's CPU EP. Built and run by scripts/sanitize:
//
//   ep_churn <libonnxruntime_mlx_ep.so> <sessions> <runs per session> <case dir>...
//
// A case dir holds model.onnx and inputs.bin (written by tools/sanitize_cases.py; read by
// tools/ep_host.h). Exit status: 0 when every run matched, 1 otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "ep_host.h"

namespace {

struct Case {
  std::string dir;
  std::vector<char> model;
  std::vector<ep_host::Input> inputs;
  std::vector<Ort::Value> expected;  // the CPU EP's outputs
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s EP_LIBRARY SESSIONS RUNS CASE_DIR...\n", argv[0]);
    return 2;
  }
  const std::string ep_lib = argv[1];
  const int sessions = std::stoi(argv[2]);
  const int runs = std::stoi(argv[3]);
  int failures = 0, ran = 0;
  {
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "ep_churn");
    env.RegisterExecutionProviderLibrary("onnxruntime_mlx", ep_lib);
    std::vector<Ort::ConstEpDevice> mlx = ep_host::mlx_cpu_devices(env);
    if (mlx.empty()) {
      std::fprintf(stderr, "the MLX EP registered no CPU device\n");
      return 1;
    }
    std::vector<Case> cases;
    for (int i = 4; i < argc; ++i) {
      Case c;
      c.dir = argv[i];
      c.model = ep_host::read_all(c.dir + "/model.onnx");
      c.inputs = ep_host::read_inputs(c.dir + "/inputs.bin");
      Ort::SessionOptions cpu;
      Ort::Session ref(env, c.model.data(), c.model.size(), cpu);
      c.expected = ep_host::run(ref, c.inputs);
      cases.push_back(std::move(c));
    }
    for (int i = 0; i < sessions; ++i) {
      Case& c = cases[i % cases.size()];
      try {
        // Every node on MLX (ep_host::mlx_options): this checks the EP's code, not ORT's.
        Ort::Session s(env, c.model.data(), c.model.size(), ep_host::mlx_options(env, mlx));
        for (int r = 0; r < runs; ++r) {  // run 1 probes eagerly, later runs are compiled
          auto outs = ep_host::run(s, c.inputs);
          ++ran;
          // Loose float tolerance against the CPU EP (the point here is memory safety; the
          // oracle tests own numerical precision).
          if (!ep_host::same_all(outs, c.expected)) {
            ++failures;
            std::fprintf(stderr, "mismatch: %s (session %d, run %d)\n", c.dir.c_str(), i, r);
          }
        }
      } catch (const Ort::Exception& e) {
        ++failures;
        std::fprintf(stderr, "error: %s: %s\n", c.dir.c_str(), e.what());
      }
    }
    cases.clear();
    mlx.clear();
    env.UnregisterExecutionProviderLibrary("onnxruntime_mlx");
  }
  std::printf("{\"sessions\": %d, \"runs\": %d, \"failures\": %d}\n", sessions, ran, failures);
  return failures ? 1 : 0;
}
