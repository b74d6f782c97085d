#include "kernels/cuda/pinned_inputs.h"

#include <atomic>
#include <bit>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/mlx_cuda_abi.h"

namespace ortmlx::kernels::cuda {

namespace {

constexpr unsigned kHostAllocPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE: every context may use it
constexpr unsigned kHostAllocDeviceMap = 0x02;  // CU_MEMHOSTALLOC_DEVICEMAP: kernels may read it
constexpr size_t kMinBlock = 256;
constexpr size_t kPooledLimit = size_t{256} << 20;  // free bytes kept for reuse; beyond, released

// A pinned block. The record MLX reads comes first, so the Buffer MLX holds is the block itself.
struct Block {
  abi::CudaBufferView view;  // data: the pinned memory; size: the block's capacity; device -1
};
static_assert(offsetof(Block, view) == 0);

std::atomic<size_t> g_copies{0};
std::atomic<size_t> g_bytes{0};

// Set when the pool is destroyed (library unload, process exit): blocks MLX lets go of later
// are left to the process's end (no CUDA call is safe then).
bool g_pool_gone = false;

struct Pool {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<Block*>> free;  // by capacity
  size_t free_bytes = 0;
  std::vector<Block*> surplus;  // over kPooledLimit: released by the next take() (a CUDA call)

  ~Pool() {
    g_pool_gone = true;
    for (auto& [cap, blocks] : free)
      for (Block* b : blocks) release(b);
    for (Block* b : surplus) release(b);
  }

  static void release(Block* b) {
    abi::driver().mem_free_host(b->view.data);  // an error at process end is of no consequence
    g_bytes -= b->view.size;
    delete b;
  }
};

Pool* pool() {
  static Pool p;
  return g_pool_gone ? nullptr : &p;
}

// MLX's deleter for a block's array. It may run on a thread of MLX's that completes GPU work,
// where no CUDA call is allowed: it only files the block.
void give_back(mx::allocator::Buffer buffer) {
  auto* b = static_cast<Block*>(buffer.ptr());
  Pool* p = pool();
  if (!p || !b) return;
  std::lock_guard<std::mutex> lock(p->mu);
  if (p->free_bytes + b->view.size > kPooledLimit) {
    p->surplus.push_back(b);
    return;
  }
  p->free[b->view.size].push_back(b);
  p->free_bytes += b->view.size;
}

Block* take(size_t nbytes) {
  Pool* p = pool();
  if (!p) return nullptr;
  size_t cap = std::bit_ceil(std::max(nbytes, kMinBlock));
  std::vector<Block*> surplus;
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    surplus.swap(p->surplus);
    if (auto it = p->free.find(cap); it != p->free.end() && !it->second.empty()) {
      b = it->second.back();
      it->second.pop_back();
      p->free_bytes -= cap;
    }
  }
  for (Block* s : surplus) Pool::release(s);
  if (b) return b;
  void* mem = nullptr;
  if (abi::driver().mem_host_alloc(&mem, cap, kHostAllocPortable | kHostAllocDeviceMap) != 0 || !mem)
    return nullptr;
  g_bytes += cap;
  return new Block{{mem, cap, -1}};
}

}  // namespace

std::optional<mx::array> pinned_copy(const void* src, const mx::Shape& shape, mx::Dtype dtype) {
  const auto& drv = abi::driver();
  if (!drv.loaded() || !abi::layout_ok()) return std::nullopt;
  void* ctx = nullptr;  // pinning needs a context current on this thread (MLX's, once it ran here)
  if (drv.ctx_get_current(&ctx) != 0 || !ctx) return std::nullopt;
  size_t nbytes = dtype.size();
  for (auto d : shape) nbytes *= static_cast<size_t>(d);
  Block* b = take(nbytes);
  if (!b) return std::nullopt;
  if (nbytes) std::memcpy(b->view.data, src, nbytes);
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return mx::array(mx::allocator::Data(mx::allocator::Buffer(b), give_back), shape, dtype);
}

size_t pinned_copies() { return g_copies.load(std::memory_order_relaxed); }
size_t pinned_bytes() { return g_bytes.load(std::memory_order_relaxed); }

}  // namespace ortmlx::kernels::cuda
