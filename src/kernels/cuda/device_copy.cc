#include "kernels/cuda/device_copy.h"

#include <array>
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
std::array<std::atomic<size_t>, kCopySkipReasons> g_skips{};

// The device buffer under `a`, or null (with why) when it is not one this code may copy from.
const CudaBufferView* device_buffer(const mx::array& a, CopySkip* why) {
  auto skip = [why](CopySkip r) -> const CudaBufferView* {
    *why = r;
    return nullptr;
  };
  if (!driver().memcpy_dtoh) return skip(CopySkip::no_driver);
  if (!g_layout_ok.load(std::memory_order_relaxed)) return skip(CopySkip::layout);
  if (!a.is_available() || a.nbytes() == 0) return skip(CopySkip::empty);
  const auto& buffer = a.buffer();
  const auto* view = static_cast<const CudaBufferView*>(buffer.ptr());
  if (!view) return skip(CopySkip::empty);
  if (view->size != mx::allocator::allocator().size(buffer) || view->device < -1) {
    g_layout_ok = false;  // not the layout this build assumes: MLX's own reads from now on
    return skip(CopySkip::layout);
  }
  if (view->device < 0 || !view->data) return skip(CopySkip::unified_memory);
  if (a.offset() < 0 || static_cast<size_t>(a.offset()) + a.nbytes() > view->size)
    return skip(CopySkip::offset);
  int current = -1;  // no context current on this thread: an error, and MLX's own read
  if (driver().ctx_get_device(&current) != 0 || current != view->device)
    return skip(CopySkip::context_device);
  return view;
}

void count_skip(CopySkip why) { g_skips[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed); }

}  // namespace

bool in_device_memory(const mx::array& a) {
  CopySkip why{};
  return device_buffer(a, &why) != nullptr;
}

bool copy_to_host(const mx::array& a, void* dst) {
  if (!dst || !a.flags().row_contiguous) return false;
  CopySkip why{};
  const CudaBufferView* view = device_buffer(a, &why);
  if (!view) {
    count_skip(why);
    return false;
  }
  const auto* src = static_cast<const std::byte*>(view->data) + a.offset();
  if (driver().memcpy_dtoh(dst, reinterpret_cast<std::uintptr_t>(src), a.nbytes()) != 0) {
    count_skip(CopySkip::copy_failed);
    return false;
  }
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

size_t host_copies() { return g_copies.load(std::memory_order_relaxed); }

size_t copy_skips(CopySkip why) { return g_skips[static_cast<size_t>(why)].load(std::memory_order_relaxed); }

const char* copy_skip_name(CopySkip why) {
  switch (why) {
    case CopySkip::no_driver: return "no_driver";
    case CopySkip::layout: return "layout";
    case CopySkip::empty: return "empty";
    case CopySkip::unified_memory: return "unified_memory";
    case CopySkip::offset: return "offset";
    case CopySkip::context_device: return "context_device";
    case CopySkip::copy_failed: return "copy_failed";
  }
  return "?";
}

}  // namespace ortmlx::kernels::cuda
