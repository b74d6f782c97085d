// One-row products streamed from memory, outside the EP: 40 products of one row alternating
// [1, 512] x [512, 2048] and [1, 2048] x [2048, 512] (160 MB of float32 weights in the packed
// kernel's layout: panels of 48 columns, each its K rows side by side, in 2 MiB pages), two
// threads, a spin barrier after each product; every walk below runs once a pass, in turn, and
// the median of each one's passes is printed. The walks, each with the tile of
// kernels/cpu/packed_gemm.cc for one row (three FMA chains of 16 columns):
//   panels       whole panels split between the threads (11 of a [*, 512] weight: 6 and 5), K
//                in blocks of 512, each tile asking for a third of the next panel's block
//   panels-even  the same without the ragged last panel (5 and 5: what an even split costs)
//   ahead-D      whole panels, each over the whole depth, every line D rows of the panel ahead
//                asked for (D x 192 bytes)
//   counter      chunks of 4 panels taken from a shared counter
//   split16      equal ranges of 16-column vectors (a panel at the boundary shared), each over
//                the whole depth: the EP's walk (cpu_packed_stream) without, and with, its lines
//                32 rows ahead asked for (split16-ahead-32, the EP's default)
// (panels-even computes fewer columns: it is the even split's time, not a product.)
//   g++ -O2 -march=native -std=c++17 -pthread tools/one_row_products.cc -o /tmp/one_row_products
//   /tmp/one_row_products [passes]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 2, kCols = 48, kDepthBlock = 512;

float* huge_floats(size_t n) {
  const size_t page = size_t{2} << 20, bytes = (n * sizeof(float) + page - 1) / page * page;
  auto* p = static_cast<float*>(std::aligned_alloc(page, bytes));
  madvise(p, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / sizeof(float); ++i) p[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f;
  return p;
}

struct Weight {
  int64_t k, n, panels;
  float* p;  // [panels][k][48]
};

std::atomic<int> arrived{0}, generation{0}, next_chunk{0};
void barrier() {
  const int g = generation.load();
  if (arrived.fetch_add(1) == kThreads - 1) {
    arrived.store(0);
    next_chunk.store(0);
    generation.fetch_add(1);
  } else {
    while (generation.load() == g) _mm_pause();
  }
}

// y[0:16 V) (+)= sum_k a[k] * p[k, 0:16 V) (rows 48 floats apart); asks for `next_lines` lines
// from `next` and, with ahead > 0, for the V lines `ahead` bytes past each row it reads.
template <int V>
__attribute__((target("avx512f"))) void tile_v(const float* a, const float* p, int64_t kc, float* y, bool accumulate,
                                               const char* next, int64_t next_lines, int64_t ahead) {
  __m512 c[V];
  for (int j = 0; j < V; ++j) c[j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, p += kCols) {
    if (next_lines > 0) _mm_prefetch(next, _MM_HINT_T1), next += 64, --next_lines;
    if (ahead > 0)
      for (int j = 0; j < V; ++j) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead + 64 * j, _MM_HINT_T0);
    const __m512 v = _mm512_set1_ps(a[k]);
    for (int j = 0; j < V; ++j) c[j] = _mm512_fmadd_ps(v, _mm512_loadu_ps(p + 16 * j), c[j]);
  }
  for (int j = 0; j < V; ++j) {
    if (accumulate) c[j] = _mm512_add_ps(c[j], _mm512_loadu_ps(y + 16 * j));
    _mm512_storeu_ps(y + 16 * j, c[j]);
  }
}
void tile(const float* a, const float* p, int64_t kc, float* y, bool accumulate, const char* next, int64_t next_lines,
          int64_t ahead, int vectors = 3) {
  (vectors == 1 ? tile_v<1> : vectors == 2 ? tile_v<2> : tile_v<3>)(a, p, kc, y, accumulate, next, next_lines, ahead);
}

// The EP's stream walk: equal ranges of 16-column vectors, a panel at the boundary shared.
void split16(const Weight& w, const float* x, float* y, int t, int64_t ahead) {
  const int64_t vectors = (w.n + 15) / 16, per = (vectors + kThreads - 1) / kThreads;
  const int64_t v0 = t * per, v1 = std::min(vectors, v0 + per);
  for (int64_t p = v0 / 3; p * 3 < v1; ++p) {
    const int64_t lo = std::max<int64_t>(v0 - p * 3, 0), hi = std::min<int64_t>(v1 - p * 3, 3);
    tile(x, w.p + p * w.k * kCols + lo * 16, w.k, y + p * kCols + lo * 16, false, nullptr, 0, ahead,
         static_cast<int>(hi - lo));
  }
}

