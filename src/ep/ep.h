// OrtEp and OrtEpFactory implementations. Both embed the ORT struct as their first base, so the
// pointer ORT holds is the object itself; ownership crosses the boundary by new (CreateEp /
// CreateEpFactories) and delete (ReleaseEp / ReleaseEpFactory) only.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "ep/options.h"
#include "ep/ort_api.h"
#include "ep/schema_domains.h"
#include "trace/trace_file.h"

namespace ortmlx::ep {

class MlxEpFactory;
class DeviceMemory;

class MlxEp : public OrtEp {
 public:
  MlxEp(MlxEpFactory& factory, EpOptions options, bool gpu, const OrtLogger* logger);
  MlxEp(const MlxEp&) = delete;
  MlxEp& operator=(const MlxEp&) = delete;

  const EpOptions& options() const { return options_; }
  MlxEpFactory& factory() const { return factory_; }
  bool gpu() const { return gpu_; }
  // With report_path: one JSON line of the process-wide device-memory counters (at release).
  void report_device_memory();

 private:
  static const char* ORT_API_CALL GetNameImpl(const OrtEp* self) noexcept;
  static OrtStatus* ORT_API_CALL GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                   OrtEpGraphSupportInfo* info) noexcept;
  static OrtStatus* ORT_API_CALL CompileImpl(OrtEp* self, const OrtGraph** graphs,
                                             const OrtNode** fused_nodes, size_t count,
                                             OrtNodeComputeInfo** infos,
                                             OrtNode** ep_context_nodes) noexcept;
  static void ORT_API_CALL ReleaseNodeComputeInfosImpl(OrtEp* self, OrtNodeComputeInfo** infos,
                                                       size_t count) noexcept;
  static OrtStatus* ORT_API_CALL GetPreferredDataLayoutImpl(OrtEp* self,
                                                            OrtEpDataLayout* layout) noexcept;
  static OrtStatus* ORT_API_CALL ShouldConvertDataLayoutForOpImpl(OrtEp* self, const char* domain,
                                                                  const char* op_type,
                                                                  OrtEpDataLayout target,
                                                                  int* should_convert) noexcept;
  static OrtStatus* ORT_API_CALL SetDynamicOptionsImpl(OrtEp* self, const char* const* keys,
                                                       const char* const* values,
                                                       size_t n) noexcept;
  static OrtStatus* ORT_API_CALL OnRunStartImpl(OrtEp* self, const OrtRunOptions* opts) noexcept;
  static OrtStatus* ORT_API_CALL OnRunEndImpl(OrtEp* self, const OrtRunOptions* opts,
                                              bool sync) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEp* self, const OrtMemoryInfo* info,
                                                     OrtAllocator** allocator) noexcept;
  static OrtStatus* ORT_API_CALL CreateSyncStreamForDeviceImpl(OrtEp* self,
                                                               const OrtMemoryDevice* device,
                                                               OrtSyncStreamImpl** stream) noexcept;
  static const char* ORT_API_CALL GetCompiledModelCompatibilityInfoImpl(
      OrtEp* self, const OrtGraph* graph) noexcept;
  static OrtStatus* ORT_API_CALL GetKernelRegistryImpl(OrtEp* self,
                                                       const OrtKernelRegistry** reg) noexcept;
  static OrtStatus* ORT_API_CALL IsConcurrentRunSupportedImpl(OrtEp* self, bool* out) noexcept;
  static OrtStatus* ORT_API_CALL SyncImpl(OrtEp* self) noexcept;
  static OrtStatus* ORT_API_CALL OnSessionInitializationEndImpl(OrtEp* self) noexcept;
  static OrtStatus* ORT_API_CALL GetDefaultMemoryDeviceImpl(const OrtEp* self,
                                                            const OrtMemoryDevice** device) noexcept;
  static OrtStatus* ORT_API_CALL CreateProfilerImpl(OrtEp* self,
                                                    OrtEpProfilerImpl** profiler) noexcept;

  void get_capability(const OrtGraph* graph, OrtEpGraphSupportInfo* info);
  void compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count,
               OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes);

  MlxEpFactory& factory_;
  EpOptions options_;
  bool gpu_;
  const OrtLogger* logger_;
  std::string compat_info_;
  std::mutex report_mu_;
};

