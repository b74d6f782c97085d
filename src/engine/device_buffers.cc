#include "engine/device_buffers.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include "engine/memory_guard.h"
#include "kernels/cpu/buffers.h"

namespace ortmlx::engine::device_buffers {

namespace {

// One registered buffer: a fresh MLX allocation (`data`), or an adopted MLX result (`array`,
// which owns its buffer; holding it keeps the buffer alive and unshared).
struct Entry {
  std::unique_ptr<mx::allocator::Data> data;
  std::optional<mx::array> array;
  size_t nbytes = 0;
  mx::allocator::Buffer buffer() const { return data ? data->buffer() : array->buffer(); }
};

// Set when the registry is destroyed (library unload, process exit). A plain bool is constant-
// initialized and never destroyed, so it can still be read then: ORT may free buffers from its
// own static destructors after ours ran, and there is nothing left to do (the registry released
// every buffer it held as it died). A static object, not a leaked pointer: unloading the
// library must not leak (LeakSanitizer's churn gate registers and unregisters it).
bool g_registry_gone = false;

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, Entry> entries;
  size_t bytes = 0;
  // Freed buffers by their allocated size (set_pool_limit), and their bytes.
  std::multimap<size_t, std::unique_ptr<mx::allocator::Data>> pool;
  size_t pool_bytes = 0, pool_limit = 0;
  ~Registry() { g_registry_gone = true; }
};

// MLX's CPU allocator (the only one without a GPU backend) is the one whose cache falls short.
bool pools() {
  static const bool cpu_allocator = !mx::is_available(mx::Device::gpu);
  return cpu_allocator;
}

Registry* registry() {
  static Registry r;
  return g_registry_gone ? nullptr : &r;
}

thread_local std::optional<mx::array> t_armed;
thread_local void* t_taken = nullptr;

size_t bytes_of(const mx::Shape& shape, mx::Dtype dtype) {
  size_t n = dtype.size();
  for (auto d : shape) n *= static_cast<size_t>(std::max(d, 0));
  return n;
}

}  // namespace

Counters& counters() {
  static Counters c;  // atomics only: trivially destructible, valid to the end
  return c;
}

void* allocate(size_t nbytes) {
  Entry e;
  void* p = nullptr;
  if (t_armed && nbytes > 0 && nbytes == t_armed->nbytes()) {
    // The armed result becomes this allocation (see arm()).
    p = t_armed->data<void>();
    e.array = std::move(*t_armed);
    t_armed.reset();
    t_taken = p;
  } else {
    // (rounded up: KV buffers one row longer each step reuse the buffers freed before)
    const size_t size = ops::allocation_size(nbytes);
    if (auto* r = registry(); r && pools() && size >= kPoolMinBytes) {
      std::lock_guard<std::mutex> lock(r->mu);
      if (auto it = r->pool.find(size); it != r->pool.end()) {
        e.data = std::move(it->second);
        r->pool.erase(it);
        r->pool_bytes -= size;
        counters().allocations_pooled++;
      }
    }
    if (!e.data) {
      check_allocation(nbytes, "a buffer of the MLX EP's device allocator");
      e.data = std::make_unique<mx::allocator::Data>(mx::allocator::malloc(size));
    }
    p = e.data->buffer().raw_ptr();
    if (!p) throw std::bad_alloc();
  }
  e.nbytes = nbytes;
  auto* r = registry();
  if (!r) throw std::bad_alloc();  // the library is being unloaded
  std::lock_guard<std::mutex> lock(r->mu);
  r->bytes += nbytes;
  r->entries.emplace(p, std::move(e));
  counters().allocations++;
  return p;
}

