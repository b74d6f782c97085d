// Concurrency gate for the MLX EP, a plain C++ host (no Python, so ThreadSanitizer sees only
// ORT, MLX and the EP): T threads x I iterations of Run per model, in two modes,
//
//   shared    all threads on one session (created cold: the probes, traces and compilations
//             of the first runs happen concurrently too);
//   separate  one session per thread, each created by its thread; odd threads run with
//             compile=0, so the eager path runs concurrently with the compiled one.
//
// Every thread runs different inputs at the same time: per model, T variants of its inputs
// (float inputs scaled and shifted; integer and bool inputs, indices and shapes, unchanged);
// thread t's iteration i runs variant (t + i) % T. A case with more input sets (inputs.1.bin
// ..., other shapes: a shape family) has max(T, sets) variants, variant v from set v % sets; its
// options.txt (key=value lines) are provider options of every session of the case. References are computed first, single-
// threaded: per variant, ORT's CPU EP, and the MLX EP in a session of its own (run 3 times:
// the probe, then compiled runs), which must agree with the CPU EP (loose tolerance, as
// ep_churn) and with itself. Every threaded output is compared with the MLX reference of its
// variant: integers, bools and float16 bit for bit, float within 1e-5 relative (eager and
// compiled runs may round differently). A watchdog ends the process if no run completes for
// EP_THREADS_STALL_S seconds (default 600): a deadlock fails the gate instead of hanging it.
// Built and run by `scripts/sanitize tsan`:
//
//   ep_threads <libonnxruntime_mlx_ep.so> <threads> <iterations> <case dir>...
//
// Case dirs as tools/sanitize_cases.py writes them (tools/ep_host.h). Prints one line per model
// and mode, then "threads T x iterations I x models M x 2 modes = N runs, F failures".
// Exit status: 0 when every run matched, 1 otherwise, 3 on a stall. The process ends with _exit
// after the Env and the EP library are released: ORT's own background thread (started with the
// first OrtEnv, never joined) still runs then, and static destructors at exit race with it
// (tools/tsan.supp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unistd.h>
#include <vector>

#include "ep_host.h"

namespace {

constexpr double kTight = 1e-5;  // MLX EP vs its own single-threaded reference

std::atomic<uint64_t> g_progress{0};
std::atomic<int> g_failures{0};
std::mutex g_print_mu;

void fail(const std::string& what) {
  int n = ++g_failures;
  std::lock_guard<std::mutex> lock(g_print_mu);
  if (n <= 20) std::fprintf(stderr, "FAIL %s\n", what.c_str());
  if (n == 20) std::fprintf(stderr, "(further failures not printed)\n");
}

// Variant v of a case's inputs: float and double data x * (1 + 0.1 v) + 0.01 v.
std::vector<ep_host::Input> variant(const std::vector<ep_host::Input>& base, int v) {
  std::vector<ep_host::Input> out = base;
  for (auto& in : out) {
    if (in.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      auto* p = reinterpret_cast<float*>(in.data.data());
      for (size_t i = 0; i < in.data.size() / sizeof(float); ++i)
        p[i] = p[i] * (1.0f + 0.1f * v) + 0.01f * v;
    } else if (in.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE) {
      auto* p = reinterpret_cast<double*>(in.data.data());
      for (size_t i = 0; i < in.data.size() / sizeof(double); ++i)
        p[i] = p[i] * (1.0 + 0.1 * v) + 0.01 * v;
    }
  }
  return out;
}

struct Case {
  std::string name;
  std::vector<char> model;
  std::vector<std::vector<ep_host::Input>> inputs;  // per variant
  std::vector<std::vector<Ort::Value>> expected;    // per variant: the MLX EP, single-threaded
};

std::string base_name(const std::string& dir) {
  auto d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  auto p = d.find_last_of('/');
  return p == std::string::npos ? d : d.substr(p + 1);
}

// One thread's iterations on `s`: every output checked against its variant's reference.
void iterate(Ort::Session& s, Case& c, int tid, int iters, const char* mode) {
  const int variants = static_cast<int>(c.inputs.size());
  for (int i = 0; i < iters; ++i) {
    const int k = (tid + i) % variants;
    try {
      auto outs = ep_host::run(s, c.inputs[k]);
      if (!ep_host::same_all(outs, c.expected[k], kTight, /*fp16_bits=*/true))
        fail(c.name + " " + mode + ": mismatch (thread " + std::to_string(tid) + ", iteration " +
             std::to_string(i) + ", variant " + std::to_string(k) + ")");
    } catch (const std::exception& e) {
      fail(c.name + " " + mode + ": error (thread " + std::to_string(tid) + ", iteration " +
           std::to_string(i) + "): " + e.what());
    }
    ++g_progress;
  }
}

// Runs `body(tid)` on `threads` threads released together; returns the seconds taken.
template <typename F>
double in_threads(int threads, F body) {
  std::latch start(threads + 1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  auto t0 = std::chrono::steady_clock::now();
  start.arrive_and_wait();
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s EP_LIBRARY THREADS ITERATIONS CASE_DIR...\n", argv[0]);
    return 2;
  }
  const std::string ep_lib = argv[1];
  const int threads = std::stoi(argv[2]);
  const int iters = std::stoi(argv[3]);
  const char* stall_env = std::getenv("EP_THREADS_STALL_S");
  const int stall_s = stall_env ? std::atoi(stall_env) : 600;
  if (threads < 1 || iters < 1) return 2;

  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    uint64_t last = g_progress.load();
    auto since = std::chrono::steady_clock::now();
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const uint64_t now = g_progress.load();
      if (now != last) {
        last = now;
        since = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - since > std::chrono::seconds(stall_s)) {
        std::fprintf(stderr, "STALL: no run completed for %d s (deadlock?), %llu runs done\n",
                     stall_s, static_cast<unsigned long long>(now));
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  });

