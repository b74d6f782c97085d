#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include <mlx/mlx.h>

#include "engine/device_buffers.h"
#include "ep/device_memory.h"
#include "ep/ep.h"
#include "ep/ep_context.h"
#include "ep/error_wall.h"
#include "ep/memory_limits.h"
#include "kernels/cuda/backend.h"
#include "trace/trace_file.h"

namespace ortmlx::ep {

namespace mx = mlx::core;

const OrtApi* g_ort = nullptr;
const OrtEpApi* g_ep_api = nullptr;
uint32_t g_api_version = ORT_API_VERSION;

namespace {

bool mlx_has_gpu() {
  try {
    return mx::is_available(mx::Device::gpu);
  } catch (...) {
    return false;
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The session's provider options for this EP: config entries "ep.<ep name>.<key>" (ORT lower-
// cases the EP name in practice; accept either spelling).
std::map<std::string, std::string> provider_options(const OrtSessionOptions* so) {
  std::map<std::string, std::string> out;
  if (!so) return out;
  OrtKeyValuePairs* raw = nullptr;
  check(g_ort->GetSessionOptionsConfigEntries(so, &raw));
  KeyValuePairsPtr kv(raw);
  const char* const* keys = nullptr;
  const char* const* values = nullptr;
  size_t n = 0;
  g_ort->GetKeyValuePairs(kv.get(), &keys, &values, &n);
  const std::string prefix = "ep." + lower(kEpName) + ".";
  for (size_t i = 0; i < n; ++i) {
    std::string k = keys[i] ? keys[i] : "";
    if (lower(k).rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = values[i] ? values[i] : "";
  }
  return out;
}

// MLX's memory and cache limits are process-wide, the EP options are per session: the limit in
// force is the smallest one a live session asked for, and what MLX had before once none asks
// (a session with memory_limit_mb=16 must not leave every later session limited to 16 MiB).
class Limits {
 public:
  static Limits& get() {
    static Limits l;
    return l;
  }
  void acquire(const EpOptions& o) {
    std::lock_guard<std::mutex> lock(mu_);
    if (o.memory_limit_mb) {
      if (memory_.empty()) default_memory_ = mx::get_memory_limit();
      memory_.insert(o.memory_limit_mb << 20);
      mx::set_memory_limit(*memory_.begin());
    }
    if (o.cache_limit_mb == SIZE_MAX && cache_.empty() && !cache_raised_) {
      cache_raised_ = true;  // once a process: MLX lowers the cache to a new limit at once
      // MLX's CPU allocator keeps 32 MiB of freed buffers by default: a model whose activations
      // are larger gets fresh pages from the OS on every run, each zeroed by the kernel. Unless a
      // session sets a limit, the cache may hold kDefaultCacheBytes (at most a quarter of MLX's
      // memory limit). Not more: MLX reuses a cached buffer only for a request at most two pages
      // smaller, so arrays that grow every run (a decode step's KV cache) leave buffers it never
      // reuses, and a larger cache holds them instead of handing the memory back to malloc.
      constexpr size_t kDefaultCacheBytes = size_t{256} << 20;
      const size_t floor = std::min(mx::get_memory_limit() / 4, kDefaultCacheBytes);
      const size_t limit = std::max(mx::set_cache_limit(floor), floor);
      set_cache(limit);
      fitted_.store(limit, std::memory_order_relaxed);
    }
    if (o.cache_limit_mb != SIZE_MAX) {
      size_t before = mx::set_cache_limit(o.cache_limit_mb << 20);
      if (cache_.empty()) default_cache_ = before;
      cache_.insert(o.cache_limit_mb << 20);
      set_cache(*cache_.begin());
    }
  }
  void release(const EpOptions& o) {
    std::lock_guard<std::mutex> lock(mu_);
    if (o.memory_limit_mb) {
      if (auto it = memory_.find(o.memory_limit_mb << 20); it != memory_.end()) memory_.erase(it);
      mx::set_memory_limit(memory_.empty() ? default_memory_ : *memory_.begin());
    }
    if (o.cache_limit_mb != SIZE_MAX) {
      if (auto it = cache_.find(o.cache_limit_mb << 20); it != cache_.end()) cache_.erase(it);
      set_cache(cache_.empty() ? default_cache_ : *cache_.begin());
    }
  }

  // See memory_limits.h, fit_cache_to_run: `freed`, what the last run freed of MLX's memory.
  void fit_run(size_t freed) {
    if (freed <= fitted_.load(std::memory_order_relaxed)) return;  // (every run: no lock)
    std::lock_guard<std::mutex> lock(mu_);
    if (!cache_.empty() || !cache_raised_) return;  // a session's own limit holds
    const size_t want = std::min(mx::get_memory_limit() / 4, freed + freed / 4);
    if (want <= fitted_.load(std::memory_order_relaxed)) return;
    set_cache(want);
    fitted_.store(want, std::memory_order_relaxed);
    raises_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t raises() const { return raises_.load(std::memory_order_relaxed); }
  size_t fitted() const { return fitted_.load(std::memory_order_relaxed); }

 private:
  // MLX's cache limit, and as much for the freed buffers the EP's device allocator keeps.
  static void set_cache(size_t bytes) {
    mx::set_cache_limit(bytes);
    engine::device_buffers::set_pool_limit(bytes);
  }

  std::mutex mu_;
  std::multiset<size_t> memory_, cache_;
  size_t default_memory_ = 0, default_cache_ = 0;
  bool cache_raised_ = false;
  std::atomic<size_t> fitted_{0};  // the default mode's limit (0 before it is set)
  std::atomic<uint64_t> raises_{0};
};

}  // namespace

void fit_cache_to_run() {
  const size_t peak = mx::get_peak_memory(), active = mx::get_active_memory();
  mx::reset_peak_memory();
  if (peak > active) Limits::get().fit_run(peak - active);
}
uint64_t cache_limit_raises() { return Limits::get().raises(); }
size_t cache_limit_bytes() { return Limits::get().fitted(); }

MlxEpFactory::MlxEpFactory(const OrtLogger* default_logger)
    : OrtEpFactory{}, default_logger_(default_logger) {
  // Every pointer of the declared version is filled: ORT 1.31 calls some of the 1.23+ ones
  // without a null check (a null one crashed get_ep_devices(), setup.md).
  ort_version_supported = g_api_version;
  GetName = GetNameImpl;
  GetVendor = GetVendorImpl;
  GetSupportedDevices = GetSupportedDevicesImpl;
  CreateEp = CreateEpImpl;
  ReleaseEp = ReleaseEpImpl;
  GetVendorId = GetVendorIdImpl;
  GetVersion = GetVersionImpl;
  ValidateCompiledModelCompatibilityInfo = ValidateCompiledModelCompatibilityInfoImpl;
  CreateAllocator = CreateAllocatorImpl;
  ReleaseAllocator = ReleaseAllocatorImpl;
  CreateDataTransfer = CreateDataTransferImpl;
  IsStreamAware = IsStreamAwareImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
  GetHardwareDeviceIncompatibilityDetails = GetHardwareDeviceIncompatibilityDetailsImpl;
  CreateExternalResourceImporterForDevice = CreateExternalResourceImporterForDeviceImpl;
  GetNumCustomOpDomains = GetNumCustomOpDomainsImpl;
  GetCustomOpDomains = GetCustomOpDomainsImpl;
  InitGraphicsInterop = InitGraphicsInteropImpl;
  DeinitGraphicsInterop = DeinitGraphicsInteropImpl;
  // Device memory is decided here, when the library is registered, not per session: ORT takes
  // an EP's memory device from the OrtMemoryInfo registered on its OrtEpDevice
  // (EpDevice_AddAllocatorInfo), and OrtEpDevices are made by GetSupportedDevices at
  // registration, before any session option exists. ORT offers no way to keep an EpDevice's
  // DEFAULT entry yet have one session use CPU memory: GetDefaultMemoryDevice (1.27) may only
  // name a registered entry. The alternatives were worse: registering the info always changes
  // every session (the default must stay CPU memory); a second OrtEpDevice per hardware device
  // changes get_ep_devices() for everyone and makes policy-based selection hand CreateEp both.
  // So: ORT_MLX_DEVICE_MEMORY=1 at registration turns it on for this registration, and the
  // session option device_memory only states what the session expects (checked in CreateEp).
  schema_domains_ = std::make_unique<SchemaDomains>();
  // The process's own trace (Chrome trace JSON), rewritten whole as each session ends.
  if (const char* path = std::getenv("ORT_MLX_TRACE"); path && *path)
    trace_file_ = std::make_unique<trace::TraceFile>(path);
  if (int mode = device_memory_from_env())
    device_memory_ = std::make_unique<DeviceMemory>(/*gpu_type_everywhere=*/mode == 2);
}

MlxEpFactory::~MlxEpFactory() { flush_trace(); }

void MlxEpFactory::flush_trace() noexcept {
  if (!trace_file_) return;
  try {
    const std::string summary = trace_file_->flush();
    std::lock_guard<std::mutex> lock(trace_mu_);
    std::cerr << "[MLX EP] trace written to " << trace_file_->path() << "; " << summary;
  } catch (const std::exception& e) {
    std::cerr << "[MLX EP] " << e.what() << "\n";
  }
}

const char* MlxEpFactory::GetNameImpl(const OrtEpFactory*) noexcept { return kEpName; }
const char* MlxEpFactory::GetVendorImpl(const OrtEpFactory*) noexcept { return kEpVendor; }
uint32_t MlxEpFactory::GetVendorIdImpl(const OrtEpFactory*) noexcept { return 0; }
const char* MlxEpFactory::GetVersionImpl(const OrtEpFactory*) noexcept { return kEpVersion; }

OrtStatus* MlxEpFactory::GetSupportedDevicesImpl(OrtEpFactory* self,
                                                 const OrtHardwareDevice* const* devices,
                                                 size_t num_devices, OrtEpDevice** ep_devices,
                                                 size_t max_ep_devices,
                                                 size_t* num_ep_devices) noexcept {
  return guard("GetSupportedDevices", [&] {
    *num_ep_devices = 0;
    const bool gpu_backend = mlx_has_gpu();
    bool cpu_done = false, gpu_done = false;
    for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
      auto type = g_ort->HardwareDevice_Type(devices[i]);
      // MLX's CPU backend serves ORT's CPU device; a GPU backend (CUDA/Metal) serves the GPU.
      bool take = (type == OrtHardwareDeviceType_CPU && !cpu_done) ||
                  (type == OrtHardwareDeviceType_GPU && gpu_backend && !gpu_done);
      if (!take) continue;
      OrtKeyValuePairs* raw_meta = nullptr;
      g_ort->CreateKeyValuePairs(&raw_meta);
      KeyValuePairsPtr meta(raw_meta);
      const char* backend = type == OrtHardwareDeviceType_GPU ? "gpu" : "cpu";
      g_ort->AddKeyValuePair(meta.get(), "mlx.device", backend);
      g_ort->AddKeyValuePair(meta.get(), "mlx.version", mx::version());
      g_ort->AddKeyValuePair(meta.get(), "mlx.device_memory",
                             static_cast<MlxEpFactory*>(self)->device_memory_ ? "1" : "0");
      OrtEpDevice* dev = nullptr;
      // ORT copies the metadata; we release ours. ORT owns the returned OrtEpDevice.
      check(g_ep_api->CreateEpDevice(self, devices[i], meta.get(), nullptr, &dev));
      if (auto& dm = static_cast<MlxEpFactory*>(self)->device_memory_) {
        // ORT keeps the pointer (and hands it back to CreateAllocator): it lives with us.
        if (OrtStatus* st = g_ep_api->EpDevice_AddAllocatorInfo(dev, dm->info_for(type))) {
          g_ep_api->ReleaseEpDevice(dev);
          check(st);
        }
      }
      ep_devices[(*num_ep_devices)++] = dev;
      (type == OrtHardwareDeviceType_GPU ? gpu_done : cpu_done) = true;
    }
  });
}

OrtStatus* MlxEpFactory::CreateEpImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                      const OrtKeyValuePairs* const*, size_t num_devices,
                                      const OrtSessionOptions* session_options,
                                      const OrtLogger* logger, OrtEp** ep) noexcept {
  return guard("CreateEp", [&] {
    *ep = nullptr;
    // session_options is valid only during this call: parse everything now.
    EpOptions opts = parse_options(provider_options(session_options));
    opts.context = read_context_options(session_options);
    if (!opts.report_path.empty()) {
      // Fail now, naming the path, rather than drop every report line later.
      std::ofstream probe(opts.report_path, std::ios::app);
      if (!probe)
        throw std::invalid_argument("option report_path: '" + opts.report_path +
                                    "' cannot be opened for appending (" + std::strerror(errno) + ")");
    }
    bool any_gpu = false;
    for (size_t i = 0; i < num_devices; ++i)
      any_gpu |= g_ort->HardwareDevice_Type(devices[i]) == OrtHardwareDeviceType_GPU;
    bool gpu = opts.device == "gpu" || (opts.device == "auto" && any_gpu);
    if (gpu && !mlx_has_gpu())
      throw std::invalid_argument("option device=gpu, but this MLX build has no GPU backend");
    auto* factory = static_cast<MlxEpFactory*>(self);
    const bool registered = factory->device_memory_ != nullptr;
    if (opts.device_memory >= 1 && !registered)
      throw std::invalid_argument(
          "option device_memory=" + std::to_string(opts.device_memory) + ", but the MLX EP library was registered without device memory: "
          "set ORT_MLX_DEVICE_MEMORY=1 in the environment before registering it (ORT takes an "
          "EP's memory device from its OrtEpDevice, made at registration)");
    if (opts.device_memory == 0 && registered)
      throw std::invalid_argument(
          "option device_memory=0, but the MLX EP library was registered with "
          "ORT_MLX_DEVICE_MEMORY=1: its devices use the EP's memory; register it without that "
          "variable for CPU memory");
    opts.device_memory = registered ? 1 : 0;
    opts.engine.device_memory = registered;
    if (gpu) {
      // MLX reads MLX_ENABLE_TF32 when its GPU backend first runs a matmul, so it is process-
      // wide: the first GPU session decides, and a value the user exported wins (overwrite=0).
      // Not yet confirmed on the H200 that MLX 0.32's CUDA backend reads it this late.
      ::setenv("MLX_ENABLE_TF32", opts.tf32 ? "1" : "0", /*overwrite=*/0);
    }
    Limits::get().acquire(opts);  // released with the EP (ReleaseEpImpl)
    try {
      *ep = new MlxEp(*factory, opts, gpu, logger);  // released in ReleaseEpImpl
    } catch (...) {
      Limits::get().release(opts);
      throw;
    }
  });
}

void MlxEpFactory::ReleaseEpImpl(OrtEpFactory*, OrtEp* ep) noexcept {
  if (!ep) return;
  auto* mlx_ep = static_cast<MlxEp*>(ep);
  EpOptions opts = mlx_ep->options();
  mlx_ep->report_device_memory();
  auto& factory = mlx_ep->factory();
  delete mlx_ep;
  Limits::get().release(opts);
  factory.flush_trace();
}

OrtStatus* MlxEpFactory::ValidateCompiledModelCompatibilityInfoImpl(
    OrtEpFactory*, const OrtHardwareDevice* const* devices, size_t num_devices,
    const char* compat_info, OrtCompiledModelCompatibility* out) noexcept {
  return guard("ValidateCompiledModelCompatibilityInfo", [&] {
    *out = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
    auto info = parse_compat(compat_info ? compat_info : "");
    if (info[""] != kEpName) return;  // another EP's string
    // Compile refuses any other EP or MLX version (the saved group is rebuilt by this build's
    // translators), so those are unsupported, not merely suboptimal.
    if (info["version"] != kEpVersion || info["mlx"] != mx::version()) {
      *out = OrtCompiledModelCompatibility_EP_UNSUPPORTED;
      return;
    }
    bool has_gpu = false, has_cpu = false;
    for (size_t i = 0; i < num_devices; ++i) {
      auto type = g_ort->HardwareDevice_Type(devices[i]);
      has_gpu |= type == OrtHardwareDeviceType_GPU;
      has_cpu |= type == OrtHardwareDeviceType_CPU;
    }
    has_gpu = has_gpu && mlx_has_gpu();
    if (info["device"] == "gpu") {
      *out = has_gpu ? OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL
                     : OrtCompiledModelCompatibility_EP_UNSUPPORTED;
    } else if (info["device"] == "cpu") {
      // Runs with device=cpu; with a GPU offered, device=auto would pick it and need a
      // recompile for it.
      *out = !has_cpu ? OrtCompiledModelCompatibility_EP_UNSUPPORTED
             : has_gpu ? OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION
                       : OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL;
    } else {
      *out = OrtCompiledModelCompatibility_EP_UNSUPPORTED;
    }
  });
}

OrtStatus* MlxEpFactory::CreateAllocatorImpl(OrtEpFactory* self, const OrtMemoryInfo* info,
                                             const OrtKeyValuePairs*,
                                             OrtAllocator** allocator) noexcept {
  *allocator = nullptr;  // without device memory: ORT's CPU memory, the default allocator
  auto& dm = static_cast<MlxEpFactory*>(self)->device_memory_;
  if (!dm) return nullptr;
  return dm->create_allocator(info, allocator);
}
void MlxEpFactory::ReleaseAllocatorImpl(OrtEpFactory* self, OrtAllocator* a) noexcept {
  if (auto& dm = static_cast<MlxEpFactory*>(self)->device_memory_; dm && a) dm->release_allocator(a);
}

OrtStatus* MlxEpFactory::CreateDataTransferImpl(OrtEpFactory* self, OrtDataTransferImpl** out) noexcept {
  // Without device memory nothing is registered, so ORT needs no copies from us. The factory
  // owns the instance (its Release is a no-op).
  auto& dm = static_cast<MlxEpFactory*>(self)->device_memory_;
  *out = dm ? dm->data_transfer() : nullptr;
  return nullptr;
}

bool MlxEpFactory::IsStreamAwareImpl(const OrtEpFactory*) noexcept { return false; }

OrtStatus* MlxEpFactory::CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                       const OrtKeyValuePairs*,
                                                       OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

OrtStatus* MlxEpFactory::GetHardwareDeviceIncompatibilityDetailsImpl(
    OrtEpFactory*, const OrtHardwareDevice*, OrtDeviceEpIncompatibilityDetails*) noexcept {
  return nullptr;  // leaving details untouched reports the device as compatible
}

OrtStatus* MlxEpFactory::CreateExternalResourceImporterForDeviceImpl(
    OrtEpFactory*, const OrtEpDevice*, OrtExternalResourceImporterImpl** out) noexcept {
  *out = nullptr;
  return nullptr;
}

OrtStatus* MlxEpFactory::GetNumCustomOpDomainsImpl(OrtEpFactory* self, size_t* n) noexcept {
  auto* f = static_cast<MlxEpFactory*>(self);
  *n = f->schema_domains_ ? f->schema_domains_->domains().size() : 0;
  return nullptr;
}
OrtStatus* MlxEpFactory::GetCustomOpDomainsImpl(OrtEpFactory* self, OrtCustomOpDomain** domains,
                                                size_t n) noexcept {
  auto* f = static_cast<MlxEpFactory*>(self);
  const auto& own =
      f->schema_domains_ ? f->schema_domains_->domains() : std::vector<OrtCustomOpDomain*>{};
  for (size_t i = 0; i < n && i < own.size(); ++i) domains[i] = own[i];
  return nullptr;
}
OrtStatus* MlxEpFactory::InitGraphicsInteropImpl(OrtEpFactory*, const OrtEpDevice*,
                                                 const OrtGraphicsInteropConfig*) noexcept {
  return g_ort->CreateStatus(ORT_NOT_IMPLEMENTED, "[MLX EP] graphics interop is not supported");
}
OrtStatus* MlxEpFactory::DeinitGraphicsInteropImpl(OrtEpFactory*, const OrtEpDevice*) noexcept {
  return nullptr;
}

}  // namespace ortmlx::ep

namespace {

// MLX's CUDA backend records a run's kernels into CUDA graphs and launches a graph only once it
// holds MLX_MAX_OPS_PER_BUFFER nodes (100 on Hopper and Blackwell): the GPU idles until the first
// launch, and after the host's last kernel the run waits for a whole graph's worth of work.
// Smaller graphs start the GPU sooner (docs/performance.md, "CUDA graph size"). MLX reads the
// variable when it makes its GPU stream, so it is set at registration, before any session; a
// value the user exported wins. Other GPU backends (Metal) read the same name: left alone.
constexpr const char* kCudaGraphOps = "20";

void set_cuda_graph_limit() {
  if (ortmlx::kernels::cuda::available()) ::setenv("MLX_MAX_OPS_PER_BUFFER", kCudaGraphOps, /*overwrite=*/0);
}

}  // namespace

// ---- the two exported entry points ----

extern "C" {

__attribute__((visibility("default"))) OrtStatus* CreateEpFactories(
    const char* /*registered_name*/, const OrtApiBase* api_base, const OrtLogger* default_logger,
    OrtEpFactory** factories, size_t max_factories, size_t* num_factories) noexcept {
  using namespace ortmlx::ep;
  // Negotiate the newest API the host ORT offers, down to 1.23 (the compile-based EP ABI). The
  // structs are append-only, so declaring the negotiated version hides newer fields from ORT.
  const OrtApi* api = nullptr;
  uint32_t version = ORT_API_VERSION;
  for (; api_base && version >= 23 && !api; --version) api = api_base->GetApi(version);
  if (!api) {
    *num_factories = 0;
    return nullptr;  // no usable API table: nothing to report an error through
  }
  g_api_version = version + 1;
  g_ort = api;
  g_ep_api = api->GetEpApi();
  return guard("CreateEpFactories", [&] {
    // MLX's shape-keyed CUDA LRU caches (convolution plans, cuDNN attention graphs) throw
    // "Cache thrashing" after 2x their capacity of misses in a row, which fails a run over a
    // stream of new shapes (varied image or batch sizes); an eviction is only slower. Set
    // before MLX's GPU device exists; a value the user exported wins (overwrite=0).
    ::setenv("MLX_ENABLE_CACHE_THRASHING_CHECK", "0", /*overwrite=*/0);
    set_cuda_graph_limit();
    if (max_factories < 1) throw std::invalid_argument("no room for a factory");
    factories[0] = new MlxEpFactory(default_logger);  // deleted in ReleaseEpFactory
    *num_factories = 1;
  });
}

__attribute__((visibility("default"))) OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) noexcept {
  delete static_cast<ortmlx::ep::MlxEpFactory*>(factory);
  return nullptr;
}

}  // extern "C"
