#include "engine/device_buffers.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include "engine/memory_guard.h"

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
  ~Registry() { g_registry_gone = true; }
};

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
    check_allocation(nbytes, "a buffer of the MLX EP's device allocator");
    e.data = std::make_unique<mx::allocator::Data>(mx::allocator::malloc(std::max<size_t>(nbytes, 1)));
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
  }
  counters().frees++;
  return true;
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

}  // namespace ortmlx::engine::device_buffers
