#include "kernels/cuda/device_copy.h"

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <dlfcn.h>

namespace ortmlx::kernels::cuda {

namespace {

// MLX's CUDA buffer record (mlx/backend/cuda/allocator.h), which its header cannot be included
// for without the CUDA toolkit. Checked against the allocator's own size() before each use, and
// the path is off for good at the first disagreement.
struct CudaBufferView {
  void* data;
  size_t size;
  int device;  // -1: managed or pinned host memory
};

using MemcpyFn = int (*)(void*, const void*, size_t, int);
using GetDeviceFn = int (*)(int*);
constexpr int kDefault = 4;  // cudaMemcpyDefault: the direction from the pointers (unified addressing)

struct Runtime {
  MemcpyFn memcpy = nullptr;
  GetDeviceFn get_device = nullptr;
};

// The CUDA runtime MLX already loaded (never loaded here: RTLD_NOLOAD), or nothing.
const Runtime& runtime() {
  static const Runtime rt = [] {
    Runtime r;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (void* h = ::dlopen(name, RTLD_LAZY | RTLD_NOLOAD)) {
        r.memcpy = reinterpret_cast<MemcpyFn>(::dlsym(h, "cudaMemcpy"));
        r.get_device = reinterpret_cast<GetDeviceFn>(::dlsym(h, "cudaGetDevice"));
        if (r.memcpy && r.get_device) return r;
      }
    }
    return Runtime{};
  }();
  return rt;
}

std::atomic<bool> g_layout_ok{true};
std::atomic<size_t> g_copies{0};

// The device buffer under `a`, or null when it is not one this code may copy from.
const CudaBufferView* device_buffer(const mx::array& a) {
  if (!g_layout_ok.load(std::memory_order_relaxed) || !runtime().memcpy) return nullptr;
  if (!a.is_available() || a.nbytes() == 0) return nullptr;
  const auto& buffer = a.buffer();
  const auto* view = static_cast<const CudaBufferView*>(buffer.ptr());
  if (!view) return nullptr;
  if (view->size != mx::allocator::allocator().size(buffer) || view->device < -1) {
    g_layout_ok = false;  // not the layout this build assumes: MLX's own reads from now on
    return nullptr;
  }
  if (view->device < 0 || !view->data) return nullptr;
  if (a.offset() < 0 || static_cast<size_t>(a.offset()) + a.nbytes() > view->size) return nullptr;
  int current = -1;
  if (runtime().get_device(&current) != 0 || current != view->device) return nullptr;
  return view;
}

}  // namespace

bool in_device_memory(const mx::array& a) { return device_buffer(a) != nullptr; }

bool copy_to_host(const mx::array& a, void* dst) {
  if (!dst || !a.flags().row_contiguous) return false;
  const CudaBufferView* view = device_buffer(a);
  if (!view) return false;
  const auto* src = static_cast<const std::byte*>(view->data) + a.offset();
  if (runtime().memcpy(dst, src, a.nbytes(), kDefault) != 0) return false;
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

size_t host_copies() { return g_copies.load(std::memory_order_relaxed); }

}  // namespace ortmlx::kernels::cuda
