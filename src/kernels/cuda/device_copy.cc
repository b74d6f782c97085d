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

// The CUDA driver API: MLX links the runtime statically (its symbols are not exported), but
// loads libcuda.so.1, whose entry points take the context MLX made current on this thread.
using MemcpyDtoHFn = int (*)(void* dst, unsigned long long src, size_t bytes);
using CtxGetDeviceFn = int (*)(int* device);

struct Driver {
  MemcpyDtoHFn memcpy_dtoh = nullptr;
  CtxGetDeviceFn ctx_get_device = nullptr;
};

// The driver MLX already loaded (never loaded here: RTLD_NOLOAD), or nothing.
const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    if (void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      r.memcpy_dtoh = reinterpret_cast<MemcpyDtoHFn>(::dlsym(h, "cuMemcpyDtoH_v2"));
      r.ctx_get_device = reinterpret_cast<CtxGetDeviceFn>(::dlsym(h, "cuCtxGetDevice"));
      if (!r.memcpy_dtoh || !r.ctx_get_device) r = Driver{};
    }
    return r;
  }();
  return d;
}

std::atomic<bool> g_layout_ok{true};
std::atomic<size_t> g_copies{0};

// The device buffer under `a`, or null when it is not one this code may copy from.
const CudaBufferView* device_buffer(const mx::array& a) {
  if (!g_layout_ok.load(std::memory_order_relaxed) || !driver().memcpy_dtoh) return nullptr;
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
  int current = -1;  // no context current on this thread: an error, and MLX's own read
  if (driver().ctx_get_device(&current) != 0 || current != view->device) return nullptr;
  return view;
}

}  // namespace

bool in_device_memory(const mx::array& a) { return device_buffer(a) != nullptr; }

bool copy_to_host(const mx::array& a, void* dst) {
  if (!dst || !a.flags().row_contiguous) return false;
  const CudaBufferView* view = device_buffer(a);
  if (!view) return false;
  const auto* src = static_cast<const std::byte*>(view->data) + a.offset();
  if (driver().memcpy_dtoh(dst, reinterpret_cast<std::uintptr_t>(src), a.nbytes()) != 0) return false;
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

size_t host_copies() { return g_copies.load(std::memory_order_relaxed); }

}  // namespace ortmlx::kernels::cuda
