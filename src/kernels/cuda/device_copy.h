// Device-to-host copies of MLX results on MLX's CUDA backend, without MLX's host read.
//
// Why: reading an MLX array that lives in CUDA device memory on the host (array::data) makes
// MLX allocate fresh managed memory, copy the buffer into it and keep it there: an allocation
// and a synchronous copy for every output of every run, then page faults as the host reads it.
// A fused node's outputs only need their bytes in ORT's buffer, which one device-to-host copy gives.
#pragma once

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// Copies evaluated, row-contiguous `a` into host memory `dst` (a.nbytes() bytes) with one
// copy by the CUDA driver when its buffer is in CUDA device memory on the calling thread's
// device, or (with `unified`) in managed or pinned host memory. Returns false, having done
// nothing, otherwise (the CPU or Metal backend, no CUDA runtime loaded, a buffer layout this
// build does not know): the caller reads `a` as usual.
bool copy_to_host(const mx::array& a, void* dst, bool unified);

// Copies `bytes` bytes from `src` to `dst`, host-addressable buffers of any kind (CUDA managed,
// pinned or pageable host memory), by one copy of the CUDA driver, which writes and reads
// managed pages where they lie: a host memcpy into the EP's memory (managed on MLX's CUDA
// backend) moves the written pages to the host, and the next kernel that reads them, or that
// gets their buffer from MLX's cache for its output, stalls on page faults. Returns false,
// having done nothing, without a CUDA driver loaded or with no CUDA context current on the
// calling thread: the caller memcpys. A copy between device buffers may still be running when it
// returns (the driver orders it on the legacy stream): finish_copies waits for it.
bool copy_bytes(void* dst, const void* src, size_t bytes);
// Waits for the copies copy_bytes started (false: the driver failed, or none is loaded).
bool finish_copies();

// Whether `a`'s buffer is in CUDA device memory (so a.data() would move it to managed memory).
bool in_device_memory(const mx::array& a);

// Process totals, for tests and reports: copies made by copy_to_host.
size_t host_copies();

// Why copy_to_host left an output to MLX's host read: no CUDA driver loaded (the CPU or Metal
// backend), an unknown buffer layout, nothing to copy, a buffer in managed or pinned host memory
// (left to MLX's read unless asked for), a view past its buffer, another device's buffer, or the
// driver's copy failing.
enum class CopySkip : unsigned char {
  no_driver, layout, empty, unified_memory, offset, context_device, copy_failed
};
inline constexpr size_t kCopySkipReasons = 7;
size_t copy_skips(CopySkip why);
const char* copy_skip_name(CopySkip why);

}  // namespace ortmlx::kernels::cuda
