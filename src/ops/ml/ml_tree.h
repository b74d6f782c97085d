// Tree ensembles (ml_tree.cc): the node tables a forest is evaluated from, built on the host
// from the node's attributes (ml_tree_forest.cc). Internal to the two files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/ml/ml_internal.h"

namespace ortmlx::ops::ml::tree {

enum Mode : uint8_t { LEQ = 0, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF };
enum class Agg { Average, Sum, Min, Max };

struct Forest {
  int n_targets = 0;
  // One entry per node; leaves point to themselves and have mode LEAF.
  std::vector<int32_t> feature, tnode, fnode;
  std::vector<double> thr;
  std::vector<uint8_t> mode, miss_true;
  std::vector<std::vector<double>> members;  // BRANCH_MEMBER sets
  std::vector<int32_t> roots;
  // Per node and target: the leaf's aggregated weight and whether it has one.
  std::vector<double> leaf_val;
  std::vector<uint8_t> leaf_has;
  Agg agg = Agg::Sum;
  PostTransform pt = PostTransform::None;
  std::vector<double> base;
  int depth = 0, max_feature = 0;
};

// Float attribute `name`, or its `name_as_tensor` twin (accepted when float32: ORT switches to
// double thresholds and sums for a double tensor, which this file does not mirror).
bool float_attr(const graph::Node& n, const std::string& name, std::vector<double>* out,
                std::string* why);

// TreeEnsembleRegressor / TreeEnsembleClassifier (ai.onnx.ml 1 and 3); nullopt with `why` for
// attributes the EP does not take (or that are invalid).
std::optional<Forest> build_legacy(const graph::Node& n, bool classifier, std::string* why);
// TreeEnsemble (ai.onnx.ml 5).
std::optional<Forest> build_v5(const graph::Node& n, std::string* why);

}  // namespace ortmlx::ops::ml::tree
