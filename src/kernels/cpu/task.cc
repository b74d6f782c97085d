#include "kernels/cpu/task.h"

#include <unordered_set>

namespace ortmlx::ops {
namespace {
thread_local bool tl_on_caller = false;
}  // namespace

bool cpu_tasks_on_caller() { return tl_on_caller; }
CallerTasksScope::CallerTasksScope() : prev_(std::exchange(tl_on_caller, true)) {}
CallerTasksScope::~CallerTasksScope() { tl_on_caller = prev_; }

bool is_cpu_kernel(std::string_view name) {
  // The name() of every primitive class under kernels/cpu.
  static const std::unordered_set<std::string_view> kNames = {
      "RowGemv", "Int4RowGemv", "Int4PanelGemv", "RowSoftmax", "ChunkConcat", "DepthwiseConv", "DnnlConvWeights",
      "DnnlConv", "DnnlConvBlocked", "DnnlConvAdd", "DnnlUnblock", "DnnlBlockedConcat", "DnnlConvsConcat", "DnnlBlock",
      "DnnlBlockedPool", "DnnlGemm", "RowLayerNorm", "RowRmsNorm", "RowSkipLayerNorm", "RowSkipRmsNorm", "PackedMatmul", "PackedMatmulGelu",
      "PointwiseConv", "MaxPool2d", "AvgPool2d", "ErfMap", "ErfGelu", "ExpMap", "SigmoidMap", "TanhMap", "FusedAttention", "Int4GemmVnni", "DecodeGqa", "GqaLayout", "SwiGlu", "PatchDeconv", "NearestUpsample", "LstmCell", "BlockedSteps"};
  return kNames.count(name) != 0;
}

}  // namespace ortmlx::ops
