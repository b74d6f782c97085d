// Host folding of shape arithmetic: see host_fold.h. Values are held as int64 (every covered
// dtype fits), computed with ONNX's semantics (integer Div truncates toward zero, overflow wraps
// in the tensor's own width as ORT's kernels do), and wrapped back to their dtype at the end.
// Whatever is invalid (an index out of range, a division by zero, mismatched shapes) is not
// folded: the op's translator then fails with its usual message.
//
// Floating-point tensors are folded only while every value is an integer the dtype holds
// exactly (masks: 0, 1, -65504, -inf excluded). Then each op's exact result, when the dtype
// holds it, is what the float kernel computes too (it rounds the exact result, which needs no
// rounding); any result it does not hold exactly (an overflow, a fraction, a negative zero)
// refuses the fold, and MLX computes the node as before. This is what lets an exporter's
// additive attention bias, built from the mask's data in fp16, be known on the host in a decode
// step, where the attention ops drop it when it is all zeros (ops/contrib/attention.cc).
#include "engine/host_fold/host_fold.h"

#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/host_fold/folds.h"

namespace ortmlx::ops {

namespace {

using namespace host_fold;

const std::unordered_map<std::string_view, std::pair<FoldFn, size_t>>& table() {
  // op -> (fold, number of leading inputs that must be present)
  static const std::unordered_map<std::string_view, std::pair<FoldFn, size_t>> t = {
      {"Identity", {identity, 1}},     {"Unsqueeze", {unsqueeze, 1}},
      {"Squeeze", {squeeze, 1}},       {"Reshape", {reshape, 2}},
      {"Gather", {gather, 2}},         {"Concat", {concat, 1}},
      {"Cast", {cast, 1}},             {"Add", {arithmetic, 2}},
      {"Sub", {arithmetic, 2}},        {"Mul", {arithmetic, 2}},
      {"Div", {arithmetic, 2}},        {"Min", {min_max, 1}},
      {"Max", {min_max, 1}},           {"Neg", {unary, 1}},
      {"Abs", {unary, 1}},             {"Equal", {compare, 2}},
      {"Less", {compare, 2}},          {"Greater", {compare, 2}},
      {"LessOrEqual", {compare, 2}},   {"GreaterOrEqual", {compare, 2}},
      {"Not", {logical, 1}},           {"And", {logical, 2}},
      {"Or", {logical, 2}},            {"Xor", {logical, 2}},
      {"Where", {where, 3}},           {"Slice", {slice, 1}},
      {"Range", {range, 3}},           {"Expand", {expand, 2}},
      {"ConstantOfShape", {constant_of_shape, 1}},
      {"ReduceSum", {reduce_sum, 1}},
  };
  return t;
}

}  // namespace

bool host_foldable_op(const graph::Node& n) {
  return n.domain.empty() && table().count(n.op_type) != 0 && n.outputs.size() == 1;
}

std::optional<std::vector<mx::array>> fold_on_host(const graph::Node& n,
                                                   const std::vector<std::optional<mx::array>>& inputs) {
  if (!host_foldable_op(n)) return std::nullopt;
  const auto& [fold, required] = table().at(n.op_type);
  if (inputs.size() < required) return std::nullopt;
  In in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) {
      if (i < required) return std::nullopt;
      in.emplace_back();
      continue;
    }
    auto h = read(*inputs[i]);
    if (!h) return std::nullopt;
    in.push_back(std::move(h));
  }
  auto out = fold(n, in);
  if (!out || out->v.size() > kHostFoldMaxElements) return std::nullopt;
  return std::vector<mx::array>{to_array(std::move(*out))};
}

}  // namespace ortmlx::ops
