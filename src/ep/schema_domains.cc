#include "ep/schema_domains.h"

#include <climits>
#include <string>

namespace ortmlx::ep {

// A placeholder OrtCustomOp: one variadic input and one variadic output of any types (the
// node's real arity and types are checked by the op's support check), assigned to this EP. Its
// kernel is never created: ORT creates kernels only for nodes an EP left unfused, and these are
// claimed into fused nodes or, when declined, have no kernel on any EP (the session fails, as
// it would without the schema).
struct SchemaDomains::Op : OrtCustomOp {
  std::string name;

  explicit Op(std::string n) : OrtCustomOp{}, name(std::move(n)) {
    version = g_api_version;
    CreateKernel = [](const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*) noexcept -> void* {
      return nullptr;
    };
    GetName = [](const OrtCustomOp* op) noexcept {
      return static_cast<const Op*>(op)->name.c_str();
    };
    GetExecutionProviderType = [](const OrtCustomOp*) noexcept { return kEpName; };
    GetInputType = [](const OrtCustomOp*, size_t) noexcept {
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    };
    GetInputTypeCount = [](const OrtCustomOp*) noexcept -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) noexcept {
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    };
    GetOutputTypeCount = [](const OrtCustomOp*) noexcept -> size_t { return 1; };
    KernelCompute = [](void*, OrtKernelContext*) noexcept {};
    KernelDestroy = [](void*) noexcept {};
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) noexcept {
      return INPUT_OUTPUT_VARIADIC;
    };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t) noexcept {
      return INPUT_OUTPUT_VARIADIC;
    };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) noexcept { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp*) noexcept { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) noexcept { return 0; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) noexcept { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) noexcept { return 0; };
    CreateKernelV2 = [](const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo*,
                        void** kernel) noexcept -> OrtStatusPtr {
      *kernel = nullptr;
      return g_ort->CreateStatus(ORT_NOT_IMPLEMENTED,
                                 ("[MLX EP] " + static_cast<const Op*>(op)->name +
                                  " runs only inside the MLX EP's fused nodes")
                                     .c_str());
    };
    KernelComputeV2 = [](void*, OrtKernelContext*) noexcept -> OrtStatusPtr {
      return g_ort->CreateStatus(ORT_NOT_IMPLEMENTED, "[MLX EP] placeholder kernel");
    };
    InferOutputShapeFn = nullptr;
    GetStartVersion = [](const OrtCustomOp*) noexcept { return 1; };
    GetEndVersion = [](const OrtCustomOp*) noexcept { return INT_MAX; };
    GetMayInplace = [](int** in, int** out) noexcept -> size_t {
      *in = nullptr;
      *out = nullptr;
      return 0;
    };
    ReleaseMayInplace = [](int*, int*) noexcept {};
    GetAliasMap = [](int** in, int** out) noexcept -> size_t {
      *in = nullptr;
      *out = nullptr;
      return 0;
    };
    ReleaseAliasMap = [](int*, int*) noexcept {};
  }
};

SchemaDomains::SchemaDomains() {
  OrtCustomOpDomain* domain = nullptr;
  check(g_ort->CreateCustomOpDomain("ai.onnx.preview.training", &domain));
  training_.reset(domain);
  for (const char* op : {"Adagrad", "Adam", "Momentum"}) {
    ops_.push_back(std::make_unique<Op>(op));
    check(g_ort->CustomOpDomain_Add(domain, ops_.back().get()));
  }
  domains_.push_back(domain);
}

SchemaDomains::~SchemaDomains() = default;

}  // namespace ortmlx::ep
