// Shared by the ai.onnx.ml family files (ml.cc, ml_tree.cc): score post-transforms as ORT's
// CPU EP computes them, and the tree-ensemble entry points.
#pragma once

#include <string>

#include "ops/common.h"

namespace ortmlx::ops::ml {

enum class PostTransform { None, Logistic, Softmax, SoftmaxZero, Probit };

// "NONE" ... "PROBIT"; nullopt for an unknown name.
std::optional<PostTransform> parse_post_transform(const std::string& name);

// Applies the transform to scores [N, E] (float32) row-wise, as ORT's ml_common.h does for
// E >= 2 (for E == 1 the callers decide: ORT applies only PROBIT there).
mx::array post_transform(PostTransform t, const mx::array& scores, mx::Stream s);

// ORT's PROBIT: sqrt(2) * erfinv(2p - 1) with ORT's closed-form erfinv approximation
// (Winitzki, a = 0.147), so scores match the CPU EP rather than the exact inverse.
mx::array probit(const mx::array& p, mx::Stream s);

// X as [N, C] float32 (a 1-D X is one row), ORT's layout for the linear/tree models.
mx::array rows_f32(const mx::array& x, mx::Stream s);

Support check_tree_regressor(const NodeQuery& q);
Support check_tree_classifier(const NodeQuery& q);
Support check_tree_ensemble(const NodeQuery& q);
Outputs translate_tree_regressor(OpContext& c);
Outputs translate_tree_classifier(OpContext& c);
Outputs translate_tree_ensemble(OpContext& c);

}  // namespace ortmlx::ops::ml
