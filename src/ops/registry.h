// The op registry: one flat table, {domain, op type, opset range} -> {support check, translator}.
//
// How to add an op (one file, one table line, one test):
//   1. Pick the family file by domain and kind: src/ops/onnx/<family>.cc for ai.onnx,
//      src/ops/nn/ (convolution, pooling, resize), src/ops/contrib/ (com.microsoft),
//      src/ops/ml/ (ai.onnx.ml). Write `Support check_x(const NodeQuery&)` that decides with the
//      node's real attributes, dtypes and shapes (say *why* when declining), and
//      `Outputs translate_x(OpContext&)` that builds MLX ops (always pass ctx.s). A computation
//      MLX has no good op for goes to src/kernels/cpu (kernels.h), not into the translator.
//   2. Add one line `{"", "X", first_opset, last_opset, check_x, translate_x}` to that family's
//      table (`<family>_ops()`, declared below); registry.cc concatenates the family tables.
//   3. Add a case to tests/python/test_<family>.py: the oracle (tests/python/oracle.py) runs the
//      node on the MLX EP with CPU fallback disabled and compares with ORT's CPU EP. Then
//      regenerate docs/ops.md (python -m onnxruntime_mlx ops-doc).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/op_context.h"

namespace ortmlx::ops {

inline constexpr int kAnyOpset = 1 << 20;

struct OpEntry {
  std::string_view domain;  // "" = ai.onnx; "com.microsoft"; "ai.onnx.ml"
  std::string_view op_type;
  int min_opset;  // the node's since_version must lie in [min_opset, max_opset]
  int max_opset;
  Check check;          // claim-time decision (may be nullptr: only the common checks apply)
  Translate translate;  // builds MLX ops
  std::string_view notes = {};  // constraints shown in docs/ops.md (what is declined and why)
  // Opts in to the low precision types MLX has no dtype for (float8, float4e2m1, int4, uint4,
  // int2, uint2; see ops/lowp.h). Without it the partitioner declines a node touching them, so
  // no generic translator ever computes on their storage bytes as if they were integers.
  bool lowp = false;
};

// The whole flat table (every family's entries, in family order).
const std::vector<OpEntry>& registry();
// The entry for a node, or nullptr. `domain` "ai.onnx" is treated as "".
const OpEntry* find_op(std::string_view domain, std::string_view op_type, int since_version);

// Each family file exports its part of the table.
std::span<const OpEntry> elementwise_ops();
std::span<const OpEntry> activation_ops();
std::span<const OpEntry> math_ops();
std::span<const OpEntry> reduce_ops();
std::span<const OpEntry> shape_ops();
std::span<const OpEntry> index_ops();
std::span<const OpEntry> nn_ops();
std::span<const OpEntry> normalization_ops();
std::span<const OpEntry> matmul_ops();
std::span<const OpEntry> quantize_ops();
std::span<const OpEntry> contrib_ops();  // com.microsoft
std::span<const OpEntry> ml_ops();       // ai.onnx.ml
std::span<const OpEntry> recurrent_ops();  // RNN, GRU, LSTM
std::span<const OpEntry> control_flow_ops();  // If, Loop, Scan
std::span<const OpEntry> sequence_ops();      // Sequence*, SplitToSequence, Optional*
std::span<const OpEntry> signal_ops();        // Hann/Hamming/BlackmanWindow, MelWeightMatrix
std::span<const OpEntry> detection_ops();     // NonMaxSuppression
std::span<const OpEntry> conv_extra_ops();    // Col2Im, DeformConv, ConvInteger, QLinearConv, MaxUnpool
std::span<const OpEntry> affine_grid_ops();   // AffineGrid
std::span<const OpEntry> tensor_scatter_ops();  // TensorScatter
std::span<const OpEntry> lowp_ops();            // BitCast (float8/4-bit codecs: lowp.h)
std::span<const OpEntry> training_ops();  // Adagrad, Adam, Momentum (ai.onnx.preview.training)
std::span<const OpEntry> text_ops();      // TfIdfVectorizer

}  // namespace ortmlx::ops