class MlxEpFactory : public OrtEpFactory {
 public:
  explicit MlxEpFactory(const OrtLogger* default_logger);
  ~MlxEpFactory();
  DeviceMemory* device_memory() const { return device_memory_.get(); }
  // ORT_MLX_TRACE: writes the trace file and prints its slowest-ops summary (stderr).
  void flush_trace() noexcept;
  MlxEpFactory(const MlxEpFactory&) = delete;
  MlxEpFactory& operator=(const MlxEpFactory&) = delete;

 private:
  static const char* ORT_API_CALL GetNameImpl(const OrtEpFactory*) noexcept;
  static const char* ORT_API_CALL GetVendorImpl(const OrtEpFactory*) noexcept;
  static uint32_t ORT_API_CALL GetVendorIdImpl(const OrtEpFactory*) noexcept;
  static const char* ORT_API_CALL GetVersionImpl(const OrtEpFactory*) noexcept;
  static OrtStatus* ORT_API_CALL GetSupportedDevicesImpl(OrtEpFactory* self,
                                                         const OrtHardwareDevice* const* devices,
                                                         size_t num_devices,
                                                         OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices,
                                                         size_t* num_ep_devices) noexcept;
  static OrtStatus* ORT_API_CALL CreateEpImpl(OrtEpFactory* self,
                                              const OrtHardwareDevice* const* devices,
                                              const OrtKeyValuePairs* const* ep_metadata,
                                              size_t num_devices,
                                              const OrtSessionOptions* session_options,
                                              const OrtLogger* logger, OrtEp** ep) noexcept;
  static void ORT_API_CALL ReleaseEpImpl(OrtEpFactory* self, OrtEp* ep) noexcept;
  static OrtStatus* ORT_API_CALL ValidateCompiledModelCompatibilityInfoImpl(
      OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t num_devices,
      const char* compat_info, OrtCompiledModelCompatibility* out) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEpFactory* self,
                                                     const OrtMemoryInfo* info,
                                                     const OrtKeyValuePairs* options,
                                                     OrtAllocator** allocator) noexcept;
  static void ORT_API_CALL ReleaseAllocatorImpl(OrtEpFactory* self, OrtAllocator* a) noexcept;
  static OrtStatus* ORT_API_CALL CreateDataTransferImpl(OrtEpFactory* self,
                                                        OrtDataTransferImpl** out) noexcept;
  static bool ORT_API_CALL IsStreamAwareImpl(const OrtEpFactory* self) noexcept;
  static OrtStatus* ORT_API_CALL CreateSyncStreamForDeviceImpl(OrtEpFactory* self,
                                                               const OrtMemoryDevice* device,
                                                               const OrtKeyValuePairs* options,
                                                               OrtSyncStreamImpl** stream) noexcept;
  static OrtStatus* ORT_API_CALL GetHardwareDeviceIncompatibilityDetailsImpl(
      OrtEpFactory* self, const OrtHardwareDevice* hw,
      OrtDeviceEpIncompatibilityDetails* details) noexcept;
  static OrtStatus* ORT_API_CALL CreateExternalResourceImporterForDeviceImpl(
      OrtEpFactory* self, const OrtEpDevice* ep_device,
      OrtExternalResourceImporterImpl** out) noexcept;
  static OrtStatus* ORT_API_CALL GetNumCustomOpDomainsImpl(OrtEpFactory* self,
                                                           size_t* n) noexcept;
  static OrtStatus* ORT_API_CALL GetCustomOpDomainsImpl(OrtEpFactory* self,
                                                        OrtCustomOpDomain** domains,
                                                        size_t n) noexcept;
  static OrtStatus* ORT_API_CALL InitGraphicsInteropImpl(OrtEpFactory* self,
                                                         const OrtEpDevice* ep_device,
                                                         const OrtGraphicsInteropConfig* cfg) noexcept;
  static OrtStatus* ORT_API_CALL DeinitGraphicsInteropImpl(OrtEpFactory* self,
                                                           const OrtEpDevice* ep_device) noexcept;

  const OrtLogger* default_logger_;
  std::unique_ptr<DeviceMemory> device_memory_;  // null unless ORT_MLX_DEVICE_MEMORY=1
  std::unique_ptr<SchemaDomains> schema_domains_;  // schemas ORT's build lacks (GetCustomOpDomains)
  std::unique_ptr<trace::TraceFile> trace_file_;   // null unless ORT_MLX_TRACE is set
  std::mutex trace_mu_;
};

}  // namespace ortmlx::ep
