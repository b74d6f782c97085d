// The ORT C API tables and the small RAII/status helpers of the ABI layer. Only src/ep/ includes
// ORT's headers; the rest of the EP sees the plain graph view.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

// Only the C header: it already includes onnxruntime_ep_c_api.h (both together redefine).
#include <onnxruntime_c_api.h>

namespace ortmlx::ep {

// Set once in CreateEpFactories, before any other callback can run.
extern const OrtApi* g_ort;
extern const OrtEpApi* g_ep_api;
extern uint32_t g_api_version;  // the ORT API version negotiated with the host

inline constexpr const char* kEpName = "MLXExecutionProvider";
inline constexpr const char* kEpVendor = "onnxruntime-mlx";
inline constexpr const char* kEpVersion = "0.1.0";

// An ORT error raised as a C++ exception inside the EP; the error wall turns it back.
struct OrtError : std::runtime_error {
  OrtErrorCode code;
  OrtError(OrtErrorCode c, const std::string& m) : std::runtime_error(m), code(c) {}
};

struct StatusDeleter {
  void operator()(OrtStatus* s) const { if (s) g_ort->ReleaseStatus(s); }
};
using StatusPtr = std::unique_ptr<OrtStatus, StatusDeleter>;

// Throws when an ORT call fails (adopts and releases the status).
inline void check(OrtStatus* status) {
  if (!status) return;
  StatusPtr owned(status);
  throw OrtError(g_ort->GetErrorCode(status), g_ort->GetErrorMessage(status));
}

struct TypeShapeDeleter {
  void operator()(OrtTensorTypeAndShapeInfo* p) const { if (p) g_ort->ReleaseTensorTypeAndShapeInfo(p); }
};
using TypeShapePtr = std::unique_ptr<OrtTensorTypeAndShapeInfo, TypeShapeDeleter>;

struct KeyValuePairsDeleter {
  void operator()(OrtKeyValuePairs* p) const { if (p) g_ort->ReleaseKeyValuePairs(p); }
};
using KeyValuePairsPtr = std::unique_ptr<OrtKeyValuePairs, KeyValuePairsDeleter>;

struct ValueDeleter {
  void operator()(OrtValue* p) const { if (p) g_ort->ReleaseValue(p); }
};
using ValuePtr = std::unique_ptr<OrtValue, ValueDeleter>;

}  // namespace ortmlx::ep
