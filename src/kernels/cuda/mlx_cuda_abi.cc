#include "kernels/cuda/mlx_cuda_abi.h"

#include <atomic>

#include <dlfcn.h>

#include "kernels/cuda/backend.h"

namespace ortmlx::kernels::cuda::abi {

namespace {

std::atomic<bool> g_layout_bad{false};

template <typename Fn>
void bind(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, name));
}

}  // namespace

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    if (void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      bind(h, "cuMemcpyDtoH_v2", r.memcpy_dtoh);
      bind(h, "cuMemcpy", r.memcpy);
      bind(h, "cuCtxGetDevice", r.ctx_get_device);
      bind(h, "cuCtxGetCurrent", r.ctx_get_current);
      bind(h, "cuMemHostAlloc", r.mem_host_alloc);
      bind(h, "cuMemFreeHost", r.mem_free_host);
      bind(h, "cuStreamSynchronize", r.stream_synchronize);
      if (!r.memcpy_dtoh || !r.memcpy || !r.ctx_get_device || !r.ctx_get_current || !r.mem_host_alloc ||
          !r.mem_free_host || !r.stream_synchronize)
        r = Driver{};
    }
    return r;
  }();
  return d;
}

bool layout_ok() {
  static const bool checked = [] {
    if (!available()) return false;
    // A fresh allocation of MLX's: its record must agree with the allocator on the size, and
    // name a device MLX can have made (-1 or a device index).
    auto data = mx::allocator::malloc(1 << 16);
    auto buffer = data.buffer();
    const auto* v = static_cast<const CudaBufferView*>(buffer.ptr());
    return v && v->size == mx::allocator::allocator().size(buffer) && v->size >= (1 << 16) && v->device >= -1 &&
           v->device < 64 && v->data != nullptr;
  }();
  return checked && !g_layout_bad.load(std::memory_order_relaxed);
}

const CudaBufferView* view_of(const mx::array& a) {
  if (!layout_ok()) return nullptr;
  const auto& buffer = a.buffer();
  const auto* view = static_cast<const CudaBufferView*>(buffer.ptr());
  if (!view) return nullptr;
  if (view->size != mx::allocator::allocator().size(buffer) || view->device < -1) {
    g_layout_bad = true;  // not the layout this build assumes: MLX's own paths from now on
    return nullptr;
  }
  return view;
}

}  // namespace ortmlx::kernels::cuda::abi
