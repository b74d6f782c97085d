#include "ops/registry.h"

namespace ortmlx::ops {

const std::vector<OpEntry>& registry() {
  // Function-local static: built on first use, no static-initialisation order issues.
  static const std::vector<OpEntry> table = [] {
    std::vector<OpEntry> t;
    for (auto family : {elementwise_ops(), activation_ops(), math_ops(), reduce_ops(),
                        shape_ops(), index_ops(), nn_ops(), normalization_ops(), matmul_ops(),
                        quantize_ops(), contrib_ops(), ml_ops(), recurrent_ops(),
                        control_flow_ops(), signal_ops(), detection_ops(), conv_extra_ops(),
                        affine_grid_ops(), tensor_scatter_ops(), sequence_ops(),
                        lowp_ops(), training_ops(), text_ops()})
      t.insert(t.end(), family.begin(), family.end());
    return t;
  }();
  return table;
}

const OpEntry* find_op(std::string_view domain, std::string_view op_type, int since_version) {
  if (domain == "ai.onnx") domain = "";
  for (const auto& e : registry())
    if (e.op_type == op_type && e.domain == domain && since_version >= e.min_opset &&
        since_version <= e.max_opset)
      return &e;
  return nullptr;
}

}  // namespace ortmlx::ops