bool release(void* p) {
  Entry e;  // destroyed (the MLX buffer freed) outside the lock
  {
    auto* r = registry();
    if (!r) return false;
    std::lock_guard<std::mutex> lock(r->mu);
    auto it = r->entries.find(p);
    if (it == r->entries.end()) return false;
    e = std::move(it->second);
    r->bytes -= e.nbytes;
    r->entries.erase(it);
    const size_t size = ops::allocation_size(e.nbytes);
    if (e.data && pools() && size >= kPoolMinBytes && r->pool_bytes + size <= r->pool_limit) {
      r->pool.emplace(size, std::move(e.data));
      r->pool_bytes += size;
    }
  }
  counters().frees++;
  return true;
}

void set_pool_limit(size_t bytes) {
  auto* r = registry();
  if (!r) return;
  std::multimap<size_t, std::unique_ptr<mx::allocator::Data>> freed;  // freed outside the lock
  std::lock_guard<std::mutex> lock(r->mu);
  r->pool_limit = bytes;
  while (r->pool_bytes > r->pool_limit) {  // the largest first
    auto it = std::prev(r->pool.end());
    r->pool_bytes -= it->first;
    freed.insert(r->pool.extract(it));
  }
}

size_t drop_pool() {
  auto* r = registry();
  if (!r) return 0;
  std::multimap<size_t, std::unique_ptr<mx::allocator::Data>> freed;
  std::lock_guard<std::mutex> lock(r->mu);
  freed.swap(r->pool);
  return std::exchange(r->pool_bytes, 0);
}

bool owns(const void* p, size_t* nbytes) {
  auto* r = registry();
  if (!r) return false;
  std::lock_guard<std::mutex> lock(r->mu);
  auto it = r->entries.find(p);
  if (it == r->entries.end()) return false;
  if (nbytes) *nbytes = it->second.nbytes;
  return true;
}

size_t count() {
  auto* r = registry();
  if (!r) return 0;
  std::lock_guard<std::mutex> lock(r->mu);
  return r->entries.size();
}

size_t bytes() {
  auto* r = registry();
  if (!r) return 0;
  std::lock_guard<std::mutex> lock(r->mu);
  return r->bytes;
}

std::optional<mx::array> borrow(const void* p, const mx::Shape& shape, mx::Dtype dtype) {
  if (!p) return std::nullopt;
  mx::allocator::Buffer buffer{nullptr};
  {
    auto* r = registry();
    if (!r) return std::nullopt;
    std::lock_guard<std::mutex> lock(r->mu);
    auto it = r->entries.find(p);
    if (it == r->entries.end() || it->second.nbytes < bytes_of(shape, dtype)) return std::nullopt;
    buffer = it->second.buffer();
  }
  // Not owned (no-op deleter): the registry keeps the memory until ORT frees it, which it does
  // not do while the fused node that reads it runs.
  counters().inputs_borrowed++;
  return mx::array(mx::allocator::Data(buffer, [](mx::allocator::Buffer) {}), shape, dtype);
}

bool adoptable(const mx::array& a) {
  if (!a.is_available() || a.nbytes() == 0 || !a.is_donatable()) return false;
  if (!a.flags().row_contiguous || a.data_size() != a.size()) return false;
  auto buffer = a.buffer();
  return buffer.ptr() && a.data<void>() == buffer.raw_ptr();
}

void arm(const mx::array& a) {
  t_armed = a;
  t_taken = nullptr;
}

void* disarm() {
  t_armed.reset();
  return std::exchange(t_taken, nullptr);
}

