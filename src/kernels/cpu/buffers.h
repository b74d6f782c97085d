// Buffers of MLX's CPU device that MLX did not allocate: ORT's input and output tensors, read
// and written where they are, without a copy.
//
// MLX's CPU-only allocator cannot wrap foreign memory (mx::array(ptr, ...) copies it), but an
// array may view its buffer at any byte offset: a view is made at the foreign address from a
// small buffer of the allocator's own layout. An anchor array sharing that buffer lives as long
// as the view is in use, so no MLX primitive ever takes the foreign memory as its output
// (donation needs a buffer's sole owner).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::ops {

namespace mx = mlx::core;

// Views over foreign memory, anchored until this object is destroyed.
class HostViews {
 public:
  // Whether this process's MLX allocator has the layout views rely on (MLX's CPU-only
  // allocator: a size header before the data); checked once.
  static bool supported();
  // A row-major `shape` x `dtype` array over `data`, valid while the memory is and this object
  // lives; nullopt when views are not supported or `data` is not a whole number of elements
  // from the view's buffer.
  std::optional<mx::array> view(const void* data, const mx::Shape& shape, mx::Dtype dtype);
  // Views made so far.
  size_t count() const { return anchors_.size(); }

 private:
  std::vector<mx::array> anchors_;
};

// Outputs written into their destination: while an object of this class lives, a CPU kernel
// computing a bound array writes it straight into the buffer it is bound to (begin_output).
// Arrays its kernel does not compute (other primitives) are left as they are.
class OutputBinding {
 public:
  OutputBinding() = default;
  OutputBinding(const OutputBinding&) = delete;
  OutputBinding& operator=(const OutputBinding&) = delete;
  ~OutputBinding();
  // Binds `a` (to be computed: not evaluated yet, or a kept walk's array computed again;
  // row-major `a.nbytes()` at `dst`, writable). False if it cannot be.
  bool bind(const mx::array& a, void* dst);

 private:
  HostViews views_;
  std::vector<std::uintptr_t> ids_;
};

// The bytes to ask MLX's allocator for a buffer of `nbytes`: from 64 KiB, rounded up to an
// eighth of its power of two. MLX's allocator reuses a freed buffer only for a request at most
// two pages smaller, so an array one row longer every run (a decode step's KV cache) would take
// fresh, zeroed pages from the OS every run; rounded, the next runs' requests match the buffer
// freed before until a boundary. (Not for arrays in general: MLX views a row-contiguous buffer
// as a Contiguous result, and donates one, only when it is at most 16 KiB larger than needed.)
size_t allocation_size(size_t nbytes);

// What every CPU kernel's eval_cpu does first: allocates `out`, or points it at the buffer it is
// bound to (then dispatch_task, task.h).
void begin_output(const std::vector<mx::array>& inputs, mx::array& out, mx::Stream s);
// The same for an elementwise kernel that reads `donor` at the positions it writes: unbound,
// `out` takes donor's buffer when nothing else holds it (as MLX's elementwise kernels donate
// theirs), so a chain over a large activation writes no new buffer.
void begin_output_over(const mx::array& donor, mx::array& out);
// The same where the caller knows that nothing reads `donor` after this kernel (every other
// reader runs before it on the stream; graph/fuse_conv_activation.h, kConvResidualFree): its
// buffer whoever still holds it (an MLX buffer of its own, row-contiguous from its start).
void begin_output_over_last_read(const mx::array& donor, mx::array& out);

// Gives `out` a buffer for out.nbytes(): inside a ReuseOutputsScope the one it already holds,
// when nothing else holds that buffer, else a new one from MLX's allocator.
void allocate_output(mx::array& out);
// While an object of this class lives, allocate_output on this thread keeps an array's own
// buffer (a kept walk's replay computes the same arrays again, of the same sizes). Why: a small
// model's run is a few dozen steps of a few hundred bytes, and each step's allocation and the
// release of the last run's buffer (each under the allocator's lock) cost more than its math.
uint64_t cpu_reused_outputs();  // buffers kept so in this process
class ReuseOutputsScope {
 public:
  ReuseOutputsScope();
  ~ReuseOutputsScope();
  ReuseOutputsScope(const ReuseOutputsScope&) = delete;
  ReuseOutputsScope& operator=(const ReuseOutputsScope&) = delete;

 private:
  bool prev_;
};

}  // namespace ortmlx::ops
