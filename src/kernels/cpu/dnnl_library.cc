// The loader of dnnl_library.h, and cpu_dnnl_available() (kernels.h) with or without oneDNN.
#include "kernels/cpu/dnnl_library.h"

#include "kernels/cpu/kernels.h"

#ifdef ORTMLX_HAVE_DNNL

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <mlx/scheduler.h>

namespace ortmlx::ops {

namespace {

// This library's own folder first (the wheel and the build tree put oneDNN there, with the
// OpenCL loader it links against), then the system's search path.
void* open_library() {
  // libgomp reads these once, when it loads. Its workers wait for the next parallel region
  // spinning ~0.1 ms (5000 pauses) before they sleep: waking a sleeping one takes tens of µs, more
  // than a small convolution, and the CPU kernels' loops run on the same workers
  // (openmp_parallel_for), so a model's back-to-back kernels find them awake. Spinning longer
  // would hold the core from BLAS's threads and the rest of the process. A user's setting wins.
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT"))
    ::setenv("GOMP_SPINCOUNT", "5000", 0);
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&open_library), &info) && info.dli_fname) {
    std::string dir = info.dli_fname;
    dir.erase(dir.rfind('/') + 1);
    if (!dir.empty()) {
      ::dlopen((dir + "libOpenCL.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);  // absent: the system's
      if (void* h = ::dlopen((dir + "libdnnl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
  }
  return ::dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
}

}  // namespace

DnnlLibrary::DnnlLibrary() {
  void* h = open_library();
  if (!h) return;
  bool all = true;
#define ORTMLX_DNNL_LOOKUP(f) \
  f = reinterpret_cast<decltype(f)>(::dlsym(h, "dnnl_" #f)); \
  all = all && f;
  ORTMLX_DNNL_FUNCTIONS(ORTMLX_DNNL_LOOKUP)
#undef ORTMLX_DNNL_LOOKUP
  if (!all || engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
    engine = nullptr;
    return;
  }
  omp_set_num_threads = reinterpret_cast<void (*)(int)>(::dlsym(h, "omp_set_num_threads"));
  omp_get_max_threads = reinterpret_cast<int (*)()>(::dlsym(h, "omp_get_max_threads"));
  if (!omp_set_num_threads || !omp_get_max_threads) omp_set_num_threads = nullptr, omp_get_max_threads = nullptr;
  gomp_parallel = reinterpret_cast<decltype(gomp_parallel)>(::dlsym(h, "GOMP_parallel"));
  omp_get_thread_num = reinterpret_cast<int (*)()>(::dlsym(h, "omp_get_thread_num"));
  omp_get_num_threads = reinterpret_cast<int (*)()>(::dlsym(h, "omp_get_num_threads"));
  if (!gomp_parallel || !omp_get_thread_num || !omp_get_num_threads) gomp_parallel = nullptr;
  if (primitive_attr_create(&user_scratchpad) != dnnl_success ||
      primitive_attr_set_scratchpad_mode(user_scratchpad, dnnl_scratchpad_mode_user) != dnnl_success) {
    engine_destroy(engine);
    engine = nullptr;
  }
}

DnnlLibrary::~DnnlLibrary() {
  if (user_scratchpad) primitive_attr_destroy(user_scratchpad);
  if (engine) engine_destroy(engine);
}

const DnnlLibrary& dnnl_lib() {
  static const DnnlLibrary* l = new DnnlLibrary;
  return *l;
}

bool cpu_dnnl_available() { return dnnl_lib().engine != nullptr; }

namespace {

struct Region {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, per;
  int parts;
  std::mutex mutex;
  std::exception_ptr error;  // the first thrown; an exception must not leave an OpenMP region
};

// Each thread of the region takes parts t, t + threads, ...: the runtime may start fewer threads
// than asked for.
void run_region(void* data) {
  auto& r = *static_cast<Region*>(data);
  const auto& l = dnnl_lib();
  const int threads = std::max(1, l.omp_get_num_threads());
  for (int p = l.omp_get_thread_num(); p < r.parts; p += threads) {
    const int64_t b = p * r.per, e = std::min(r.n, b + r.per);
    if (b >= e) continue;
    try {
      (*r.fn)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(r.mutex);
      if (!r.error) r.error = std::current_exception();
    }
  }
}

std::atomic<uint64_t> g_regions{0};

bool openmp_pool_enabled() {
#if defined(__SANITIZE_THREAD__)
  // libgomp is not instrumented: ThreadSanitizer would see its barriers' ordering of the kernels'
  // writes nowhere and report them as races. The EP's own pool (std::future) it sees.
  return false;
#endif
  static const bool on = [] {
    const char* v = std::getenv("ORT_MLX_CPU_OPENMP_POOL");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

}  // namespace

bool openmp_parallel_for(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn) {
  if (!openmp_pool_enabled()) return false;
  const auto& l = dnnl_lib();
  if (!l.engine || !l.gomp_parallel) return false;
  Region r{&fn, n, (n + parts - 1) / parts, parts, {}, {}};
  l.gomp_parallel(&run_region, &r, static_cast<unsigned>(parts), 0);
  g_regions.fetch_add(1, std::memory_order_relaxed);
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

uint64_t cpu_openmp_regions() { return g_regions.load(std::memory_order_relaxed); }

namespace {

std::atomic<int> g_pinned_workers{0};
std::atomic<bool> g_pinned_stream{false};

void pin_worker(void* data) {
  const auto& cpus = *static_cast<const std::vector<int>*>(data);
  const int t = dnnl_lib().omp_get_thread_num();
  if (t < 1 || t >= static_cast<int>(cpus.size())) return;  // the region's master stays free
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[t], &one);
  if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0) g_pinned_workers.fetch_add(1);
}

// A user who places OpenMP's threads has said where they go.
bool user_places_openmp_threads() {
  for (const char* v : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

}  // namespace

void cpu_pin_openmp_workers(mx::Stream s) {
  static std::once_flag once;
  std::call_once(once, [s] {
    if (!openmp_pool_enabled() || !dnnl_lib().gomp_parallel || user_places_openmp_threads()) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(::getpid(), sizeof set, &set) != 0) return;  // the process's CPUs
    auto cpus = std::make_shared<std::vector<int>>();
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus->push_back(c);
    if (cpus->size() < 2) return;
    // libgomp's team belongs to the thread that opens the region: the stream thread's workers
    // are the ones its kernels and oneDNN run on.
    try {
      mx::scheduler::enqueue(s, [cpus] {
        const int threads = std::min<int>(cpu_threads(), static_cast<int>(cpus->size()));
        dnnl_lib().gomp_parallel(&pin_worker, cpus.get(), static_cast<unsigned>(threads), 0);
        // The stream thread (the team's master) keeps off its workers' CPUs: left free, the
        // scheduler queued it on a worker's CPU, where the two took turns at each barrier while
        // the other CPU idled.
        cpu_set_t rest;
        CPU_ZERO(&rest);
        CPU_SET((*cpus)[0], &rest);
        for (size_t i = static_cast<size_t>(threads); i < cpus->size(); ++i) CPU_SET((*cpus)[i], &rest);
        if (threads > 1 && pthread_setaffinity_np(pthread_self(), sizeof rest, &rest) == 0) g_pinned_stream = true;
      });
    } catch (...) {
      // A stopped stream: its workers stay where the scheduler puts them.
    }
  });
}

int cpu_pinned_openmp_workers() { return g_pinned_workers.load(); }
bool cpu_pinned_stream_thread() { return g_pinned_stream.load(); }

ThreadLimit::ThreadLimit(int threads) {
  const auto& l = dnnl_lib();
  if (threads <= 0 || !l.omp_set_num_threads) return;
  prev_ = l.omp_get_max_threads();
  if (prev_ > threads) l.omp_set_num_threads(threads);
  else prev_ = 0;
}

ThreadLimit::~ThreadLimit() {
  if (prev_ > 0) dnnl_lib().omp_set_num_threads(prev_);
}

}  // namespace ortmlx::ops

#else  // no oneDNN headers at build time

namespace ortmlx::ops {

bool cpu_dnnl_available() { return false; }
bool openmp_parallel_for(int64_t, int, const std::function<void(int64_t, int64_t)>&) { return false; }
uint64_t cpu_openmp_regions() { return 0; }
void cpu_pin_openmp_workers(mx::Stream) {}
int cpu_pinned_openmp_workers() { return 0; }
bool cpu_pinned_stream_thread() { return false; }

}  // namespace ortmlx::ops

#endif
