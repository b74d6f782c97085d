// This machine's ceilings for the CPU kernels, outside the EP: the AVX-512 FMA rate (24
// independent accumulator chains, no memory) and the rate of plain AVX-512 reads of a buffer
// (four accumulators, aligned loads, optionally lines asked for ahead), on one thread and on
// all of them, each the best of its passes. A shared machine's neighbours move the read rates
// (the L3 and memory are shared); the FMA rate moves little.
//   g++ -O2 -std=c++17 -pthread tools/cpu_ceilings.cc -o /tmp/cpu_ceilings
//   /tmp/cpu_ceilings [MB ...]      (buffer sizes, default 16 64 165 600)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target("avx512f"))) float fma_chains(long steps) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (long k = 0; k < steps; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"))) float read_floats(const float* p, size_t n, long ahead) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    if (ahead > 0) {
      const char* q = reinterpret_cast<const char*>(p + i) + ahead;
      for (int l = 0; l < 4; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
    }
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// Runs f(t) on `threads` threads (t = 0 on this one) once; seconds from start to the last end.
template <class F>
double timed(int threads, F f) {
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(f, t);
  f(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::puts("needs AVX-512F");
    return 1;
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<size_t> sizes_mb;
  for (int i = 1; i < argc; ++i) sizes_mb.push_back(std::strtoul(argv[i], nullptr, 10));
  if (sizes_mb.empty()) sizes_mb = {16, 64, 165, 600};
  volatile float sink = 0;

  constexpr long kSteps = 20'000'000;  // 24 x 32 flops a step a thread
  for (int threads : {1, cores}) {
    double best = 1e9;
    for (int pass = 0; pass < 5; ++pass) best = std::min(best, timed(threads, [&](int) { sink = fma_chains(kSteps); }));
    std::printf("fma     %d thread(s): %6.1f GFLOP/s\n", threads, threads * kSteps * 24.0 * 32 / best / 1e9);
  }
  for (size_t mb : sizes_mb) {
    const size_t bytes = mb << 20, n = bytes / sizeof(float);
    auto* p = static_cast<float*>(std::aligned_alloc(size_t{2} << 20, (bytes + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1)));
    if (!p) return 1;
    madvise(p, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; ++i) p[i] = 1e-9f * static_cast<float>(i % 1000);
    for (int threads : {1, cores})
      for (long ahead : {0L, 4096L}) {
        double best = 1e9;
        for (int pass = 0; pass < 12; ++pass)
          best = std::min(best, timed(threads, [&](int t) {
                            const size_t share = n / threads / 64 * 64;
                            sink = read_floats(p + t * share, share, ahead);
                          }));
        std::printf("read %4zu MB, %d thread(s), lines %4ld bytes ahead: %5.1f GB/s\n", mb, threads, ahead,
                    bytes / best / 1e9);
      }
    std::free(p);
  }
  return 0;
}
