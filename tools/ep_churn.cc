// A plain C++ host for the MLX EP, for sanitizer runs without Python in the process (so
// LeakSanitizer sees only ORT, MLX and the EP): registers the EP library with ORT's C API,
// then creates, runs and destroys sessions round-robin over a set of prepared cases, checking
// every output against ORT's CPU EP. Built and run by scripts/sanitize:
//
//   ep_churn <libonnxruntime_mlx_ep.so> <sessions> <runs per session> <case dir>...
//
// A case dir holds model.onnx and inputs.bin (written by tools/sanitize_cases.py): per input,
// u32 name length, the name, i32 ONNX element type, u32 rank, i64 dims[rank], u64 byte count,
// the raw little-endian data. Exit status: 0 when every run matched, 1 otherwise.
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Input {
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> dims;
  std::vector<char> data;
};

struct Case {
  std::string dir;
  std::vector<char> model;
  std::vector<Input> inputs;
  std::vector<Ort::Value> expected;  // the CPU EP's outputs
};

std::vector<char> read_all(const std::string& path) {
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

std::vector<Input> read_inputs(const std::string& path) {
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

std::vector<Ort::Value> run(Ort::Session& s, Case& c) {
  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> names;
  for (auto& in : c.inputs) {
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

// Outputs must match the CPU EP: integers and bools exactly, floats within a loose tolerance
// (the point here is memory safety; the oracle tests own numerical precision).
bool same(const Ort::Value& a, const Ort::Value& b) {
  auto ta = a.GetTensorTypeAndShapeInfo(), tb = b.GetTensorTypeAndShapeInfo();
  if (ta.GetShape() != tb.GetShape() || ta.GetElementType() != tb.GetElementType()) return false;
  size_t n = ta.GetElementCount();
  switch (ta.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      const float *x = a.GetTensorData<float>(), *y = b.GetTensorData<float>();
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(x[i]) && std::isnan(y[i])) continue;
        if (!(std::fabs(x[i] - y[i]) <= 1e-3f + 1e-3f * std::fabs(y[i]))) return false;
      }
      return true;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:  // bit patterns differ by rounding: skip values
      return true;
    default: {
      // Fixed-width integer and bool types: compare bytes.
      size_t bytes = 0;
      switch (ta.GetElementType()) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
          bytes = 8; break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: bytes = 4; break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: bytes = 2; break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: bytes = 1; break;
        default: return true;
      }
      if (ta.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE) {
        const double *x = a.GetTensorData<double>(), *y = b.GetTensorData<double>();
        for (size_t i = 0; i < n; ++i)
          if (!(std::fabs(x[i] - y[i]) <= 1e-6 + 1e-6 * std::fabs(y[i])) &&
              !(std::isnan(x[i]) && std::isnan(y[i])))
            return false;
        return true;
      }
      return std::memcmp(a.GetTensorRawData(), b.GetTensorRawData(), n * bytes) == 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s EP_LIBRARY SESSIONS RUNS CASE_DIR...\n", argv[0]);
    return 2;
  }
  const std::string ep_lib = argv[1];
  const int sessions = std::stoi(argv[2]);
  const int runs = std::stoi(argv[3]);
  int failures = 0, ran = 0;
  {
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "ep_churn");
    env.RegisterExecutionProviderLibrary("onnxruntime_mlx", ep_lib);
    std::vector<Ort::ConstEpDevice> mlx;
    for (auto d : env.GetEpDevices())
      if (std::string(d.EpName()) == "MLXExecutionProvider" &&
          d.Device().Type() == OrtHardwareDeviceType_CPU)
        mlx.push_back(d);
    if (mlx.empty()) {
      std::fprintf(stderr, "the MLX EP registered no CPU device\n");
      return 1;
    }
    std::vector<Case> cases;
    for (int i = 4; i < argc; ++i) {
      Case c;
      c.dir = argv[i];
      c.model = read_all(c.dir + "/model.onnx");
      c.inputs = read_inputs(c.dir + "/inputs.bin");
      Ort::SessionOptions cpu;
      Ort::Session ref(env, c.model.data(), c.model.size(), cpu);
      c.expected = run(ref, c);
      cases.push_back(std::move(c));
    }
    for (int i = 0; i < sessions; ++i) {
      Case& c = cases[i % cases.size()];
      try {
        Ort::SessionOptions so;
        // Every node must run on MLX (a session with a declined node fails): this checks the
        // EP's code, not ORT's CPU kernels.
        so.AddConfigEntry("session.disable_cpu_ep_fallback", "1");
        const std::unordered_map<std::string, std::string> opts{{"device", "cpu"}};
        so.AppendExecutionProvider_V2(env, mlx, opts);
        Ort::Session s(env, c.model.data(), c.model.size(), so);
        for (int r = 0; r < runs; ++r) {  // run 1 probes eagerly, later runs are compiled
          auto outs = run(s, c);
          ++ran;
          bool ok = outs.size() == c.expected.size();
          for (size_t k = 0; ok && k < outs.size(); ++k) ok = same(outs[k], c.expected[k]);
          if (!ok) {
            ++failures;
            std::fprintf(stderr, "mismatch: %s (session %d, run %d)\n", c.dir.c_str(), i, r);
          }
        }
      } catch (const Ort::Exception& e) {
        ++failures;
        std::fprintf(stderr, "error: %s: %s\n", c.dir.c_str(), e.what());
      }
    }
    cases.clear();
    mlx.clear();
    env.UnregisterExecutionProviderLibrary("onnxruntime_mlx");
  }
  std::printf("{\"sessions\": %d, \"runs\": %d, \"failures\": %d}\n", sessions, ran, failures);
  return failures ? 1 : 0;
}