void blocked(const Weight& w, const float* x, float* y, int t, int64_t panels) {
  const int64_t per = (panels + kThreads - 1) / kThreads, p0 = t * per, p1 = std::min(panels, p0 + per);
  for (int64_t k0 = 0; k0 < w.k; k0 += kDepthBlock) {
    const int64_t kc = std::min<int64_t>(kDepthBlock, w.k - k0);
    for (int64_t p = p0; p < p1; ++p) {
      int64_t q = p + 1 < p1 ? p + 1 : -1, qk = k0;
      if (q < 0 && k0 + kDepthBlock < w.k) q = p0, qk = k0 + kDepthBlock;
      const char* next = q < 0 ? nullptr : reinterpret_cast<const char*>(w.p + (q * w.k + qk) * kCols);
      const int64_t lines = q < 0 ? 0 : std::min<int64_t>(kDepthBlock, w.k - qk) * kCols * 4 / 64;
      tile(x + k0, w.p + (p * w.k + k0) * kCols, kc, y + p * kCols, k0 > 0, next, lines, 0);
    }
  }
}

void streamed(const Weight& w, const float* x, float* y, int t, int64_t ahead) {
  const int64_t per = (w.panels + kThreads - 1) / kThreads, p0 = t * per, p1 = std::min(w.panels, p0 + per);
  for (int64_t p = p0; p < p1; ++p) tile(x, w.p + p * w.k * kCols, w.k, y + p * kCols, false, nullptr, 0, ahead);
}

void counter(const Weight& w, const float* x, float* y) {
  constexpr int64_t kChunk = 4;
  for (int64_t c = next_chunk.fetch_add(1); c * kChunk < w.panels; c = next_chunk.fetch_add(1))
    for (int64_t p = c * kChunk; p < std::min(w.panels, (c + 1) * kChunk); ++p)
      tile(x, w.p + p * w.k * kCols, w.k, y + p * kCols, false, nullptr, 0, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::atoi(argv[1]) : 60;
  std::vector<Weight> ws;
  for (int i = 0; i < 20; ++i)
    for (auto [k, n] : {std::pair<int64_t, int64_t>{512, 2048}, {2048, 512}}) {
      const int64_t panels = (n + kCols - 1) / kCols;
      ws.push_back({k, n, panels, huge_floats(static_cast<size_t>(panels * k * kCols))});
    }
  std::vector<float> a(4096, 0.01f), b(4096);
  struct Walk {
    std::string name;
    std::function<void(const Weight&, const float*, float*, int)> run;
    std::vector<double> ms;
  };
  std::vector<Walk> walks = {
      {"panels", [](const Weight& w, const float* x, float* y, int t) { blocked(w, x, y, t, w.panels); }, {}},
      {"panels-even", [](const Weight& w, const float* x, float* y, int t) { blocked(w, x, y, t, w.n / kCols); }, {}},
      {"counter", [](const Weight& w, const float* x, float* y, int) { counter(w, x, y); }, {}}};
  for (int64_t rows : {16, 32, 64})
    walks.push_back({"ahead-" + std::to_string(rows),
                     [rows](const Weight& w, const float* x, float* y, int t) { streamed(w, x, y, t, rows * kCols * 4); },
                     {}});
  walks.push_back({"split16", [](const Weight& w, const float* x, float* y, int t) { split16(w, x, y, t, 0); }, {}});
  walks.push_back({"split16-ahead-32",
                   [](const Weight& w, const float* x, float* y, int t) { split16(w, x, y, t, 32 * kCols * 4); }, {}});
  auto thread_main = [&](int t) {
    for (int pass = 0; pass < passes; ++pass)
      for (auto& walk : walks) {
        barrier();
        const auto t0 = std::chrono::steady_clock::now();
        float *x = a.data(), *y = b.data();
        for (const auto& w : ws) {
          walk.run(w, x, y, t);
          barrier();
          std::swap(x, y);
        }
        if (t == 0) walk.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
  };
  std::thread other(thread_main, 1);
  thread_main(0);
  other.join();
  for (auto& walk : walks) {
    std::sort(walk.ms.begin(), walk.ms.end());
    std::printf("%-17s median %.3f ms a pass (fastest %.3f)\n", walk.name.c_str(), walk.ms[walk.ms.size() / 2], walk.ms[0]);
  }
  return 0;
}
