#include "kernels/cuda/device_copy.h"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/mlx_cuda_abi.h"

namespace ortmlx::kernels::cuda {

namespace {

std::atomic<size_t> g_copies{0};
std::array<std::atomic<size_t>, kCopySkipReasons> g_skips{};

// The buffer under `a`, or null (with why) when it is not one this code may copy from: with
// `unified`, managed and pinned host buffers qualify too.
const abi::CudaBufferView* copyable_buffer(const mx::array& a, bool unified, CopySkip* why) {
  auto skip = [why](CopySkip r) -> const abi::CudaBufferView* {
    *why = r;
    return nullptr;
  };
  if (!abi::driver().loaded()) return skip(CopySkip::no_driver);
  if (!a.is_available() || a.nbytes() == 0) return skip(CopySkip::empty);
  const auto* view = abi::view_of(a);
  if (!view) return skip(abi::layout_ok() ? CopySkip::empty : CopySkip::layout);
  if (!view->data) return skip(CopySkip::empty);
  if (view->device < 0 && !unified) return skip(CopySkip::unified_memory);
  if (a.offset() < 0 || static_cast<size_t>(a.offset()) + a.nbytes() > view->size)
    return skip(CopySkip::offset);
  int current = -1;  // no context current on this thread: an error, and MLX's own read
  if (abi::driver().ctx_get_device(&current) != 0 || (view->device >= 0 && current != view->device))
    return skip(CopySkip::context_device);
  return view;
}

void count_skip(CopySkip why) { g_skips[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed); }

}  // namespace

bool in_device_memory(const mx::array& a) {
  CopySkip why{};
  return copyable_buffer(a, false, &why) != nullptr;
}

bool copy_to_host(const mx::array& a, void* dst, bool unified) {
  if (!dst || !a.flags().row_contiguous) return false;
  CopySkip why{};
  const abi::CudaBufferView* view = copyable_buffer(a, unified, &why);
  if (!view) {
    count_skip(why);
    return false;
  }
  const auto* src = static_cast<const std::byte*>(view->data) + a.offset();
  auto from = reinterpret_cast<std::uintptr_t>(src);
  // A unified buffer goes through the driver's copy, which reads it where it lies (a host
  // memcpy would migrate its pages to the host, and the next kernel writing it would fault them back).
  int rc = view->device >= 0 ? abi::driver().memcpy_dtoh(dst, from, a.nbytes())
                             : abi::driver().memcpy(reinterpret_cast<std::uintptr_t>(dst), from, a.nbytes());
  if (rc != 0) {
    count_skip(CopySkip::copy_failed);
    return false;
  }
  g_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool copy_bytes(void* dst, const void* src, size_t bytes) {
  if (!abi::driver().loaded() || !dst || !src || bytes == 0) return false;
  int current = -1;
  if (abi::driver().ctx_get_device(&current) != 0) return false;
  return abi::driver().memcpy(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes) == 0;
}

bool finish_copies() {
  return abi::driver().loaded() && abi::driver().stream_synchronize(nullptr) == 0;
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
