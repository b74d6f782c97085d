// Products of several float32 rows by a constant matrix: cpu_packed_matmul of kernels/cpu/kernels.h.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <map>
#include <mutex>
#include <tuple>
#include <optional>
#include <stdexcept>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

std::atomic<uint64_t> g_runs{0};

#ifdef ORTMLX_X86

// Tile geometry by instruction set: `rows` rows of the product a tile, `cols` columns of the
// packed panel (so many floats of each of its rows). AVX-512: 8 x 48 (24 zmm accumulators, three
// loads of B and eight broadcasts of A feed 24 FMAs); AVX2: 6 x 16 (12 ymm accumulators).
struct Geometry {
  int rows, cols;
};
constexpr Geometry kAvx512{8, 48};
constexpr Geometry kAvx2{6, 16};

std::atomic<uint64_t> g_huge_bytes{0};
std::atomic<uint64_t> g_layouts{0};
std::atomic<uint64_t> g_prefetch_bytes{0};
std::atomic<uint64_t> g_row_splits{0};
std::atomic<uint64_t> g_stream_walks{0};
std::atomic<uint64_t> g_ahead_walks{0};

// Panels of 4 MiB and more in 2 MiB pages (asked of the kernel before the first touch, where
// transparent huge pages are granted on request): a one-row product streams its whole weight
// once a call, and in 4 KiB pages every page of it was a TLB miss.
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
bool huge_panels(size_t bytes) { return bytes >= 2 * kHugePage; }
// [p, p + bytes), p on a 2 MiB boundary, into huge pages (counted in the report).
void advise_huge_pages(void* p, size_t bytes) {
  if (::madvise(p, bytes, MADV_HUGEPAGE) == 0) g_huge_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (!huge_panels(bytes)) return std::allocator<T>().allocate(n);
    void* p = std::aligned_alloc(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
    if (!p) throw std::bad_alloc();
    advise_huge_pages(p, bytes);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (!huge_panels(n * sizeof(T)))
      std::allocator<T>().deallocate(p, n);
    else
      std::free(p);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};
using PanelBuffer = std::vector<float, HugePageAllocator<float>>;

// w [K, N] (element (k, n) at w[k * sk + n * sn]) as panels of `cols` columns into `out`, each its K
// rows of `cols` floats side by side ([N / cols][K][cols], the last panel's missing columns zero).
void pack_panels_into(float* out, const float* w, int64_t K, int64_t N, int64_t sk, int64_t sn, int cols) {
  g_layouts.fetch_add(1, std::memory_order_relaxed);
  const int64_t panels = (N + cols - 1) / cols;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * cols, width = std::min<int64_t>(cols, N - n0);
    float* o = out + p * K * cols;
    for (int64_t k = 0; k < K; ++k, o += cols) {
      if (sn == 1) {
        std::memcpy(o, w + k * sk + n0, static_cast<size_t>(width) * sizeof(float));
      } else {
        for (int64_t j = 0; j < width; ++j) o[j] = w[k * sk + (n0 + j) * sn];
      }
      std::fill(o + width, o + cols, 0.f);
    }
  }
}

int64_t panel_floats(int64_t K, int64_t N, int cols) { return (N + cols - 1) / cols * K * cols; }

// cpu_packed_panels' buffer: panels of 4 MiB and more start at its first 2 MiB boundary and end
// inside it on one, all in huge pages (MLX's allocator puts its buffers anywhere in a page; the
// pages of the slack around them are never touched).
bool in_huge_pages(int64_t floats) { return huge_panels(static_cast<size_t>(floats) * sizeof(float)); }
int64_t panel_buffer_floats(int64_t floats) {
  return floats + (in_huge_pages(floats) ? int64_t{2 * kHugePage / sizeof(float)} : 0);
}
const float* panels_start(const float* buffer, int64_t floats) {
  if (!in_huge_pages(floats)) return buffer;
  return reinterpret_cast<const float*>((reinterpret_cast<uintptr_t>(buffer) + kHugePage - 1) & ~(kHugePage - 1));
}