  long runs = 0;
  int models = 0;
  {
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "ep_threads");
    env.RegisterExecutionProviderLibrary("onnxruntime_mlx", ep_lib);
    const std::vector<Ort::ConstEpDevice> mlx = ep_host::mlx_cpu_devices(env);
    if (mlx.empty()) fail("the MLX EP registered no CPU device");
    for (int a = 4; a < argc && !mlx.empty(); ++a) try {
      Case c;
      c.name = base_name(argv[a]);
      c.model = ep_host::read_all(std::string(argv[a]) + "/model.onnx");
      const std::string dir = argv[a];
      std::vector<std::vector<ep_host::Input>> sets{ep_host::read_inputs(dir + "/inputs.bin")};
      for (int k = 1; std::ifstream(dir + "/inputs." + std::to_string(k) + ".bin").good(); ++k)
        sets.push_back(ep_host::read_inputs(dir + "/inputs." + std::to_string(k) + ".bin"));
      std::unordered_map<std::string, std::string> options;
      std::ifstream opt_file(dir + "/options.txt");
      for (std::string line; std::getline(opt_file, line);)
        if (auto eq = line.find('='); eq != std::string::npos) options[line.substr(0, eq)] = line.substr(eq + 1);
      const int variants = std::max(threads, static_cast<int>(sets.size()));
      // References, single-threaded.
      {
        Ort::SessionOptions cpu_so;  // the oracle, not under test: no ORT thread pool
        cpu_so.SetIntraOpNumThreads(1);
        Ort::Session cpu(env, c.model.data(), c.model.size(), cpu_so);
        Ort::Session ref(env, c.model.data(), c.model.size(), ep_host::mlx_options(env, mlx, options));
        for (int v = 0; v < variants; ++v) {
          c.inputs.push_back(variant(sets[static_cast<size_t>(v) % sets.size()], v));
          auto want = ep_host::run(cpu, c.inputs.back());
          std::vector<Ort::Value> got;
          for (int r = 0; r < 3; ++r) {  // the probe, then compiled runs
            auto outs = ep_host::run(ref, c.inputs.back());
            if (!ep_host::same_all(outs, want))
              fail(c.name + ": reference run " + std::to_string(r) + " of variant " +
                   std::to_string(v) + " differs from the CPU EP");
            if (r && !ep_host::same_all(outs, got, kTight, true))
              fail(c.name + ": reference run " + std::to_string(r) + " of variant " +
                   std::to_string(v) + " differs from run " + std::to_string(r - 1));
            got = std::move(outs);
          }
          c.expected.push_back(std::move(got));
        }
      }
      ++models;
      // Whether the variants' outputs differ (else "different inputs" proves less for it).
      const bool distinct = threads < 2 || !ep_host::same_all(c.expected[0], c.expected[1], 0, true);
      const int before = g_failures.load();
      // (a) one shared session, cold.
      {
        Ort::Session shared(env, c.model.data(), c.model.size(), ep_host::mlx_options(env, mlx, options));
        double secs = in_threads(threads, [&](int t) { iterate(shared, c, t, iters, "shared"); });
        runs += static_cast<long>(threads) * iters;
        std::printf("%-36s shared    %d threads x %d iterations: %.1f s, %d failures%s\n",
                    c.name.c_str(), threads, iters, secs, g_failures.load() - before,
                    distinct ? "" : " (all variants give the same outputs)");
      }
      // (b) a session per thread, created by that thread; odd threads eager only.
      const int mid = g_failures.load();
      double secs = in_threads(threads, [&](int t) {
        try {
          auto own_options = options;
          own_options["compile"] = t % 2 ? "0" : "1";
          Ort::Session own(env, c.model.data(), c.model.size(), ep_host::mlx_options(env, mlx, own_options));
          iterate(own, c, t, iters, t % 2 ? "separate (eager)" : "separate");
        } catch (const std::exception& e) {
          fail(c.name + " separate: session of thread " + std::to_string(t) + ": " + e.what());
          g_progress += iters;
        }
      });
      runs += static_cast<long>(threads) * iters;
      std::printf("%-36s separate  %d threads x %d iterations: %.1f s, %d failures\n",
                  c.name.c_str(), threads, iters, secs, g_failures.load() - mid);
      std::fflush(stdout);
    } catch (const std::exception& e) {
      fail(std::string(argv[a]) + ": " + e.what());
    }
    env.UnregisterExecutionProviderLibrary("onnxruntime_mlx");
  }
  done = true;
  watchdog.join();
  const int failures = g_failures.load();
  std::printf("threads %d x iterations %d x models %d x 2 modes = %ld runs, %d failures\n",
              threads, iters, models, runs, failures);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(failures ? 1 : 0);  // TSan intercepts _exit: its summary is still written
}
