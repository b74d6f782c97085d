#include "kernels/cpu/buffers.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace ortmlx::ops {

namespace {

bool probe_layout() {
  // The CPU-only allocator stores a buffer's size in a size_t just before its data (a cached
  // buffer it hands back may be somewhat larger than asked for).
  auto d = mx::allocator::malloc(64);
  auto b = d.buffer();
  if (!b.ptr() || static_cast<char*>(b.raw_ptr()) != static_cast<char*>(b.ptr()) + sizeof(size_t)) return false;
  const size_t recorded = *static_cast<size_t*>(b.ptr());
  return recorded >= 64 && mx::allocator::allocator().size(b) == recorded;
}

// Bound outputs by array id (kernels run on MLX's stream thread or the caller's).
struct Bindings {
  std::mutex mu;
  std::unordered_map<std::uintptr_t, mx::array> views;
  std::atomic<size_t> live{0};
};
Bindings& bindings() {
  static Bindings b;
  return b;
}

}  // namespace

bool HostViews::supported() {
  static const bool ok = probe_layout();
  return ok;
}

std::optional<mx::array> HostViews::view(const void* data, const mx::Shape& shape, mx::Dtype dtype) {
  if (!data || !supported()) return std::nullopt;
  mx::array v(shape, dtype, nullptr, {});
  auto* header = static_cast<size_t*>(std::malloc(sizeof(size_t)));
  if (!header) return std::nullopt;
  *header = v.nbytes();  // what MLX's view tests (Contiguous) read as the buffer's size
  mx::array anchor(mx::allocator::Data(mx::allocator::Buffer{header},
                                       [](mx::allocator::Buffer b) { std::free(b.ptr()); }),
                   mx::Shape{1}, mx::uint8);
  const auto offset = reinterpret_cast<std::intptr_t>(data) - reinterpret_cast<std::intptr_t>(anchor.data<char>());
  const auto item = static_cast<std::intptr_t>(mx::size_of(dtype));
  if (offset % item != 0) return std::nullopt;
  mx::Strides strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  const size_t n = v.size();
  const int64_t largest = shape.empty() ? 1 : *std::max_element(shape.begin(), shape.end());
  mx::array::Flags flags{true, true, n <= 1 || static_cast<int64_t>(n) == largest};
  v.copy_shared_buffer(anchor, strides, flags, n, offset / item);
  v.set_status(mx::array::Status::available);
  anchors_.push_back(std::move(anchor));
  return v;
}

bool OutputBinding::bind(const mx::array& a, void* dst) {
  if (!a.has_primitive() || a.size() == 0) return false;
  auto v = views_.view(dst, a.shape(), a.dtype());
  if (!v) return false;
  auto& b = bindings();
  std::lock_guard<std::mutex> lock(b.mu);
  if (!b.views.emplace(a.id(), std::move(*v)).second) return false;
  ids_.push_back(a.id());
  b.live.fetch_add(1, std::memory_order_relaxed);
  return true;
}

OutputBinding::~OutputBinding() {
  if (ids_.empty()) return;
  auto& b = bindings();
  std::lock_guard<std::mutex> lock(b.mu);
  for (auto id : ids_) b.views.erase(id);
  b.live.fetch_sub(ids_.size(), std::memory_order_relaxed);
}

size_t allocation_size(size_t nbytes) {
  constexpr size_t kFrom = size_t{64} << 10;
  if (nbytes < kFrom) return std::max<size_t>(nbytes, 1);
  const size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

namespace {
bool take_binding(mx::array& out) {
  auto& b = bindings();
  if (!b.live.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(b.mu);
  auto it = b.views.find(out.id());
  if (it == b.views.end()) return false;
  out.copy_shared_buffer(it->second);
  return true;
}
}  // namespace

void begin_output(const std::vector<mx::array>&, mx::array& out, mx::Stream) {
  if (!take_binding(out)) allocate_output(out);
}

namespace {
// A buffer `out` can take over as it is: row-contiguous from its start, of out's size and type.
bool fits_over(const mx::array& donor, const mx::array& out) {
  return donor.flags().row_contiguous && donor.dtype() == out.dtype() && donor.data_size() == out.size() &&
         donor.data<void>() == donor.buffer().raw_ptr();
}
}  // namespace

void begin_output_over(const mx::array& donor, mx::array& out) {
  if (take_binding(out)) return;
  if (donor.is_donatable() && fits_over(donor, out)) {
    out.copy_shared_buffer(donor);
    return;
  }
  allocate_output(out);
}

void begin_output_over_last_read(const mx::array& donor, mx::array& out) {
  if (take_binding(out)) return;
  if (donor.is_available() && donor.data_shared_ptr() && donor.data_shared_ptr()->is_owned() && fits_over(donor, out)) {
    out.copy_shared_buffer(donor);
    return;
  }
  allocate_output(out);
}

namespace {
thread_local bool tl_reuse_outputs = false;
std::atomic<uint64_t> g_reused{0};
}  // namespace

uint64_t cpu_reused_outputs() { return g_reused.load(std::memory_order_relaxed); }

ReuseOutputsScope::ReuseOutputsScope() : prev_(tl_reuse_outputs) { tl_reuse_outputs = true; }
ReuseOutputsScope::~ReuseOutputsScope() { tl_reuse_outputs = prev_; }

void allocate_output(mx::array& out) {
  const auto& held = out.data_shared_ptr();
  if (tl_reuse_outputs && held && held.use_count() == 1 && out.offset() == 0 && out.flags().row_contiguous &&
      out.buffer_size() == out.nbytes()) {
    g_reused.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
}

}  // namespace ortmlx::ops