PanelBuffer pack_panels(const float* w, int64_t K, int64_t N, int64_t sk, int64_t sn, int cols) {
  PanelBuffer out(static_cast<size_t>(panel_floats(K, N, cols)));
  pack_panels_into(out.data(), w, K, N, sk, sn, cols);
  return out;
}

// Cache lines of the panel a thread reads next, asked into L2 by a tile while it computes: a
// panel's first tile otherwise waits on memory for the whole panel (an LM head's weight is read
// from memory once a call). The lines are spread over the tile's K steps, one every 1, 2 or 4.
struct NextLines {
  const char* line = nullptr;
  int64_t count = 0;
  int64_t spacing(int64_t kc) const {  // a power of two, so that touch() tests with a mask
    const int64_t room = count > 0 ? kc / count : 1;
    return room >= 4 ? 4 : room >= 2 ? 2 : 1;
  }
  void touch(int64_t k, int64_t every) {
    if (count > 0 && (k & (every - 1)) == 0) {
      _mm_prefetch(line, _MM_HINT_T1);
      line += 64;
      --count;
    }
  }
};

// C[r, 0:width) = (C[r, 0:width) if `accumulate`, else bias[0:width) or 0) + sum_{k < kc} A[r, k] *
// P[k, 0:16 V) for r < R; A's rows `lda` apart, C's `ldc`; P: kc rows of a panel, 48 floats apart,
// of which the tile reads V vectors of 16 (a thread's window of a panel split between threads).
// `ahead` > 0: the lines that far past the ones read are asked for (the hardware's prefetchers
// alone keep too few in flight: a one-row product streams its weight from memory, the tiles of
// larger ones read their panel from L2 or the L3).
template <int R, int V = 3>
__attribute__((target("avx512f,prfchw"))) void tile_avx512(const float* a, int64_t lda, const float* p, int64_t kc, float* c,
                                                    int64_t ldc, int width, bool accumulate, const float* bias,
                                                    NextLines next, int64_t ahead) {
  __mmask16 m[V];
  for (int j = 0; j < V; ++j) {
    const int w = std::clamp(width - 16 * j, 0, 16);
    m[j] = static_cast<__mmask16>((1u << w) - 1);
  }
  __m512 start[V];
  for (int j = 0; j < V; ++j)
    start[j] = bias && !accumulate ? _mm512_maskz_loadu_ps(m[j], bias + 16 * j) : _mm512_setzero_ps();
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) acc[r][j] = start[j];
  // The tile's lines of C asked for, to write, while it computes: written cold at its end, each
  // store waited on a line from memory or the other core's cache. MLX's buffers start 8 bytes
  // past a 16-byte boundary, so a row's 16 V floats span V + 1 lines.
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < V; ++j) __builtin_prefetch(c + r * ldc + 16 * j, 1, 3);
    __builtin_prefetch(c + r * ldc + 16 * V - 1, 1, 3);
  }
  const int64_t every = next.spacing(kc);
  for (int64_t k = 0; k < kc; ++k, p += 48) {
    __m512 b[V];
    for (int j = 0; j < V; ++j) b[j] = _mm512_loadu_ps(p + 16 * j);
    if (ahead > 0) {
      const char* q = reinterpret_cast<const char*>(p) + ahead;
      for (int j = 0; j < V; ++j) _mm_prefetch(q + 64 * j, _MM_HINT_T0);
    }
    next.touch(k, every);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_set1_ps(a[r * lda + k]);
      for (int j = 0; j < V; ++j) acc[r][j] = _mm512_fmadd_ps(v, b[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) {
      float* cp = c + r * ldc + 16 * j;
      __m512 v = acc[r][j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m[j], cp));
      _mm512_mask_storeu_ps(cp, m[j], v);
    }
}

