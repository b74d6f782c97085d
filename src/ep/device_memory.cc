#include "ep/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <mlx/mlx.h>

#include "engine/device_buffers.h"
#include "ep/error_wall.h"
#include "kernels/cuda/device_copy.h"

namespace ortmlx::ep {

namespace mx = mlx::core;
namespace db = engine::device_buffers;

int device_memory_from_env() {
  const char* v = std::getenv("ORT_MLX_DEVICE_MEMORY");
  const std::string s = v ? v : "";
  // Anything else: off. The factory cannot fail over it (ORT would drop the whole library);
  // CreateEp rejects the same value as a malformed device_memory option.
  return s == "1" ? 1 : s == "2" ? 2 : 0;
}

namespace {

// One OrtAllocator per CreateAllocator call; all of them share the process-wide registry of
// MLX buffers (engine/device_buffers.h), so a buffer may be freed through any of them.
struct MlxAllocator : OrtAllocator {
  const OrtMemoryInfo* info;

  explicit MlxAllocator(const OrtMemoryInfo* i) : OrtAllocator{}, info(i) {
    version = g_api_version;
    Alloc = AllocImpl;
    Free = FreeImpl;
    Info = InfoImpl;
    Reserve = AllocImpl;  // no arena: a reservation is an allocation
    if (g_api_version >= 23) {
      GetStats = GetStatsImpl;
      AllocOnStream = AllocOnStreamImpl;
    }
    if (g_api_version >= 25) Shrink = ShrinkImpl;
  }

  // Null on failure is ORT's out-of-memory signal; nothing may throw into ORT.
  static void* ORT_API_CALL AllocImpl(OrtAllocator*, size_t size) noexcept {
    try {
      return db::allocate(size);
    } catch (...) {
      return nullptr;
    }
  }
  static void* ORT_API_CALL AllocOnStreamImpl(OrtAllocator* self, size_t size,
                                              OrtSyncStream*) noexcept {
    return AllocImpl(self, size);  // not stream aware: MLX evaluates synchronously in Compute
  }
  static void ORT_API_CALL FreeImpl(OrtAllocator*, void* p) noexcept {
    if (!p) return;
    try {
      db::release(p);  // false: not ours (ORT never does this); nothing safe to do with it
    } catch (...) {
    }
  }
  static const OrtMemoryInfo* ORT_API_CALL InfoImpl(const OrtAllocator* self) noexcept {
    return static_cast<const MlxAllocator*>(self)->info;
  }
  static OrtStatus* ORT_API_CALL GetStatsImpl(const OrtAllocator*, OrtKeyValuePairs** out) noexcept {
    return guard("allocator GetStats", [&] {
      *out = nullptr;
      OrtKeyValuePairs* kv = nullptr;
      g_ort->CreateKeyValuePairs(&kv);
      auto& c = db::counters();
      g_ort->AddKeyValuePair(kv, "InUse", std::to_string(db::bytes()).c_str());
      g_ort->AddKeyValuePair(kv, "NumAllocs", std::to_string(c.allocations.load()).c_str());
      *out = kv;
    });
  }
  static OrtStatus* ORT_API_CALL ShrinkImpl(OrtAllocator*) noexcept { return nullptr; }
};

// Copies between ORT's CPU memory and the EP's memory, both ways, and within the EP's memory.
// Every one of them is host-addressable (MLX's CPU allocations, or CUDA managed memory on MLX's
// CUDA backend), so a copy is a memcpy once MLX has no pending work writing the source; on the
// CUDA backend the driver copies instead (kernels/cuda/device_copy.h: copy_bytes), leaving
// managed pages on the GPU, unless ORT_MLX_DEVICE_COPIES is 0 or 1.
struct MlxDataTransfer : OrtDataTransferImpl {
  MlxDataTransfer() : OrtDataTransferImpl{} {
    ort_version_supported = g_api_version;
    Release = ReleaseImpl;
    CanCopy = CanCopyImpl;
    CopyTensors = CopyTensorsImpl;
  }

  static void ORT_API_CALL ReleaseImpl(OrtDataTransferImpl*) noexcept {}  // the factory owns it

  static bool is_host(const OrtMemoryDevice* d) {
    return g_ep_api->MemoryDevice_GetDeviceType(d) == OrtMemoryInfoDeviceType_CPU &&
           !is_ep_memory(d);
  }

  static bool ORT_API_CALL CanCopyImpl(const OrtDataTransferImpl*, const OrtMemoryDevice* src,
                                       const OrtMemoryDevice* dst) noexcept {
    if (!src || !dst) return false;
    const bool s_ours = is_ep_memory(src), d_ours = is_ep_memory(dst);
    return (s_ours || d_ours) && (s_ours || is_host(src)) && (d_ours || is_host(dst));
  }