namespace {

// Takes the registered buffer at `dst` out of its entry as an array of `like`'s shape and dtype
// that owns it, so MLX may donate it to an operation writing `like`'s result (the caller puts
// the result back with put_back). MLX donates an input when it holds the only reference to an
// owned buffer of the output's item size and at most 16 KiB larger (backend/common/utils.h)
// and, for a broadcast operand, is row-contiguous: checked here, since a target not donated
// would be freed with its last reference. Item sizes of 2 and more keep a broadcast `true`
// from being the one donated. Called with the registry locked.
std::optional<mx::array> take_target(Registry& r, void* dst, const mx::array& like) {
  auto it = r.entries.find(dst);
  if (it == r.entries.end() || like.size() < 2 || like.itemsize() < 2 || it->second.nbytes != like.nbytes() ||
      mx::allocator::allocator().size(it->second.buffer()) > like.nbytes() + 16384)
    return std::nullopt;
  Entry& e = it->second;
  std::optional<mx::array> target;
  if (e.data) {
    target.emplace(std::move(*e.data), like.shape(), like.dtype());
    e.data.reset();
  } else if (e.array && e.array->shape() == like.shape() && e.array->dtype() == like.dtype() &&
             e.array->is_donatable() && e.array->flags().row_contiguous) {
    target = std::move(e.array);
    e.array.reset();
  }
  return target;
}

// Evaluates `results` (each computed over the target taken for writes[which[k]]) and puts each
// back into its registry entry. Donated: the result now owns the registered buffer. Otherwise
// the target was freed with its last reference and dst's memory is gone: the result's buffer is
// kept instead under the same pointer ORT knows, which is impossible, so it fails loudly.
std::vector<bool> evaluate_in_place(Registry& r, const std::vector<void*>& dsts, std::vector<mx::array>& results,
                                    const std::vector<size_t>& which, size_t n) {
  std::vector<bool> done(n, false);
  std::exception_ptr failed;
  try {
    mx::eval(results);
  } catch (...) {
    failed = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (size_t k = 0; k < which.size(); ++k) {
      const size_t i = which[k];
      auto it = r.entries.find(dsts[k]);
      if (it == r.entries.end()) continue;
      mx::array& c = results[k];
      done[i] = !failed && c.is_available() && c.data<void>() == dsts[k];
      if (done[i]) counters().outputs_written_on_device++;
      it->second.array = std::move(c);
    }
  }
  if (failed) std::rethrow_exception(failed);
  for (size_t k = 0; k < which.size(); ++k)
    if (!done[which[k]])
      throw std::runtime_error("[MLX EP] an output buffer in EP memory was not written in place");
  return done;
}

}  // namespace

std::vector<bool> write_on_device(const std::vector<std::pair<void*, mx::array>>& writes, mx::Stream s) {
  auto* r = registry();
  if (!r || writes.empty()) return std::vector<bool>(writes.size(), false);
  std::vector<std::optional<mx::array>> targets(writes.size());
  {
    std::lock_guard<std::mutex> lock(r->mu);
    for (size_t i = 0; i < writes.size(); ++i) targets[i] = take_target(*r, writes[i].first, writes[i].second);
  }
  std::vector<mx::array> copies;
  std::vector<size_t> which;
  std::vector<void*> dsts;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!targets[i]) continue;
    // where(true, result, target): the result's values, in the target's (donated) buffer.
    copies.push_back(mx::where(mx::array(true), writes[i].second, std::move(*targets[i]), s));
    targets[i].reset();
    which.push_back(i);
    dsts.push_back(writes[i].first);
  }
  return evaluate_in_place(*r, dsts, copies, which, writes.size());
}

std::vector<bool> write_rows_in_place(const std::vector<RowWrite>& writes, mx::Stream s) {
  auto* r = registry();
  if (!r || writes.empty()) return std::vector<bool>(writes.size(), false);
  std::vector<mx::array> updates;
  std::vector<size_t> which;
  std::vector<void*> dsts;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    for (size_t i = 0; i < writes.size(); ++i) {
      // The target as the output (shape, dtype): the buffer as the run read it.
      auto target = take_target(*r, writes[i].dst, writes[i].output);
      if (!target) continue;
      updates.push_back(mx::slice_update(std::move(*target), writes[i].update, writes[i].start, writes[i].axes, s));
      which.push_back(i);
      dsts.push_back(writes[i].dst);
    }
  }
  return evaluate_in_place(*r, dsts, updates, which, writes.size());
}

}  // namespace ortmlx::engine::device_buffers