template <int R>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* a, int64_t lda, const float* p, int64_t kc, float* c,
                                                    int64_t ldc, int width, bool accumulate, const float* bias,
                                                    NextLines next, int64_t ahead) {
  alignas(32) float b16[16] = {};
  if (bias && !accumulate)
    for (int j = 0; j < width; ++j) b16[j] = bias[j];
  const __m256 start0 = _mm256_load_ps(b16), start1 = _mm256_load_ps(b16 + 8);
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = start0, acc[r][1] = start1;
  const int64_t every = next.spacing(kc);
  for (int64_t k = 0; k < kc; ++k, p += 16) {
    const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
    if (ahead > 0) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead, _MM_HINT_T0);
    next.touch(k, every);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 v = _mm256_broadcast_ss(a + r * lda + k);
      acc[r][0] = _mm256_fmadd_ps(v, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(v, b1, acc[r][1]);
    }
  }
  alignas(32) float tmp[16];
  for (int r = 0; r < R; ++r) {
    float* cp = c + r * ldc;
    if (width == 16) {
      __m256 v0 = acc[r][0], v1 = acc[r][1];
      if (accumulate) v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cp)), v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cp + 8));
      _mm256_storeu_ps(cp, v0);
      _mm256_storeu_ps(cp + 8, v1);
    } else {
      _mm256_store_ps(tmp, acc[r][0]);
      _mm256_store_ps(tmp + 8, acc[r][1]);
      for (int j = 0; j < width; ++j) cp[j] = (accumulate ? cp[j] : 0.f) + tmp[j];
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int, bool, const float*, NextLines,
                        int64_t);
// The tile function for r rows (1..geometry rows), of a whole panel or (AVX-512) of `vectors`
// vectors of 16 columns of one.
template <int V>
constexpr TileFn k512_rows[] = {tile_avx512<1, V>, tile_avx512<2, V>, tile_avx512<3, V>, tile_avx512<4, V>,
                                tile_avx512<5, V>, tile_avx512<6, V>, tile_avx512<7, V>, tile_avx512<8, V>};
TileFn tile_for(bool avx512, int r, int vectors = 3) {
  static constexpr TileFn k2[] = {tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>, tile_avx2<5>, tile_avx2<6>};
  if (!avx512) return k2[r - 1];
  return vectors == 1 ? k512_rows<1>[r - 1] : vectors == 2 ? k512_rows<2>[r - 1] : k512_rows<3>[r - 1];
}

// Rows are taken in blocks of this many (their share of A stays in L2 while every panel of the
// thread passes over it).
constexpr int64_t kRowBlock = 128;

// K is cut into blocks this deep by default: a row block's share of A and a panel's block
// together about half the L2 (1536 with 2 MiB, 768 with 1 MiB), so that both stay there while
// the row block's tiles read them; deeper blocks read and write C fewer times.
int64_t depth_from_l2() {
  static const int64_t depth = [] {
    long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) l2 = long{1} << 20;
    const int64_t per_k = int64_t{sizeof(float)} * (kRowBlock + kAvx512.cols);
    return std::clamp<int64_t>(l2 * 9 / 16 / per_k / 256 * 256, 256, 4096);
  }();
  return depth;
}

