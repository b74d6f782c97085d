// A sampling profiler of the host side of a process, for machines without perf (the GPU
// machine has no perf, gdb or strace). Loaded into the process (ctypes), it samples the thread
// that called host_sampler_start() (or every thread of the process) at a fixed wall-clock
// interval until host_sampler_stop(): a thread of its own sends SIGPROF, whose handler records
// the stack. Wall clock, not CPU time, so time spent waiting (a stream sync, a futex) shows as
// such; and the kernel's CPU-time timers tick too coarsely (milliseconds). The output: samples
// by library, by function (self) and with the function anywhere on the stack (inclusive).
// tools/host_profile.py drives it.
//
//   g++ -O2 -shared -fPIC -o host_sampler.so tools/host_sampler.cc -ldl
//
// Function names come from dladdr (a shared library's exported symbols): a static function
// is reported as the nearest exported one before it, or as library+offset.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kDepth = 40;
constexpr size_t kMaxSamples = 200000;

struct Sample {
  int tid;
  int depth;
  void* pc[kDepth];  // pc[0]: the interrupted instruction; then its callers
};

Sample* g_samples = nullptr;
std::atomic<size_t> g_count{0};
std::atomic<bool> g_on{false};
// Stacks (backtrace) only where the sampled thread is the one that started the sampler: in
// other threads the unwinder's first use allocates (a crash when the signal interrupted
// malloc), so those samples keep only the interrupted instruction.
std::atomic<bool> g_stacks{true};
std::thread g_ticker;

void on_prof(int, siginfo_t*, void* uc_raw) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  size_t i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  Sample& s = g_samples[i];
  s.tid = static_cast<int>(syscall(SYS_gettid));
  auto* uc = static_cast<ucontext_t*>(uc_raw);
#if defined(__x86_64__)
  void* pc = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  void* pc = reinterpret_cast<void*>(uc->uc_mcontext.pc);
#else
  void* pc = nullptr;
#endif
  s.pc[0] = pc;
  int d = 1;
  if (g_stacks.load(std::memory_order_relaxed)) {
    void* frames[kDepth + 4];
    int n = backtrace(frames, kDepth + 4);
    // frames[0] is this handler, frames[1] the signal trampoline, then the interrupted frame.
    for (int k = 3; k < n && d < kDepth; ++k) s.pc[d++] = frames[k];
  }
  s.depth = d;
}

// Whether thread `tid` is on a CPU or ready to run (state R in /proc), not blocked.
bool running(int tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // the command name may hold spaces
  return close && close[1] == ' ' && close[2] == 'R';
}

std::string name_of(void* pc) {
  Dl_info info{};
  if (!dladdr(pc, &info) || !info.dli_fname) return "?";
  std::string lib = info.dli_fname;
  if (auto slash = lib.rfind('/'); slash != std::string::npos) lib = lib.substr(slash + 1);
  if (!info.dli_sname) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(
        static_cast<char*>(pc) - static_cast<char*>(info.dli_fbase)));
    return lib + buf;
  }
  int status = 0;
  char* dem = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string sym = status == 0 && dem ? dem : info.dli_sname;
  std::free(dem);
  if (sym.size() > 160) sym = sym.substr(0, 160) + "...";
  return sym + "  [" + lib + "]";
}

void print_top(FILE* f, const char* title, const std::unordered_map<std::string, size_t>& counts,
               size_t total, size_t top) {
  std::vector<std::pair<std::string, size_t>> v(counts.begin(), counts.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::fprintf(f, "\n== %s (%% of %zu samples)\n", title, total);
  for (size_t i = 0; i < v.size() && i < top; ++i)
    std::fprintf(f, "%6.2f%%  %s\n", 100.0 * v[i].second / total, v[i].first.c_str());
}

}  // namespace

extern "C" {

// Starts sampling every `interval_us` of wall time: the calling thread, with stacks; with
// all_threads=1 every thread of the process, with 2 every thread that is running (not blocked)
// at the tick (where CPU time goes), both without stacks (self profile only).
int host_sampler_start(int interval_us, int all_threads) {
  if (g_on) return -4;
  if (!g_samples) {
    g_samples = static_cast<Sample*>(std::calloc(kMaxSamples, sizeof(Sample)));
    if (!g_samples) return -1;
    void* warm[4];
    backtrace(warm, 4);  // loads the unwinder outside the signal handler
  }
  struct sigaction sa {};
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, nullptr) != 0) return -2;
  g_count = 0;
  g_stacks = all_threads == 0;
  g_on = true;
  const pid_t pid = getpid();
  const pid_t target = static_cast<pid_t>(syscall(SYS_gettid));
  g_ticker = std::thread([=] {
    const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
    timespec next{};
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (g_on.load()) {
      next.tv_nsec += static_cast<long>(interval_us) * 1000;
      while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr);
      if (!all_threads) {
        syscall(SYS_tgkill, pid, target, SIGPROF);
        continue;
      }
      DIR* d = opendir("/proc/self/task");
      if (!d) continue;
      while (dirent* e = readdir(d)) {
        const int tid = std::atoi(e->d_name);
        if (tid <= 0 || tid == self) continue;
        if (all_threads == 2 && !running(tid)) continue;
        syscall(SYS_tgkill, pid, tid, SIGPROF);
      }
      closedir(d);
    }
  });
  return 0;
}

// Stops sampling and writes the profile to `path`; returns the number of samples.
long host_sampler_stop(const char* path, int top) {
  g_on = false;
  if (g_ticker.joinable()) g_ticker.join();
  size_t n = std::min(g_count.load(), kMaxSamples);
  FILE* f = std::fopen(path, "w");
  if (!f) return -1;
  std::unordered_map<void*, std::string> names;
  auto name = [&](void* pc) -> const std::string& {
    auto it = names.find(pc);
    if (it == names.end()) it = names.emplace(pc, name_of(pc)).first;
    return it->second;
  };
  std::map<int, size_t> per_thread;
  std::unordered_map<std::string, size_t> self, inclusive, library, self_by_thread;
  for (size_t i = 0; i < n; ++i) {
    const Sample& s = g_samples[i];
    per_thread[s.tid]++;
    const std::string& top_name = name(s.pc[0]);
    self[top_name]++;
    auto lb = top_name.rfind('[');
    library[lb == std::string::npos ? "[" + top_name.substr(0, top_name.find('+')) + "]"
                                    : top_name.substr(lb)]++;
    std::set<std::string> seen;
    // Call sites: a return address minus one lies inside the call instruction.
    for (int d = 0; d < s.depth; ++d)
      seen.insert(name(d == 0 ? s.pc[0] : static_cast<char*>(s.pc[d]) - 1));
    for (const auto& x : seen) inclusive[x]++;
  }
  std::fprintf(f, "samples: %zu\n", n);
  for (const auto& [tid, c] : per_thread) std::fprintf(f, "  thread %d: %zu\n", tid, c);
  if (n) {
    print_top(f, "self, by library", library, n, 20);
    print_top(f, "self, by function", self, n, top);
    print_top(f, "inclusive (on the stack)", inclusive, n, top);
  }
  std::fclose(f);
  return static_cast<long>(n);
}

}  // extern "C"