  static OrtStatus* ORT_API_CALL CopyTensorsImpl(OrtDataTransferImpl*, const OrtValue** src,
                                                 OrtValue** dst, OrtSyncStream**,
                                                 size_t n) noexcept {
    return guard("CopyTensors", [&] {
      bool reads_ours = false;
      for (size_t i = 0; i < n; ++i)
        reads_ours |= is_ep_memory(g_ep_api->Value_GetMemoryDevice(src[i]));
      // The EP evaluates before Compute returns, so its buffers are complete; synchronizing
      // MLX also covers work another caller queued on this thread's streams.
      if (reads_ours) mx::synchronize();
      // Not a session's: the device_copies option's environment form chooses (0 or 1: memcpy).
      const char* env = std::getenv("ORT_MLX_DEVICE_COPIES");
      const bool by_driver = !env || !*env || std::strcmp(env, "2") == 0;
      auto& c = db::counters();
      for (size_t i = 0; i < n; ++i) {
        size_t src_bytes = 0, dst_bytes = 0;
        check(g_ort->GetTensorSizeInBytes(src[i], &src_bytes));
        check(g_ort->GetTensorSizeInBytes(dst[i], &dst_bytes));
        if (src_bytes != dst_bytes)
          throw std::invalid_argument("tensor " + std::to_string(i) + ": source has " +
                                      std::to_string(src_bytes) + " bytes, destination " +
                                      std::to_string(dst_bytes));
        const void* from = nullptr;
        void* to = nullptr;
        check(g_ort->GetTensorData(src[i], &from));
        check(g_ort->GetTensorMutableData(dst[i], &to));
        if (src_bytes && from != to) {
          if (by_driver && kernels::cuda::copy_bytes(to, from, src_bytes))
            c.copies_by_driver++;
          else
            std::memcpy(to, from, src_bytes);
        }
        const bool s = is_ep_memory(g_ep_api->Value_GetMemoryDevice(src[i]));
        const bool d = is_ep_memory(g_ep_api->Value_GetMemoryDevice(dst[i]));
        if (s && d) {
          c.copies_d2d++;
          c.bytes_d2d += src_bytes;
        } else if (s) {
          c.copies_d2h++;
          c.bytes_d2h += src_bytes;
        } else {
          c.copies_h2d++;
          c.bytes_h2d += src_bytes;
        }
      }
    });
  }
};

}  // namespace

bool is_ep_memory(const OrtMemoryDevice* d) {
  if (!d) return false;
  auto type = g_ep_api->MemoryDevice_GetDeviceType(d);
  return g_ep_api->MemoryDevice_GetVendorId(d) == kMemoryVendorId &&
         g_ep_api->MemoryDevice_GetMemoryType(d) == OrtDeviceMemoryType_DEFAULT &&
         (type == OrtMemoryInfoDeviceType_CPU || type == OrtMemoryInfoDeviceType_GPU);
}

DeviceMemory::DeviceMemory(bool gpu_type_everywhere) : gpu_type_everywhere_(gpu_type_everywhere) {
  // MLX's CPU backend: a CPU-type device with the EP's vendor id, distinct from ORT's CPU
  // (vendor 0), so ORT routes copies through our data transfer and the engine sees its own
  // buffers. MLX's GPU backend: a GPU-type device. OrtDeviceAllocator: ORT reserves
  // OrtArenaAllocator for its own arena.
  check(g_ort->CreateMemoryInfo_V2("MLX", OrtMemoryInfoDeviceType_CPU, kMemoryVendorId, 0,
                                   OrtDeviceMemoryType_DEFAULT, 0, OrtDeviceAllocator, &cpu_));
  OrtStatus* st = g_ort->CreateMemoryInfo_V2("MLX GPU", OrtMemoryInfoDeviceType_GPU,
                                             kMemoryVendorId, 0, OrtDeviceMemoryType_DEFAULT, 0,
                                             OrtDeviceAllocator, &gpu_);
  if (st) {
    g_ort->ReleaseMemoryInfo(cpu_);
    check(st);
  }
  transfer_ = new MlxDataTransfer();
}

DeviceMemory::~DeviceMemory() {
  for (auto* a : allocators_) delete static_cast<MlxAllocator*>(a);
  delete static_cast<MlxDataTransfer*>(transfer_);
  if (cpu_) g_ort->ReleaseMemoryInfo(cpu_);
  if (gpu_) g_ort->ReleaseMemoryInfo(gpu_);
}

OrtStatus* DeviceMemory::create_allocator(const OrtMemoryInfo* info, OrtAllocator** out) {
  return guard("CreateAllocator", [&] {
    *out = nullptr;
    if (!is_ours(info))
      throw std::invalid_argument("memory info was not registered by this factory");
    auto a = std::make_unique<MlxAllocator>(info);
    std::lock_guard<std::mutex> lock(mu_);
    allocators_.insert(a.get());
    *out = a.release();
  });
}

void DeviceMemory::release_allocator(OrtAllocator* a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (allocators_.erase(a)) delete static_cast<MlxAllocator*>(a);
}

OrtDataTransferImpl* DeviceMemory::data_transfer() { return transfer_; }

}  // namespace ortmlx::ep