// One thread's share of the (panel, row tile) items, [i0, i1) in panel-major order (a run of
// panels, the first and last perhaps in part), walked per K block as row blocks, then the
// share's panels, then their row tiles in the block; each tile asks for its part of the panel
// that comes next (the share's next panel, or its first one for the next row block).
struct BlockWalk {
  int64_t i0, i1, row_tiles, block_tiles;
  // f(panel, tile row, next panel or -1, byte offset and bytes of this tile's part of its block)
  template <class F>
  void for_each(int64_t block_bytes, F&& f) const {
    if (i0 >= i1) return;
    const int64_t first = i0 / row_tiles, last = (i1 - 1) / row_tiles;
    for (int64_t m0 = 0; m0 < row_tiles; m0 += block_tiles) {
      const int64_t m1 = std::min(row_tiles, m0 + block_tiles);
      for (int64_t panel = first; panel <= last; ++panel) {
        const int64_t t0 = std::max(m0, i0 - panel * row_tiles), t1 = std::min(m1, i1 - panel * row_tiles);
        if (t0 >= t1) continue;
        const int64_t next = panel < last ? panel + 1 : m1 < row_tiles ? first : -1;
        const int64_t per = ((block_bytes + (t1 - t0) - 1) / (t1 - t0) + 63) / 64 * 64;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t offset = (t - t0) * per;
          f(panel, t, next, offset, next < 0 ? 0 : std::clamp<int64_t>(block_bytes - offset, 0, per));
        }
      }
    }
  }
};

#endif  // ORTMLX_X86

struct GemmShape {
  int64_t m, k, n;
  bool operator==(const GemmShape&) const = default;
};

