// Shared by the plain C++ hosts of the MLX EP (tools/ep_churn.cc, tools/ep_threads.cc): the
// cases tools/sanitize_cases.py writes, running a session on them, comparing outputs, and
// finding the EP's devices. Header-only; each host is one translation unit.
//
// A case dir holds model.onnx and inputs.bin: per input, u32 name length, the name, i32 ONNX
// element type, u32 rank, i64 dims[rank], u64 byte count, the raw little-endian data.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace ep_host {

struct Input {
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> dims;
  std::vector<char> data;
};

inline std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <typename T>
T take(const std::vector<char>& b, size_t& pos) {
  if (pos + sizeof(T) > b.size()) throw std::runtime_error("inputs.bin is truncated");
  T v;
  std::memcpy(&v, b.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

inline std::vector<Input> read_inputs(const std::string& path) {
  auto b = read_all(path);
  std::vector<Input> out;
  size_t pos = 0;
  while (pos < b.size()) {
    Input in;
    auto n = take<uint32_t>(b, pos);
    if (pos + n > b.size()) throw std::runtime_error("inputs.bin: bad name length");
    in.name.assign(b.data() + pos, n);
    pos += n;
    in.type = static_cast<ONNXTensorElementDataType>(take<int32_t>(b, pos));
    auto rank = take<uint32_t>(b, pos);
    for (uint32_t i = 0; i < rank; ++i) in.dims.push_back(take<int64_t>(b, pos));
    auto bytes = take<uint64_t>(b, pos);
    if (pos + bytes > b.size()) throw std::runtime_error("inputs.bin: bad data length");
    in.data.assign(b.data() + pos, b.data() + pos + bytes);
    pos += bytes;
    out.push_back(std::move(in));
  }
  return out;
}

// One run of `s` on `inputs` (their buffers are borrowed, not copied), all outputs fetched.
inline std::vector<Ort::Value> run(Ort::Session& s, std::vector<Input>& inputs) {
  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> names;
  for (auto& in : inputs) {
    values.push_back(Ort::Value::CreateTensor(mem, in.data.data(), in.data.size(), in.dims.data(),
                                              in.dims.size(), in.type));
    names.push_back(in.name.c_str());
  }
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<Ort::AllocatedStringPtr> out_names_owned;
  std::vector<const char*> out_names;
  for (size_t i = 0; i < s.GetOutputCount(); ++i) {
    out_names_owned.push_back(s.GetOutputNameAllocated(i, alloc));
    out_names.push_back(out_names_owned.back().get());
  }
  return s.Run(Ort::RunOptions{}, names.data(), values.data(), values.size(), out_names.data(),
               out_names.size());
}

// Whether two outputs agree: same shape and type; integers and bools exactly; float within
// tol + tol * |b|, double within at most 1e-6 so. FLOAT16 values are compared only when
// `fp16_bits` (bit for bit, for two runs of the same implementation): against another
// implementation their rounding may differ. Other types are not compared.
inline bool same(const Ort::Value& a, const Ort::Value& b, double tol = 1e-3,
                 bool fp16_bits = false) {
  auto ta = a.GetTensorTypeAndShapeInfo(), tb = b.GetTensorTypeAndShapeInfo();
  if (ta.GetShape() != tb.GetShape() || ta.GetElementType() != tb.GetElementType()) return false;
  const size_t n = ta.GetElementCount();
  auto close = [tol](double x, double y) {
    return (std::isnan(x) && std::isnan(y)) || std::fabs(x - y) <= tol + tol * std::fabs(y);
  };
  size_t bytes = 0;
  switch (ta.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      const float *x = a.GetTensorData<float>(), *y = b.GetTensorData<float>();
      for (size_t i = 0; i < n; ++i)
        if (!close(x[i], y[i])) return false;
      return true;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: {
      const double *x = a.GetTensorData<double>(), *y = b.GetTensorData<double>();
      const double t = std::min(tol, 1e-6);
      for (size_t i = 0; i < n; ++i)
        if (!((std::isnan(x[i]) && std::isnan(y[i])) || std::fabs(x[i] - y[i]) <= t + t * std::fabs(y[i])))
          return false;
      return true;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      if (!fp16_bits) return true;
      bytes = 2; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: bytes = 8; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: bytes = 4; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: bytes = 2; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: bytes = 1; break;
    default: return true;
  }
  return std::memcmp(a.GetTensorRawData(), b.GetTensorRawData(), n * bytes) == 0;
}

inline bool same_all(const std::vector<Ort::Value>& a, const std::vector<Ort::Value>& b,
                     double tol = 1e-3, bool fp16_bits = false) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!same(a[k], b[k], tol, fp16_bits)) return false;
  return true;
}

// The MLX EP's CPU devices, after env.RegisterExecutionProviderLibrary.
inline std::vector<Ort::ConstEpDevice> mlx_cpu_devices(Ort::Env& env) {
  std::vector<Ort::ConstEpDevice> mlx;
  for (auto d : env.GetEpDevices())
    if (std::string(d.EpName()) == "MLXExecutionProvider" &&
        d.Device().Type() == OrtHardwareDeviceType_CPU)
      mlx.push_back(d);
  return mlx;
}

// Session options with the MLX EP on the CPU device, every node on MLX (a session with a
// declined node fails): this checks the EP's code, not ORT's CPU kernels. `extra`: more EP
// options (docs/options.md), e.g. {"compile", "0"}.
inline Ort::SessionOptions mlx_options(Ort::Env& env, const std::vector<Ort::ConstEpDevice>& mlx,
                                       std::unordered_map<std::string, std::string> extra = {}) {
  Ort::SessionOptions so;
  so.AddConfigEntry("session.disable_cpu_ep_fallback", "1");
  extra.emplace("device", "cpu");
  so.AppendExecutionProvider_V2(env, mlx, extra);
  return so;
}

}  // namespace ep_host
