/* Runs an ONNX model on the MLX execution provider through ONNX Runtime's C API, start to end:
 * environment, EP library registration, device choice, session, input tensors, run, output,
 * release. Every node must run on MLX (session.disable_cpu_ep_fallback), so a model the EP
 * cannot run entirely is an error, not a silent CPU run.
 *
 *   mlx_run MODEL.onnx [auto|cpu|gpu]
 *
 * The EP library is ORTMLX_LIBRARY (set at build time, see CMakeLists.txt and README.md) or
 * $ORT_MLX_EP_LIBRARY. Every float input is filled with (i % 7) * 0.25 - 0.75, i being the
 * element's index, with symbolic dims set to 2; each output is printed as its shape, its sum,
 * the sum of its absolute values and its first (up to) 8 values. */
#include <onnxruntime_c_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ORTMLX_LIBRARY
#define ORTMLX_LIBRARY ""
#endif

#define MAX_IO 16
#define MAX_RANK 8

static const OrtApi* ort;

/* Prints and releases a failed status; returns 1 when `status` is an error. */
static int failed(OrtStatus* status, const char* what) {
  if (status == NULL) return 0;
  fprintf(stderr, "mlx_run: %s: %s\n", what, ort->GetErrorMessage(status));
  ort->ReleaseStatus(status);
  return 1;
}