class PackedMatmul : public mx::UnaryPrimitive {
 public:
  // `prepacked`: input 1 is w's panels (cpu_packed_panels) instead of w.
  PackedMatmul(mx::Stream st, const GemmShape& g, bool parallel, bool avx512, const PackedWalk& walk,
               std::optional<CpuUnary> epilogue, bool prepacked)
      : mx::UnaryPrimitive(st), g_(g), parallel_(parallel), avx512_(avx512), walk_(walk), epilogue_(epilogue),
        prepacked_(prepacked), cache_(prepacked ? nullptr : std::make_shared<Packed>()) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
#ifdef ORTMLX_X86
    const auto& w = inputs[1];
    const int64_t sk = prepacked_ ? 0 : w.strides()[0], sn = prepacked_ ? 0 : w.strides()[1];
    begin_output(inputs, out, stream());
    std::optional<RowMajorInput> bias;
    if (inputs.size() > 2) bias.emplace(inputs[2]);
    dispatch_task(stream(), [cache = cache_, x = RowMajorInput(inputs[0]), wp = w.data<float>(), sk, sn, bias = std::move(bias),
                  yp = out.data<float>(), g = g_, parallel = parallel_, avx512 = avx512_, blocks = walk_.blocks,
                  split_rows = walk_.rows, ahead = walk_.ahead, tile_ahead = walk_.tile_ahead,
                  depth = walk_.depth > 0 ? walk_.depth : depth_from_l2(), epilogue = epilogue_] {
      g_runs.fetch_add(1, std::memory_order_relaxed);
      const Geometry geo = avx512 ? kAvx512 : kAvx2;
      // The panels: the prepacked input's, else the ones laid out for w's buffer.
      const auto laid_out = cache ? cache->panels_for(wp, sk, sn, g, geo.cols) : nullptr;
      const float* panel_data = laid_out ? laid_out->data() : panels_start(wp, panel_floats(g.k, g.n, geo.cols));
      const float* xp = x.rows();
      const float* bp = bias ? bias->rows() : nullptr;
      const int64_t row_tiles = (g.m + geo.rows - 1) / geo.rows, panels = (g.n + geo.cols - 1) / geo.cols;
      // The tiles' lines asked ahead, as many K steps ahead whatever the panel's width (an AVX2
      // panel's row is a third of an AVX-512 one's).
      const int64_t tile_bytes_ahead = tile_ahead * geo.cols / kAvx512.cols;
      // The epilogue over a tile's finished rows of C, while they are in L1.
      const CpuUnaryFn unary = epilogue ? cpu_unary_fn(*epilogue, avx512) : nullptr;
      auto finish = [&](float* c, int rows, int width) {
        if (unary)
          for (int r = 0; r < rows; ++r) unary(c + r * g.n, c + r * g.n, width);
      };
      auto tile = [&](int64_t panel, int64_t tile_row, int64_t k0, NextLines next) {
        const int64_t r0 = tile_row * geo.rows, kc = std::min(depth, g.k - k0);
        const int rows = static_cast<int>(std::min<int64_t>(geo.rows, g.m - r0));
        const int width = static_cast<int>(std::min<int64_t>(geo.cols, g.n - panel * geo.cols));
        float* c = yp + r0 * g.n + panel * geo.cols;
        tile_for(avx512, rows)(xp + r0 * g.k + k0, g.k, panel_data + (panel * g.k + k0) * geo.cols, kc, c, g.n,
                               width, k0 > 0, bp ? bp + panel * geo.cols : nullptr, next, tile_bytes_ahead);
        if (k0 + kc == g.k) finish(c, rows, width);
      };
      // One thread's share of a walk, per K block; the walk's tile rows count from `row0`.
      auto walk_share = [&](const BlockWalk& walk, int64_t row0) {
        int64_t asked = 0;  // counted once a share: one shared counter per tile is a contended line
        for (int64_t k0 = 0; k0 < g.k; k0 += depth) {
          const int64_t block_bytes = std::min(depth, g.k - k0) * geo.cols * int64_t{sizeof(float)};
          walk.for_each(block_bytes, [&](int64_t panel, int64_t tile_row, int64_t next_panel, int64_t next_offset,
                                         int64_t next_bytes) {
            NextLines next;
            if (next_panel >= 0) {
              next.line = reinterpret_cast<const char*>(panel_data + (next_panel * g.k + k0) * geo.cols) + next_offset;
              next.count = (next_bytes + 63) / 64;
              asked += next.count * 64;
            }
            tile(panel, row0 + tile_row, k0, next);
          });
        }
        g_prefetch_bytes.fetch_add(static_cast<uint64_t>(asked), std::memory_order_relaxed);
      };
      if (ahead > 0 && row_tiles == 1) {
        // One row tile (a decode step's product): the weight is read once, from memory. The
        // threads take equal column ranges in 16-column vectors (an AVX-512 panel of three at a
        // boundary split between two: with whole panels a thread could get a panel more than
        // the other, and the last one reading alone gets half the bandwidth), each its range
        // over the whole depth, so that its lines form one stream the tile asks ahead on.
        const int64_t per = geo.cols / 16, vectors = (g.n + 15) / 16;
        const int threads = parallel ? static_cast<int>(std::min<int64_t>(cpu_threads(), vectors)) : 1;
        g_stream_walks.fetch_add(1, std::memory_order_relaxed);
        cpu_parallel_for(vectors, threads, [&](int64_t v0, int64_t v1) {
          for (int64_t panel = v0 / per; panel * per < v1; ++panel) {
            const int64_t lo = std::max<int64_t>(v0 - panel * per, 0), hi = std::min<int64_t>(v1 - panel * per, per);
            const int64_t col = panel * geo.cols + lo * 16;
            const int width = static_cast<int>(std::min<int64_t>(16 * (hi - lo), g.n - col));
            tile_for(avx512, static_cast<int>(g.m), static_cast<int>(hi - lo))(
                xp, g.k, panel_data + panel * g.k * geo.cols + lo * 16, g.k, yp + col, g.n, width, false,
                bp ? bp + col : nullptr, {}, ahead);
            finish(yp + col, static_cast<int>(g.m), width);
          }
        });
        return;
      }
      if (tile_ahead > 0) g_ahead_walks.fetch_add(1, std::memory_order_relaxed);
      const int64_t items = row_tiles * panels;
      const int64_t block_tiles = std::max<int64_t>(1, kRowBlock / geo.rows);
      const int threads = parallel ? static_cast<int>(std::min<int64_t>(cpu_threads(), items)) : 1;
      if (blocks && split_rows > 0 && threads > 1 && g.m >= threads * split_rows) {
        // split_rows rows or more a thread: the threads take rows (each all the panels), the rows
        // its neighbours' kernels split the same way wrote or will read (a normalization's,
        // the GELU's), so a thread's rows stay in its core's cache from one kernel to the next.
        g_row_splits.fetch_add(1, std::memory_order_relaxed);
        cpu_parallel_for(row_tiles, threads, [&](int64_t t0, int64_t t1) {
          walk_share(BlockWalk{0, panels * (t1 - t0), t1 - t0, block_tiles}, t0);
        });
        return;
      }
      // Work items: (panel, row tile) in panel-major order, a contiguous share a thread, so that
      // a panel's block stays in the cache of the thread that reads it.
      cpu_parallel_for(items, threads, [&](int64_t i0, int64_t i1) {
        if (!blocks) {
          for (int64_t k0 = 0; k0 < g.k; k0 += depth)
            for (int64_t i = i0; i < i1; ++i) tile(i / row_tiles, i % row_tiles, k0, {});
          return;
        }
        walk_share(BlockWalk{i0, i1, row_tiles, block_tiles}, 0);
      });
    });
#else
    throw std::logic_error("[PackedMatmul] needs x86-64");
#endif
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[PackedMatmul] runs on the CPU stream only");
  }
  const char* name() const override { return epilogue_ ? "PackedMatmulGelu" : "PackedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PackedMatmul*>(&other);
    return o && o->g_ == g_ && o->parallel_ == parallel_ && o->avx512_ == avx512_ && o->walk_ == walk_ &&
           o->epilogue_ == epilogue_ && o->prepacked_ == prepacked_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    out.back() = static_cast<int>(g_.n);
    return {out};
  }

 private:
  // The panels of weight buffer `w` in this layout, shared by every primitive that holds them (a
  // prompt's product and a decode step's read one copy): found by the buffer's address while
  // any primitive holds them (a graph constant's buffer lives as long as the programs that read
  // it), made anew otherwise.
  static std::shared_ptr<const PanelBuffer> shared_panels(const float* w, int64_t sk, int64_t sn,
                                                                 const GemmShape& g, int cols) {
    using Key = std::tuple<const float*, int64_t, int64_t, int64_t, int64_t, int>;
    static std::mutex mu;
    static std::map<Key, std::weak_ptr<const PanelBuffer>> held;
    const Key key{w, sk, sn, g.k, g.n, cols};
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = held.find(key); it != held.end())
      if (auto p = it->second.lock()) return p;
    for (auto it = held.begin(); it != held.end();) it = it->second.expired() ? held.erase(it) : std::next(it);
    std::shared_ptr<const PanelBuffer> p;
