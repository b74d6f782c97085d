// The EP's device memory (README "Device memory and IOBinding"): buffers handed to ORT by the
// EP's OrtAllocator are MLX allocations (mx::allocator::malloc: CUDA unified memory on MLX's CUDA
// backend, host memory on the CPU backend), kept in a process-wide registry keyed by the data
// pointer ORT sees. The engine recognises those pointers: a fused-node input in EP memory is
// wrapped as an mx::array over the same buffer, without a copy, on any backend; a fused-node
// output whose MLX result is exclusively owned can become ORT's output buffer (adopt()).
// No ORT types here: the ABI layer (src/ep/device_memory.cc) wraps this in OrtAllocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::engine::device_buffers {

namespace mx = mlx::core;

// A new MLX allocation of `nbytes` (at least 1 byte), registered. Throws std::bad_alloc.
void* allocate(size_t nbytes);
// Unregisters and frees `p` (its MLX buffer goes back to MLX). False if `p` is not registered.
bool release(void* p);
// Freed buffers of at least kPoolMinBytes kept for the next allocation of their (rounded) size,
// up to set_pool_limit's bytes in all, where MLX's allocator is the CPU one: its cache holds only
// what fits beside the run's freed intermediates, so an output ORT frees every run (a prompt's
// logits) came back as fresh pages from the OS, each zeroed by a page fault, on every run (ORT's
// own CPU arena keeps it). MLX's GPU allocators keep their own cache: no pool there.
constexpr size_t kPoolMinBytes = size_t{1} << 20;
void set_pool_limit(size_t bytes);
// Frees the pooled buffers; returns their bytes (the memory guard's last resort).
size_t drop_pool();
// Whether `p` is the start of a registered buffer; its size in `*nbytes` if so.
bool owns(const void* p, size_t* nbytes = nullptr);
// Registered buffers and their bytes, now.
size_t count();
size_t bytes();

// An array over the registered buffer starting at `p`, without a copy: its data is MLX's own
// buffer (so MLX's GPU backends accept it) but not owned by the array (a no-op deleter: the
// registry keeps the memory, and MLX never donates an unowned buffer to an output). nullopt if
// `p` is not registered or the buffer is smaller than shape x dtype.
std::optional<mx::array> borrow(const void* p, const mx::Shape& shape, mx::Dtype dtype);

// Zero-copy outputs. Whether `a` (evaluated) may become ORT's output buffer: its data is an
// MLX-owned allocation that nothing else references (no other array, view, cache or compiled
// function: mx::array::is_donatable), row-contiguous, starting at its buffer's start.
bool adoptable(const mx::array& a);
// Arms the calling thread: the next allocate(n) on this thread with n == a.nbytes() returns
// a's buffer instead of a new one, registered and keeping `a` alive until release(). Exactly one
// allocation can take it; disarm() (always call it, the Armed guard does) returns the pointer it
// went to, or nullptr if none took it. Whichever allocation took it, the memory is a valid,
// exclusively held allocation of the requested size: correctness never rests on guessing which
// request ORT made.
void arm(const mx::array& a);
void* disarm();
struct Armed {
  explicit Armed(const mx::array& a) { arm(a); }
  ~Armed() { disarm(); }
  void* taken() { return disarm(); }
  Armed(const Armed&) = delete;
  Armed& operator=(const Armed&) = delete;
};

// Results written into registered buffers on the device, by MLX, in one evaluation: each
// (dst, result) pair whose dst is a registered buffer of the result's shape and dtype gets the
// result through an elementwise copy that takes dst's buffer as its output (MLX donation),
// instead of a host memcpy, which on MLX's CUDA backend (unified memory) pages the buffer to
// the host and back. Returns, per pair, whether it was written; the others are left to the
// caller. Used for outputs ORT binds to existing buffers (a shared past/present KV buffer).
std::vector<bool> write_on_device(const std::vector<std::pair<void*, mx::array>>& writes, mx::Stream s);

// Rows written into buffers of this registry in place: for each (dst, update, start, axes),
// dst's contents become slice_update(dst, update, start, axes), in one evaluation, by MLX on the
// device (the registered buffer donated to the update). Returns which were written; one not
// written was left untouched (its buffer not owned in the way donation needs).
struct RowWrite {
  void* dst = nullptr;
  mx::array output;  // the (unevaluated) output: its shape and dtype
  mx::array update, start;
  std::vector<int> axes;
};
std::vector<bool> write_rows_in_place(const std::vector<RowWrite>& writes, mx::Stream s);

// Process-wide counters (the report's "device_memory" line and the tests read them).
struct Counters {
  std::atomic<uint64_t> allocations{0}, frees{0};
  std::atomic<uint64_t> allocations_pooled{0};  // ... of the allocations, a pooled buffer reused
  std::atomic<uint64_t> inputs_borrowed{0};   // fused inputs in EP memory, used in place
  std::atomic<uint64_t> outputs_adopted{0};   // fused outputs handed to ORT without a copy
  std::atomic<uint64_t> outputs_copied{0};    // fused outputs copied into an EP-memory buffer
  std::atomic<uint64_t> outputs_written_on_device{0};  // ... of those, by MLX on the device
  std::atomic<uint64_t> outputs_by_driver{0};  // ... of those, by one copy of the CUDA driver
  std::atomic<uint64_t> outputs_rows_in_place{0};  // ... of those, only their new rows (RowWrite)
  std::atomic<uint64_t> outputs_rows_in_step{0};   // ... of those, by the run's own evaluation
  std::atomic<uint64_t> copies_h2d{0}, copies_d2h{0}, copies_d2d{0};  // OrtDataTransferImpl
  std::atomic<uint64_t> bytes_h2d{0}, bytes_d2h{0}, bytes_d2d{0};
  std::atomic<uint64_t> copies_by_driver{0};  // ... of those, by the CUDA driver (not memcpy)
};
Counters& counters();

}  // namespace ortmlx::engine::device_buffers