#define CHECK(call)                          \
  do {                                       \
    if (failed((call), #call)) goto cleanup; \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s MODEL.onnx [auto|cpu|gpu]\n", argv[0]);
    return 2;
  }
  const char* model = argv[1];
  const char* device = argc > 2 ? argv[2] : "auto";
  if (strcmp(device, "auto") != 0 && strcmp(device, "cpu") != 0 && strcmp(device, "gpu") != 0) {
    fprintf(stderr, "mlx_run: device '%s' is not auto, cpu or gpu\n", device);
    return 2;
  }
  const char* library = getenv("ORT_MLX_EP_LIBRARY");
  if (library == NULL || library[0] == '\0') library = ORTMLX_LIBRARY;
  if (library[0] == '\0') {
    fprintf(stderr, "mlx_run: no EP library: build with -DORTMLX_LIBRARY or set ORT_MLX_EP_LIBRARY\n");
    return 2;
  }

  ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  if (ort == NULL) {
    fprintf(stderr, "mlx_run: this ONNX Runtime (%s) is older than the headers it was built with\n",
            OrtGetApiBase()->GetVersionString());
    return 1;
  }

  int rc = 1;
  int registered = 0;
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtSession* session = NULL;
  OrtMemoryInfo* cpu_memory = NULL;
  OrtAllocator* allocator = NULL;  /* ORT's default allocator: not released */
  size_t n_in = 0, n_out = 0;
  char* in_names[MAX_IO] = {0};
  char* out_names[MAX_IO] = {0};
  float* in_data[MAX_IO] = {0};
  OrtValue* inputs[MAX_IO] = {0};
  OrtValue* outputs[MAX_IO] = {0};

  CHECK(ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "mlx_run", &env));
  CHECK(ort->RegisterExecutionProviderLibrary(env, "onnxruntime_mlx", library));
  registered = 1;

  /* The MLX EP's device: its GPU for "gpu", its CPU for "cpu", the GPU if any for "auto". */
  const OrtEpDevice* const* devices = NULL;
  size_t n_devices = 0;
  CHECK(ort->GetEpDevices(env, &devices, &n_devices));
  const OrtEpDevice* chosen = NULL;
  for (size_t i = 0; i < n_devices; ++i) {
    if (strcmp(ort->EpDevice_EpName(devices[i]), "MLXExecutionProvider") != 0) continue;
    OrtHardwareDeviceType type = ort->HardwareDevice_Type(ort->EpDevice_Device(devices[i]));
    int is_gpu = type == OrtHardwareDeviceType_GPU;
    if (strcmp(device, "gpu") == 0 ? is_gpu : strcmp(device, "cpu") == 0 ? !is_gpu : 1) {
      if (chosen == NULL || (is_gpu && strcmp(device, "auto") == 0)) chosen = devices[i];
    }
  }
  if (chosen == NULL) {
    fprintf(stderr, "mlx_run: the MLX EP has no '%s' device\n", device);
    goto cleanup;
  }

  CHECK(ort->CreateSessionOptions(&options));
  CHECK(ort->AddSessionConfigEntry(options, "session.disable_cpu_ep_fallback", "1"));
  const char* keys[] = {"device"};
  const char* values[] = {device};
  CHECK(ort->SessionOptionsAppendExecutionProvider_V2(options, env, &chosen, 1, keys, values, 1));
  CHECK(ort->CreateSession(env, model, options, &session));
  CHECK(ort->GetAllocatorWithDefaultOptions(&allocator));
  CHECK(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu_memory));

  CHECK(ort->SessionGetInputCount(session, &n_in));
  CHECK(ort->SessionGetOutputCount(session, &n_out));
  if (n_in > MAX_IO || n_out > MAX_IO) {
    fprintf(stderr, "mlx_run: more than %d inputs or outputs\n", MAX_IO);
    goto cleanup;
  }
  for (size_t i = 0; i < n_in; ++i) {
    CHECK(ort->SessionGetInputName(session, i, allocator, &in_names[i]));
    OrtTypeInfo* type_info = NULL;
    CHECK(ort->SessionGetInputTypeInfo(session, i, &type_info));
    const OrtTensorTypeAndShapeInfo* tensor_info = NULL;
    ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    size_t rank = 0;
    int64_t dims[MAX_RANK];
    OrtStatus* st = ort->CastTypeInfoToTensorInfo(type_info, &tensor_info);
    if (st == NULL && tensor_info == NULL) {
      fprintf(stderr, "mlx_run: input '%s' is not a tensor\n", in_names[i]);
      ort->ReleaseTypeInfo(type_info);
      goto cleanup;
    }
    if (st == NULL) st = ort->GetTensorElementType(tensor_info, &elem);
    if (st == NULL) st = ort->GetDimensionsCount(tensor_info, &rank);
    if (st == NULL && rank <= MAX_RANK) st = ort->GetDimensions(tensor_info, dims, rank);
    ort->ReleaseTypeInfo(type_info);
    if (failed(st, "input type")) goto cleanup;
    if (elem != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || rank > MAX_RANK) {
      fprintf(stderr, "mlx_run: input '%s' is not a float tensor of rank <= %d\n", in_names[i],
              MAX_RANK);
      goto cleanup;
    }
    size_t count = 1;
    for (size_t d = 0; d < rank; ++d) {
      if (dims[d] < 0) dims[d] = 2;
      count *= (size_t)dims[d];
    }
    in_data[i] = malloc((count ? count : 1) * sizeof(float));
    if (in_data[i] == NULL) goto cleanup;
    for (size_t k = 0; k < count; ++k) in_data[i][k] = (float)(k % 7) * 0.25f - 0.75f;
    CHECK(ort->CreateTensorWithDataAsOrtValue(cpu_memory, in_data[i], count * sizeof(float), dims,
                                              rank, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                              &inputs[i]));
  }
  for (size_t i = 0; i < n_out; ++i)
    CHECK(ort->SessionGetOutputName(session, i, allocator, &out_names[i]));

  CHECK(ort->Run(session, NULL, (const char* const*)in_names, (const OrtValue* const*)inputs, n_in,
                 (const char* const*)out_names, n_out, outputs));

  printf("device %s, every node on MLXExecutionProvider\n", device);
  for (size_t i = 0; i < n_out; ++i) {
    OrtTensorTypeAndShapeInfo* info = NULL;
    CHECK(ort->GetTensorTypeAndShape(outputs[i], &info));
    ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    size_t rank = 0, count = 0;
    int64_t dims[MAX_RANK];
    OrtStatus* st = ort->GetTensorElementType(info, &elem);
    if (st == NULL) st = ort->GetDimensionsCount(info, &rank);
    if (st == NULL && rank <= MAX_RANK) st = ort->GetDimensions(info, dims, rank);
    if (st == NULL) st = ort->GetTensorShapeElementCount(info, &count);
    ort->ReleaseTensorTypeAndShapeInfo(info);
    if (failed(st, "output shape")) goto cleanup;
    if (elem != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || rank > MAX_RANK) {
      printf("output %s: not a float tensor of rank <= %d\n", out_names[i], MAX_RANK);
      continue;
    }
    float* data = NULL;
    CHECK(ort->GetTensorMutableData(outputs[i], (void**)&data));
    double sum = 0, abs_sum = 0;
    for (size_t k = 0; k < count; ++k) {
      sum += data[k];
      abs_sum += data[k] < 0 ? -data[k] : data[k];
    }
    printf("output %s shape [", out_names[i]);
    for (size_t d = 0; d < rank; ++d) printf(d ? ",%lld" : "%lld", (long long)dims[d]);
    printf("] sum %.9g abs_sum %.9g first", sum, abs_sum);
    for (size_t k = 0; k < count && k < 8; ++k) printf(" %.9g", data[k]);
    printf("\n");
  }
  rc = 0;

cleanup:
  for (size_t i = 0; i < MAX_IO; ++i) {
    if (outputs[i]) ort->ReleaseValue(outputs[i]);
    if (inputs[i]) ort->ReleaseValue(inputs[i]);
    free(in_data[i]);
    if (in_names[i]) allocator->Free(allocator, in_names[i]);
    if (out_names[i]) allocator->Free(allocator, out_names[i]);
  }
  if (cpu_memory) ort->ReleaseMemoryInfo(cpu_memory);
  if (session) ort->ReleaseSession(session);
  if (options) ort->ReleaseSessionOptions(options);
  /* Sessions using the EP are gone: the library can be unregistered before the environment. */
  if (registered && failed(ort->UnregisterExecutionProviderLibrary(env, "onnxruntime_mlx"),
                           "UnregisterExecutionProviderLibrary"))
    rc = 1;
  if (env) ort->ReleaseEnv(env);
  return rc;
}