#ifdef ORTMLX_X86
    p = std::make_shared<const PanelBuffer>(pack_panels(w, g.k, g.n, sk, sn, cols));
#endif
    held[key] = p;
    return p;
  }

  // The constant weight's panels, taken on the first run for its buffer (on the stream thread).
  // Held by the tasks too: an eager run's primitive may go before its task runs.
  struct Packed {
    std::shared_ptr<const PanelBuffer> panels_for(const float* w, int64_t sk, int64_t sn, const GemmShape& g,
                                                         int cols) {
      std::lock_guard<std::mutex> lock(mu);
      if (src != w || sk_ != sk || sn_ != sn || !panels) {
        panels = shared_panels(w, sk, sn, g, cols);
        src = w, sk_ = sk, sn_ = sn;
      }
      return panels;
    }
    std::mutex mu;
    const float* src = nullptr;
    int64_t sk_ = 0, sn_ = 0;
    std::shared_ptr<const PanelBuffer> panels;
  };

  GemmShape g_;
  bool parallel_;
  bool avx512_;
  PackedWalk walk_;
  std::optional<CpuUnary> epilogue_;
  bool prepacked_;
  std::shared_ptr<Packed> cache_;  // null when prepacked
};

}  // namespace

uint64_t cpu_packed_matmul_runs() { return g_runs.load(std::memory_order_relaxed); }
uint64_t cpu_packed_huge_page_bytes() { return g_huge_bytes.load(std::memory_order_relaxed); }
uint64_t cpu_packed_panel_layouts() { return g_layouts.load(std::memory_order_relaxed); }
uint64_t cpu_packed_prefetch_bytes() { return g_prefetch_bytes.load(std::memory_order_relaxed); }
uint64_t cpu_packed_row_splits() { return g_row_splits.load(std::memory_order_relaxed); }
uint64_t cpu_packed_stream_walks() { return g_stream_walks.load(std::memory_order_relaxed); }
uint64_t cpu_packed_ahead_walks() { return g_ahead_walks.load(std::memory_order_relaxed); }
int64_t cpu_packed_default_depth() {
#ifdef ORTMLX_X86
  return depth_from_l2();
#else
  return 0;
#endif
}

