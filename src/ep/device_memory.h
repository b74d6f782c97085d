// Device memory for IOBinding and decode loops (README "Device memory and IOBinding"): the
// OrtMemoryInfos the factory registers on its OrtEpDevices, the OrtAllocator over MLX's
// allocator (engine/device_buffers.h) and the OrtDataTransferImpl between ORT's CPU memory and
// the EP's memory. Only built into the factory when device memory is on (see factory.cc).
#pragma once

#include <cstdint>
#include <mutex>
#include <set>

#include "ep/ort_api.h"

namespace ortmlx::ep {

// The vendor id of the EP's memory devices ("ML"). Not a PCI id, and deliberately not NVIDIA's:
// the memory is MLX's (CUDA managed memory on MLX's CUDA backend), not CUDA EP memory, and must
// not be confused with the CUDA EP's OrtDevice (GPU, 0x10DE, 0).
inline constexpr uint32_t kMemoryVendorId = 0x4D4C;

// Whether the EP registers device memory: env ORT_MLX_DEVICE_MEMORY, read when the library is
// registered (the factory is created). See factory.cc for why it cannot be per session.
// 0: off (default); 1: on; 2: on, and the memory is declared GPU-type on every device, also on
// MLX's CPU backend (a test mode, as ORT's example EP does with vendor 0xBE57: it makes ORT
// treat the EP as a non-CPU device on a CPU-only machine, copies at boundaries included).
int device_memory_from_env();

// The EP's memory devices, created once with the factory and alive as long as it (ORT compares
// these pointers, and hands them back to CreateAllocator).
class DeviceMemory {
 public:
  explicit DeviceMemory(bool gpu_type_everywhere = false);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // The memory info for an OrtEpDevice of hardware type `type` (CPU: MLX's CPU backend; GPU:
  // MLX's GPU backend).
  const OrtMemoryInfo* info_for(OrtHardwareDeviceType type) const {
    return type == OrtHardwareDeviceType_GPU || gpu_type_everywhere_ ? gpu_ : cpu_;
  }
  bool is_ours(const OrtMemoryInfo* info) const { return info && (info == cpu_ || info == gpu_); }

  OrtStatus* create_allocator(const OrtMemoryInfo* info, OrtAllocator** out);
  void release_allocator(OrtAllocator* a);
  OrtDataTransferImpl* data_transfer();

 private:
  OrtMemoryInfo* cpu_ = nullptr;
  OrtMemoryInfo* gpu_ = nullptr;
  OrtDataTransferImpl* transfer_ = nullptr;
  bool gpu_type_everywhere_ = false;
  std::mutex mu_;
  std::set<OrtAllocator*> allocators_;
};

// True if `device` is one of the EP's memory devices (any OrtMemoryDevice, e.g. of an OrtValue).
bool is_ep_memory(const OrtMemoryDevice* device);

}  // namespace ortmlx::ep
