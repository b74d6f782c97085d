// Tree ensembles (ai.onnx.ml TreeEnsembleRegressor/Classifier v1-3, TreeEnsemble v5) evaluated
// with MLX gathers: every (sample, tree) pair holds a current node index, and one step per tree
// level moves all of them at once (feature gather, threshold compare, child select). Leaves point
// to themselves, so running max-depth steps leaves every pair on its leaf. The node tables are
// built on the host from the attributes at translate time.
//
// Aggregation, base values, post-transforms and the classifier's binary special cases follow
// ORT's CPU kernels (tree_ensemble_common.h / tree_ensemble_aggregator.h), which the ONNX spec
// leaves open in places.
#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <set>

#include "ops/ml/ml_tree.h"

namespace ortmlx::ops::ml {

using namespace tree;

namespace {

// Host doubles as an array of dtype ct, converted on the host: the GPU backend has no float64,
// not even for a constant that is cast right away.
mx::array reals(const std::vector<double>& v, mx::Shape shape, mx::Dtype ct) {
  if (ct == mx::float64) return mx::array(v.data(), std::move(shape), mx::float64);
  std::vector<float> f(v.begin(), v.end());
  return mx::array(f.data(), std::move(shape), mx::float32);
}

template <typename T>
mx::array table(const std::vector<T>& v, mx::Dtype d, mx::Stream s) {
  return mx::astype(mx::array(v.begin(), {static_cast<int>(v.size())}), d, s);
}

// The leaf reached in every tree: [N, trees] int32 node indices. x: [N, F] in dtype ct.
mx::array find_leaves(const Forest& f, const mx::array& x, mx::Stream s) {
  const int N = x.shape(0), Tr = static_cast<int>(f.roots.size());
  const mx::Dtype ct = x.dtype();
  std::set<uint8_t> used;
  for (auto m : f.mode)
    if (m != LEAF) used.insert(m);
  auto feat = table(f.feature, mx::int32, s), tn = table(f.tnode, mx::int32, s), fn = table(f.fnode, mx::int32, s);
  auto thr = reals(f.thr, {static_cast<int>(f.thr.size())}, ct);
  auto mode = table(std::vector<int32_t>(f.mode.begin(), f.mode.end()), mx::int32, s);
  const bool any_missing = std::any_of(f.miss_true.begin(), f.miss_true.end(), [](auto v) { return v; });
  auto miss = table(std::vector<int32_t>(f.miss_true.begin(), f.miss_true.end()), mx::bool_, s);
  // Membership sets padded with NaN (which equals nothing) to [nodes, K].
  std::optional<mx::array> sets;
  if (used.count(MEMBER)) {
    size_t K = 1;
    for (const auto& m : f.members) K = std::max(K, m.size());
    std::vector<double> tbl(f.members.size() * K, std::nan(""));
    for (size_t i = 0; i < f.members.size(); ++i)
      std::copy(f.members[i].begin(), f.members[i].end(), tbl.begin() + i * K);
    sets = reals(tbl, {static_cast<int>(f.members.size()), static_cast<int>(K)}, ct);
  }
  auto cur = mx::broadcast_to(mx::reshape(table(f.roots, mx::int32, s), {1, Tr}, s), {N, Tr}, s);
  for (int d = 0; d < f.depth; ++d) {
    auto xv = mx::take_along_axis(x, mx::take(feat, cur, 0, s), 1, s);  // [N, Tr]
    auto th = mx::take(thr, cur, 0, s);
    auto cmp = [&](uint8_t m) -> mx::array {
      switch (m) {
        case LEQ: return mx::less_equal(xv, th, s);
        case LT: return mx::less(xv, th, s);
        case GTE: return mx::greater_equal(xv, th, s);
        case GT: return mx::greater(xv, th, s);
        case EQ: return mx::equal(xv, th, s);
        case NEQ: return mx::not_equal(xv, th, s);
        default:  // MEMBER
          return mx::any(mx::equal(mx::expand_dims(xv, -1, s), mx::take(*sets, cur, 0, s), s), -1,
                         false, s);
      }
    };
    mx::array cond = mx::array(false);
    if (used.size() == 1) {
      cond = cmp(*used.begin());
    } else if (!used.empty()) {
      auto md = mx::take(mode, cur, 0, s);
      cond = mx::zeros(cur.shape(), mx::bool_, s);
      for (auto m : used)
        cond = mx::where(mx::equal(md, mx::array(static_cast<int32_t>(m)), s), cmp(m), cond, s);
    }
    if (any_missing)
      cond = mx::logical_or(cond, mx::logical_and(mx::take(miss, cur, 0, s), mx::isnan(xv, s), s), s);
    cur = mx::where(cond, mx::take(tn, cur, 0, s), mx::take(fn, cur, 0, s), s);
  }
  return cur;
}

struct Scores {
  mx::array sum;  // [N, T] aggregated over trees (without base values)
  mx::array has;  // [N, T] bool: some reached leaf has a weight for the target
};

Scores aggregate(const Forest& f, const mx::array& leaves, mx::Dtype ct, mx::Stream s) {
  const int T = f.n_targets, n = static_cast<int>(f.mode.size());
  auto vals = reals(f.leaf_val, {n, T}, ct);
  auto hasv = table(std::vector<int32_t>(f.leaf_has.begin(), f.leaf_has.end()), mx::bool_, s);
  auto v = mx::take(vals, leaves, 0, s);                                 // [N, Tr, T]
  auto h = mx::take(mx::reshape(hasv, {n, T}, s), leaves, 0, s);
  auto has = mx::any(h, 1, false, s);
  mx::array sum = mx::array(0);
  switch (f.agg) {
    case Agg::Sum:
    case Agg::Average: sum = mx::sum(v, 1, false, s); break;  // absent weights are 0
    case Agg::Min: {
      auto inf = mx::array(std::numeric_limits<double>::infinity(), ct);
      sum = mx::min(mx::where(h, v, inf, s), 1, false, s);
      sum = mx::where(has, sum, mx::array(0.0, ct), s);
      break;
    }
    case Agg::Max: {
      auto ninf = mx::array(-std::numeric_limits<double>::infinity(), ct);
      sum = mx::max(mx::where(h, v, ninf, s), 1, false, s);
      sum = mx::where(has, sum, mx::array(0.0, ct), s);
      break;
    }
  }
  if (f.agg == Agg::Average)
    sum = mx::divide(sum, mx::array(static_cast<double>(f.roots.size()), ct), s);
  return {sum, has};
}

mx::array transform_scores(PostTransform pt, const mx::array& z, mx::Stream s) {
  if (pt == PostTransform::None) return z;
  auto r = post_transform(pt, mx::astype(z, mx::float32, s), s);
  return mx::astype(r, z.dtype(), s);
}

// A score ORT writes out: its ScoreValue reads as 0 unless some leaf gave the target a weight
// (base values do not count), before any transform.
mx::array written(const mx::array& v, const mx::array& has, mx::Stream s) {
  return mx::where(has, v, mx::array(0.0, v.dtype()), s);
}

// Regressor finalisation (TreeAggregator*): base values, then the transform; with one target
// ORT adds base_values[0] (when it is the only one) and applies only PROBIT.
mx::array finish_regression(const Forest& f, const Scores& sc, mx::Dtype ct, mx::Stream s) {
  const int T = f.n_targets;
  mx::array z = sc.sum;
  if (T == 1) {
    if (f.base.size() == 1) z = mx::add(z, mx::array(f.base[0], ct), s);
    return f.pt == PostTransform::Probit ? transform_scores(f.pt, z, s) : z;
  }
  if (static_cast<int>(f.base.size()) == T)
    z = mx::add(z, reals(f.base, {1, T}, ct), s);
  return transform_scores(f.pt, written(z, sc.has, s), s);
}

mx::array x_rows(OpContext& c, mx::Dtype* ct) {
  const auto& x = c.in(0);
  if (x.ndim() < 1 || x.ndim() > 2) c.fail("X must be 1-D or 2-D");
  auto r = x.ndim() == 1 ? mx::reshape(x, {1, x.shape(0)}, c.s) : x;
  // double input: double thresholds and sums (ORT); others (ints, half) in float32.
  *ct = r.dtype() == mx::float64 ? mx::float64 : mx::float32;
  return r.dtype() == *ct ? r : mx::astype(r, *ct, c.s);
}

void check_features(OpContext& c, const Forest& f, const mx::array& x) {
  if (f.max_feature >= x.shape(1)) c.fail("a node reads feature " + std::to_string(f.max_feature) +
                                          " of " + std::to_string(x.shape(1)));
}

Support tree_input(const NodeQuery& q, bool allow_int) {
  if (auto s = allow_int ? input_dtype_in(q, 0, {DType::Float32, DType::Float64, DType::Int64,
                                                  DType::Int32})
                         : input_dtype_in(q, 0, kFloat);
      !s)
    return s;
  if (q.gpu && q.input_dtype(0) == DType::Float64)
    return Support::no("float64 is not supported on the GPU");
  if (q.input_rank(0) > 2) return Support::no("input rank above 2");
  return Support::yes();
}

// Classifier facts ORT derives from the attributes.
struct ClassInfo {
  bool binary_case = false, all_positive = true, all_leaves_class1 = true;
};
ClassInfo class_info(const graph::Node& n, const Forest& f) {
  ClassInfo ci;
  const auto ids = n.attr_ints("class_ids");
  std::vector<double> w;
  std::string why;
  float_attr(n, "class_weights", &w, &why);
  ci.binary_case = f.n_targets == 2 && std::set<int64_t>(ids.begin(), ids.end()).size() == 1;
  for (double v : w)
    if (v < 0) ci.all_positive = false;
  if (f.n_targets == 2)
    for (size_t i = 0; i < f.mode.size(); ++i)
      if (f.mode[i] == LEAF && !f.leaf_has[i * 2 + 1]) ci.all_leaves_class1 = false;
  return ci;
}

}  // namespace

Support check_tree_regressor(const NodeQuery& q) {
  if (auto s = tree_input(q, true); !s) return s;
  std::string why;
  if (!build_legacy(q.node, false, &why)) return Support::no(why);
  return Support::yes();
}

Outputs translate_tree_regressor(OpContext& c) {
  std::string why;
  auto f = build_legacy(c.node, false, &why);
  if (!f) c.fail(why);
  mx::Dtype ct = mx::float32;
  auto x = x_rows(c, &ct);
  check_features(c, *f, x);
  auto z = finish_regression(*f, aggregate(*f, find_leaves(*f, x, c.s), ct, c.s), ct, c.s);
  return {mx::astype(z, mx::float32, c.s)};
}

Support check_tree_ensemble(const NodeQuery& q) {
  if (auto s = tree_input(q, false); !s) return s;
  std::string why;
  if (!build_v5(q.node, &why)) return Support::no(why);
  return Support::yes();
}

Outputs translate_tree_ensemble(OpContext& c) {
  std::string why;
  auto f = build_v5(c.node, &why);
  if (!f) c.fail(why);
  const mx::Dtype out_t = c.in(0).dtype();
  mx::Dtype ct = mx::float32;
  auto x = x_rows(c, &ct);
  check_features(c, *f, x);
  auto z = finish_regression(*f, aggregate(*f, find_leaves(*f, x, c.s), ct, c.s), ct, c.s);
  return {z.dtype() == out_t ? z : mx::astype(z, out_t, c.s)};
}

Support check_tree_classifier(const NodeQuery& q) {
  if (auto s = tree_input(q, true); !s) return s;
  const auto* ls = q.node.attr("classlabels_strings");
  if (ls && !ls->strings.empty()) return Support::no("string class labels (MLX has no string dtype)");
  std::string why;
  auto f = build_legacy(q.node, true, &why);
  if (!f) return Support::no(why);
  if (f->n_targets < 2) return Support::no("fewer than two classes");
  if (f->n_targets == 2) {
    // A sample whose leaves carry no class-1 weight keeps one score; ORT then writes the second
    // column only for some paths (PROBIT and a non-binary model with one base value leave it
    // uninitialised).
    auto ci = class_info(q.node, *f);
    const size_t B = f->base.size();
    const bool one_score = (B == 0 || B == 1) && !ci.all_leaves_class1;
    if (one_score && (f->pt == PostTransform::Probit || (!ci.binary_case && B == 1)))
      return Support::no("binary classifier case where ORT leaves a score undefined");
  }
  return Support::yes();
}

Outputs translate_tree_classifier(OpContext& c) {
  std::string why;
  auto f = build_legacy(c.node, true, &why);
  if (!f) c.fail(why);
  mx::Dtype ct = mx::float32;
  auto x = x_rows(c, &ct);
  check_features(c, *f, x);
  const auto s = c.s;
  auto sc = aggregate(*f, find_leaves(*f, x, s), ct, s);
  const auto labels = c.node.attr_ints("classlabels_int64s");
  const int C = f->n_targets;
  const size_t B = f->base.size();
  auto lab = mx::array(labels.data(), {C}, mx::int64);
  auto cst = [&](double v) { return mx::array(v, ct); };
  if (C > 2) {
    // Base values for the first classes; they also give those classes a score for the argmax.
    mx::array z = sc.sum, has = sc.has;
    if (B > 0) {
      std::vector<double> b(f->base.begin(), f->base.begin() + std::min<size_t>(B, C));
      b.resize(C, 0.0);
      std::vector<int32_t> hb(C, 0);
      for (size_t k = 0; k < std::min<size_t>(B, C); ++k) hb[k] = 1;
      z = mx::add(z, reals(b, {1, C}, ct), s);
      has = mx::logical_or(has, mx::astype(mx::array(hb.data(), {1, C}, mx::int32), mx::bool_, s), s);
    }
    // First maximum among the classes with a score.
    auto masked = mx::where(has, z, cst(-std::numeric_limits<double>::infinity()), s);
    auto y = mx::take(lab, mx::argmax(masked, 1, false, s), 0, s);
    return {y, mx::astype(transform_scores(f->pt, z, s), mx::float32, s)};
  }

  // Two classes: ORT's TreeAggregatorClassifier::FinalizeScores, per sample. The has-flags of
  // the two scores stay those of the aggregation (h0, h1) on every path.
  auto ci = class_info(c.node, *f);
  auto col = [&](const mx::array& a, int k) {
    return mx::squeeze(mx::slice(a, {0, k}, {a.shape(0), k + 1}, s), 1, s);
  };
  auto s0 = col(sc.sum, 0), s1 = col(sc.sum, 1);
  auto h0 = col(sc.has, 0), h1 = col(sc.has, 1);
  mx::array p0 = s0, p1 = s1;
  mx::array two = mx::array(true);  // the sample keeps two scores
  int was_static = -1;              // ORT's write_additional_scores before the label step
  if (B == 2) {
    // With a class-1 score ORT uses base[1] + score0 and its negation (not score1).
    auto q1 = mx::add(cst(f->base[1]), s0, s);
    p1 = mx::where(h1, q1, mx::add(s1, cst(f->base[1]), s), s);
    p0 = mx::where(h1, mx::negative(q1, s), mx::add(s0, cst(f->base[0]), s), s);
  } else if (B == 1) {
    p0 = mx::add(s0, cst(f->base[0]), s);
    two = h1;
  } else if (B == 0) {
    was_static = 3;
    two = h1;
  }
  auto pos = mx::where(h1, p1, mx::where(h0, p0, cst(0), s), s);
  mx::array y = mx::array(0), was = mx::array(was_static, mx::int32);
  if (ci.binary_case) {
    const double cut = ci.all_positive ? 0.5 : 0.0;
    auto win = mx::greater(pos, cst(cut), s);
    y = mx::where(win, mx::array(labels[1], mx::int64), mx::array(labels[0], mx::int64), s);
    was = mx::where(win, mx::array(ci.all_positive ? 0 : 2), mx::array(ci.all_positive ? 1 : 3), s);
  } else {  // ORT's fallback labels are the literals 1 / 0, not classlabels
    y = mx::where(mx::greater(pos, cst(0), s), mx::array(int64_t{1}), mx::array(int64_t{0}), s);
  }
  // Two scores: the transform over both. One score v: [1 - v, v] (was 0/1), [-v, v] or
  // [logistic(-v), logistic(v)] (was 2/3).
  auto w0 = written(p0, h0, s), w1 = written(p1, h1, s);
  auto both = transform_scores(f->pt, mx::stack({w0, w1}, 1, s), s);
  const bool logistic = f->pt == PostTransform::Logistic;
  auto low = mx::less(was, mx::array(2), s);
  // ORT 1.2x applies LOGISTIC on the [1 - v, v] path too (checked against its CPU EP).
  auto v0 = logistic ? mx::sigmoid(w0, s) : w0;
  auto one_a = mx::where(low, mx::subtract(cst(1), v0, s),
                         logistic ? mx::sigmoid(mx::negative(w0, s), s) : mx::negative(w0, s), s);
  auto one_b = mx::where(low, v0, logistic ? mx::sigmoid(w0, s) : w0, s);
  auto one = mx::stack({one_a, one_b}, 1, s);
  auto z = mx::where(mx::expand_dims(two, -1, s), both, one, s);
  return {y, mx::astype(z, mx::float32, s)};
}

}  // namespace ortmlx::ops::ml