std::optional<mx::array> cpu_packed_panels(const mx::array& w) {
#ifdef ORTMLX_X86
  if (!cpu_row_kernels_enabled() || !cpu_has_avx2_fma() || w.dtype() != mx::float32 || w.ndim() != 2 ||
      w.size() == 0 || !w.is_available())
    return std::nullopt;
  const int cols = (cpu_avx512_kernels() ? kAvx512 : kAvx2).cols;
  const int64_t K = w.shape(0), N = w.shape(1), floats = panel_floats(K, N, cols), total = panel_buffer_floats(floats);
  if (total > std::numeric_limits<int>::max()) return std::nullopt;
  // MLX's own buffer (its allocator knows the size: a contiguous() of it shares it, no copy).
  auto data = mx::allocator::malloc(static_cast<size_t>(total) * sizeof(float));
  auto* p = const_cast<float*>(panels_start(static_cast<float*>(data.buffer().raw_ptr()), floats));
  if (in_huge_pages(floats))
    advise_huge_pages(p, (static_cast<size_t>(floats) * sizeof(float) + kHugePage - 1) & ~(kHugePage - 1));
  pack_panels_into(p, w.data<float>(), K, N, w.strides()[0], w.strides()[1], cols);
  return mx::array(std::move(data), mx::Shape{static_cast<int>(total)}, mx::float32);
#else
  (void)w;
  return std::nullopt;
#endif
}

std::optional<mx::array> cpu_packed_matmul(const mx::array& x, const mx::array& w, bool parallel,
                                           const PackedWalk& walk, mx::Stream s, const std::optional<mx::array>& bias,
                                           std::optional<CpuUnary> epilogue, const std::optional<mx::array>& panels) {
#ifdef ORTMLX_X86
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || !cpu_has_avx2_fma() || x.dtype() != mx::float32 ||
      w.dtype() != mx::float32 || x.ndim() < 2 || w.ndim() != 2 || x.shape(-1) != w.shape(0) || w.size() == 0 ||
      (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != w.shape(1))))
    return std::nullopt;
  const int64_t K = w.shape(0), N = w.shape(1), M = static_cast<int64_t>(x.size()) / K;
  if (M < 1) return std::nullopt;
  mx::Shape out = x.shape();
  out.back() = static_cast<int>(N);
  // Panels laid out for this process's tiles (the same geometry the primitive takes).
  const bool avx512 = cpu_avx512_kernels();
  const int cols = (avx512 ? kAvx512 : kAvx2).cols;
  const bool prepacked = panels && panels->dtype() == mx::float32 && panels->ndim() == 1 &&
                         static_cast<int64_t>(panels->size()) == panel_buffer_floats(panel_floats(K, N, cols));
  std::vector<mx::array> in{x, prepacked ? *panels : w};
  if (bias) in.push_back(*bias);
  return mx::array(std::move(out), mx::float32,
                   std::make_shared<PackedMatmul>(s, GemmShape{M, K, N}, parallel, avx512, walk, epilogue, prepacked),
                   std::move(in));
#else
  return std::nullopt;
#endif
}

}  // namespace ortmlx::ops
