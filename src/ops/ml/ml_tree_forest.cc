// Tree ensembles (ml_tree.h): a forest's node tables from the node's attributes, checked on the
// host (ids, modes, children, a cycle, the leaves' weights).
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "ops/ml/ml_tree.h"

namespace ortmlx::ops::ml::tree {

namespace {

std::optional<Agg> parse_agg(const std::string& a) {
  if (a == "SUM") return Agg::Sum;
  if (a == "AVERAGE") return Agg::Average;
  if (a == "MIN") return Agg::Min;
  if (a == "MAX") return Agg::Max;
  return std::nullopt;
}

// Longest root-to-leaf path (in branch steps) of every tree; false on a cycle.
bool measure_depth(Forest& f, std::string* why) {
  const size_t n = f.mode.size();
  std::vector<int> depth(n, -1);  // memoised height; -2 = on the current path
  std::function<int(int32_t)> height = [&](int32_t i) -> int {
    if (depth[i] >= 0) return depth[i];
    if (depth[i] == -2) return -1;
    if (f.mode[i] == LEAF) return depth[i] = 0;
    depth[i] = -2;
    int a = height(f.tnode[i]), b = a < 0 ? -1 : height(f.fnode[i]);
    if (a < 0 || b < 0) return -1;
    return depth[i] = 1 + std::max(a, b);
  };
  f.depth = 0;
  for (auto r : f.roots) {
    int h = height(r);
    if (h < 0) {
      *why = "a tree has a cycle";
      return false;
    }
    f.depth = std::max(f.depth, h);
  }
  return true;
}

}  // namespace

// Float attribute `name`, or its `name_as_tensor` twin (accepted when float32: ORT switches to
// double thresholds and sums for a double tensor, which this file does not mirror).
bool float_attr(const graph::Node& n, const std::string& name, std::vector<double>* out,
                std::string* why) {
  const auto* t = n.attr(name + "_as_tensor");
  if (t && t->t) {
    if (t->t->dtype != DType::Float32) {
      *why = name + "_as_tensor must be float32";
      return false;
    }
    *out = t->t->to_floats();
    return true;
  }
  auto f = n.attr_floats(name);
  out->assign(f.begin(), f.end());
  return true;
}

// TreeEnsembleRegressor / TreeEnsembleClassifier (ai.onnx.ml 1 and 3).
// Long because the legacy encoding spreads one tree over parallel attribute arrays that are
// validated and cross-indexed together (ids, modes, children, weights); kept in one pass.
std::optional<Forest> build_legacy(const graph::Node& n, bool classifier, std::string* why) {
  Forest f;
  const char* pre = classifier ? "class_" : "target_";
  auto P = [&](const char* s) { return std::string(pre) + s; };
  const auto treeids = n.attr_ints("nodes_treeids"), nodeids = n.attr_ints("nodes_nodeids");
  const auto featureids = n.attr_ints("nodes_featureids");
  const auto trueids = n.attr_ints("nodes_truenodeids"), falseids = n.attr_ints("nodes_falsenodeids");
  const auto missing = n.attr_ints("nodes_missing_value_tracks_true");
  const auto* modes_attr = n.attr("nodes_modes");
  const std::vector<std::string> modes = modes_attr ? modes_attr->strings : std::vector<std::string>{};
  std::vector<double> values, weights;
  if (!float_attr(n, "nodes_values", &values, why) || !float_attr(n, P("weights"), &weights, why) ||
      !float_attr(n, "base_values", &f.base, why))
    return std::nullopt;
  const auto w_ids = n.attr_ints(P("ids")), w_nodes = n.attr_ints(P("nodeids"));
  const auto w_trees = n.attr_ints(P("treeids"));
  const size_t N = treeids.size();
  if (N == 0 || nodeids.size() != N || featureids.size() != N || trueids.size() != N ||
      falseids.size() != N || modes.size() != N || values.size() != N) {
    *why = "nodes_* attributes have different lengths";
    return std::nullopt;
  }
  if (w_ids.size() != w_nodes.size() || w_ids.size() != w_trees.size() ||
      w_ids.size() != weights.size()) {
    *why = std::string(pre) + "* attributes have different lengths";
    return std::nullopt;
  }
  if (classifier) {
    f.n_targets = static_cast<int>(n.attr_ints("classlabels_int64s").size());
    f.agg = Agg::Sum;
  } else {
    f.n_targets = static_cast<int>(n.attr_int("n_targets", 0));
    auto agg = parse_agg(n.attr_string("aggregate_function", "SUM"));
    if (!agg) {
      *why = "unknown aggregate_function";
      return std::nullopt;
    }
    f.agg = *agg;
  }
  if (f.n_targets < 1) {
    *why = "no targets/classes";
    return std::nullopt;
  }
  auto pt = parse_post_transform(n.attr_string("post_transform", "NONE"));
  if (!pt) {
    *why = "unknown post_transform";
    return std::nullopt;
  }
  f.pt = *pt;

  std::map<std::pair<int64_t, int64_t>, int32_t> index;
  int64_t prev_tree = std::numeric_limits<int64_t>::min();
  std::set<int64_t> seen_trees;
  for (size_t i = 0; i < N; ++i) {
    if (!index.emplace(std::make_pair(treeids[i], nodeids[i]), static_cast<int32_t>(i)).second) {
      *why = "duplicate node id";
      return std::nullopt;
    }
    // ORT starts a new tree whenever the tree id changes: trees must be contiguous.
    if (treeids[i] != prev_tree) {
      if (!seen_trees.insert(treeids[i]).second) {
        *why = "the nodes of a tree are not contiguous";
        return std::nullopt;
      }
      f.roots.push_back(static_cast<int32_t>(i));
      prev_tree = treeids[i];
    }
    static const std::map<std::string, Mode> kModes = {
        {"BRANCH_LEQ", LEQ}, {"BRANCH_LT", LT}, {"BRANCH_GTE", GTE}, {"BRANCH_GT", GT},
        {"BRANCH_EQ", EQ},   {"BRANCH_NEQ", NEQ}, {"LEAF", LEAF}};
    auto m = kModes.find(modes[i]);
    if (m == kModes.end()) {
      *why = "unknown node mode " + modes[i];
      return std::nullopt;
    }
    f.mode.push_back(m->second);
    // A leaf's feature id means nothing, but the evaluation gathers it at every step (a leaf
    // points to itself): feature 0 keeps that read in bounds whatever the model says.
    f.feature.push_back(m->second == LEAF ? 0 : static_cast<int32_t>(featureids[i]));
    if (m->second != LEAF && featureids[i] < 0) {
      *why = "a negative feature id";
      return std::nullopt;
    }
    f.thr.push_back(values[i]);
    f.miss_true.push_back(i < missing.size() && missing[i] == 1);
    if (m->second != LEAF) f.max_feature = std::max(f.max_feature, static_cast<int>(featureids[i]));
  }
  f.members.resize(N);
  for (size_t i = 0; i < N; ++i) {
    int32_t t = static_cast<int32_t>(i), fl = t;
    if (f.mode[i] != LEAF) {
      auto a = index.find({treeids[i], trueids[i]}), b = index.find({treeids[i], falseids[i]});
      if (a == index.end() || b == index.end() || a->second == t || b->second == t) {
        *why = "a child node is missing or points to itself";
        return std::nullopt;
      }
      t = a->second;
      fl = b->second;
    }
    f.tnode.push_back(t);
    f.fnode.push_back(fl);
  }
  // Leaf weights. With one target ORT keeps only each leaf's first weight (whatever its id);
  // otherwise it aggregates all of them per target. Weights on branch nodes are ignored.
  const int T = f.n_targets;
  f.leaf_val.assign(N * T, 0.0);
  f.leaf_has.assign(N * T, 0);
  std::vector<uint8_t> any_weight(N, 0);
  for (size_t k = 0; k < w_ids.size(); ++k) {
    auto it = index.find({w_trees[k], w_nodes[k]});
    if (it == index.end()) {
      *why = "a weight refers to a missing node";
      return std::nullopt;
    }
    const int32_t leaf = it->second;
    if (f.mode[leaf] != LEAF) continue;
    const int64_t target = T == 1 ? 0 : w_ids[k];
    if (target < 0 || target >= T) {
      *why = "a weight's target/class id is out of range";
      return std::nullopt;
    }
    any_weight[leaf] = 1;
    double& v = f.leaf_val[leaf * T + target];
    uint8_t& h = f.leaf_has[leaf * T + target];
    const double w = weights[k];
    if (!h) v = w;
    else if (T == 1) continue;  // first weight only
    else if (f.agg == Agg::Min) v = std::min(v, w);
    else if (f.agg == Agg::Max) v = std::max(v, w);
    else v += w;
    h = 1;
  }
  for (size_t i = 0; i < N; ++i)
    if (f.mode[i] == LEAF && !any_weight[i]) {
      *why = "a leaf has no weight (ORT rejects the model)";
      return std::nullopt;
    }
  if (!measure_depth(f, why)) return std::nullopt;
  return f;
}

// TreeEnsemble (ai.onnx.ml 5): interior nodes in nodes_*, leaves in leaf_*; leaves get node
// indices after the interior nodes.
std::optional<Forest> build_v5(const graph::Node& n, std::string* why) {
  Forest f;
  const auto featureids = n.attr_ints("nodes_featureids");
  const auto trueids = n.attr_ints("nodes_truenodeids"), falseids = n.attr_ints("nodes_falsenodeids");
  const auto trueleafs = n.attr_ints("nodes_trueleafs"), falseleafs = n.attr_ints("nodes_falseleafs");
  const auto missing = n.attr_ints("nodes_missing_value_tracks_true");
  const auto roots = n.attr_ints("tree_roots"), targetids = n.attr_ints("leaf_targetids");
  auto tensor = [&](const char* name) -> std::optional<std::vector<double>> {
    const auto* a = n.attr(name);
    if (!a || !a->t) return std::vector<double>{};
    if (!graph::is_float(a->t->dtype)) return std::nullopt;
    return a->t->to_floats();
  };
  auto splits = tensor("nodes_splits"), lw = tensor("leaf_weights"), mv = tensor("membership_values");
  const auto* modes_attr = n.attr("nodes_modes");
  if (!splits || !lw || !mv || !modes_attr || !modes_attr->t) {
    *why = "nodes_splits/leaf_weights/membership_values must be float tensors, nodes_modes given";
    return std::nullopt;
  }
  const auto modes = modes_attr->t->to_ints();
  const size_t NI = featureids.size(), NL = targetids.size();
  if (trueids.size() != NI || falseids.size() != NI || trueleafs.size() != NI ||
      falseleafs.size() != NI || modes.size() != NI || splits->size() != NI || lw->size() != NL ||
      (!missing.empty() && missing.size() != NI)) {
    *why = "nodes_*/leaf_* attributes have different lengths";
    return std::nullopt;
  }
  f.n_targets = static_cast<int>(n.attr_int("n_targets", 0));
  const int agg = static_cast<int>(n.attr_int("aggregate_function", 1));
  const int pt = static_cast<int>(n.attr_int("post_transform", 0));
  if (f.n_targets < 1 || agg < 0 || agg > 3 || pt < 0 || pt > 4) {
    *why = "n_targets, aggregate_function or post_transform out of range";
    return std::nullopt;
  }
  // ORT's CPU EP reads post_transform 1 as LOGISTIC and 2 as SOFTMAX (its legacy enum order),
  // the spec says 1 = SOFTMAX, 2 = LOGISTIC: those two are ambiguous in practice.
  if (pt == 1 || pt == 2) {
    *why = "post_transform SOFTMAX/LOGISTIC (ORT's CPU EP swaps the two codes)";
    return std::nullopt;
  }
  f.agg = static_cast<Agg>(agg);  // AVERAGE 0, SUM 1, MIN 2, MAX 3
  static const PostTransform kPt[] = {PostTransform::None, PostTransform::Softmax,
                                      PostTransform::Logistic, PostTransform::SoftmaxZero,
                                      PostTransform::Probit};
  f.pt = kPt[pt];
  const size_t N = NI + NL;
  const int T = f.n_targets;
  f.members.resize(N);
  size_t mpos = 0;
  for (size_t i = 0; i < NI; ++i) {
    if (modes[i] < 0 || modes[i] > 6) {
      *why = "unknown node mode";
      return std::nullopt;
    }
    f.mode.push_back(static_cast<uint8_t>(modes[i]));
    if (featureids[i] < 0) {
      *why = "a negative feature id";
      return std::nullopt;
    }
    f.feature.push_back(static_cast<int32_t>(featureids[i]));
    f.thr.push_back((*splits)[i]);
    f.miss_true.push_back(!missing.empty() && missing[i] == 1);
    f.max_feature = std::max(f.max_feature, static_cast<int>(featureids[i]));
    auto child = [&](int64_t id, int64_t leaf) -> int32_t {
      if (leaf) return id >= 0 && static_cast<size_t>(id) < NL ? static_cast<int32_t>(NI + id) : -1;
      return id >= 0 && static_cast<size_t>(id) < NI && static_cast<size_t>(id) != i
                 ? static_cast<int32_t>(id) : -1;
    };
    f.tnode.push_back(child(trueids[i], trueleafs[i]));
    f.fnode.push_back(child(falseids[i], falseleafs[i]));
    if (f.tnode.back() < 0 || f.fnode.back() < 0) {
      *why = "a child index is out of range";
      return std::nullopt;
    }
    if (modes[i] == MEMBER) {  // the next NaN-terminated run of membership_values
      while (mpos < mv->size() && !std::isnan((*mv)[mpos])) f.members[i].push_back((*mv)[mpos++]);
      if (mpos >= mv->size()) {
        *why = "membership_values has fewer sets than BRANCH_MEMBER nodes";
        return std::nullopt;
      }
      ++mpos;
    }
  }
  f.leaf_val.assign(N * T, 0.0);
  f.leaf_has.assign(N * T, 0);
  for (size_t l = 0; l < NL; ++l) {
    const size_t i = NI + l;
    f.mode.push_back(LEAF);
    f.feature.push_back(0);
    f.thr.push_back(0);
    f.miss_true.push_back(0);
    f.tnode.push_back(static_cast<int32_t>(i));
    f.fnode.push_back(static_cast<int32_t>(i));
    if (targetids[l] < 0 || targetids[l] >= T) {
      *why = "leaf_targetids out of range";
      return std::nullopt;
    }
    f.leaf_val[i * T + (T == 1 ? 0 : targetids[l])] = (*lw)[l];
    f.leaf_has[i * T + (T == 1 ? 0 : targetids[l])] = 1;
  }
  for (auto r : roots) {
    if (r < 0 || static_cast<size_t>(r) >= NI) {
      *why = "tree_roots out of range";
      return std::nullopt;
    }
    // A one-leaf tree is a node whose two branches are the same leaf.
    const bool leaf_tree = trueleafs[r] && falseleafs[r] && trueids[r] == falseids[r];
    f.roots.push_back(leaf_tree ? f.tnode[r] : static_cast<int32_t>(r));
  }
  if (f.roots.empty()) {
    *why = "no trees";
    return std::nullopt;
  }
  if (!measure_depth(f, why)) return std::nullopt;
  return f;
}

}  // namespace ortmlx::ops::ml::tree
