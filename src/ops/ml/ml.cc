// ai.onnx.ml: linear models, feature transforms (Normalizer, Scaler, Binarizer, Imputer,
// OneHotEncoder, ArrayFeatureExtractor, FeatureVectorizer); tree ensembles are in ml_tree.cc.
//
// The ONNX-ML specs leave many corner cases open (binary classifiers, score transforms for a
// single target, attribute defaults); where they do, these translators follow ORT's CPU kernels
// (onnxruntime/core/providers/cpu/ml/*), and they decline the cases where ORT's output is
// undefined (uninitialised scores) or needs strings, which MLX has no dtype for.
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "ops/ml/ml_internal.h"

namespace ortmlx::ops {
namespace ml {

std::optional<PostTransform> parse_post_transform(const std::string& n) {
  if (n == "NONE") return PostTransform::None;
  if (n == "LOGISTIC") return PostTransform::Logistic;
  if (n == "SOFTMAX") return PostTransform::Softmax;
  if (n == "SOFTMAX_ZERO") return PostTransform::SoftmaxZero;
  if (n == "PROBIT") return PostTransform::Probit;
  return std::nullopt;
}

mx::array probit(const mx::array& p, mx::Stream s) {
  auto f = [&](double v) { return mx::array(static_cast<float>(v), mx::float32); };
  auto x = mx::subtract(mx::multiply(f(2), p, s), f(1), s);
  auto sgn = mx::where(mx::less(x, f(0), s), f(-1), f(1), s);
  auto lg = mx::log(mx::multiply(mx::subtract(f(1), x, s), mx::add(f(1), x, s), s), s);
  auto v = mx::add(mx::array(2.0f / (3.14159f * 0.147f)), mx::multiply(f(0.5), lg, s), s);
  auto v2 = mx::multiply(mx::array(1.0f / 0.147f), lg, s);
  auto v3 = mx::subtract(mx::sqrt(mx::subtract(mx::multiply(v, v, s), v2, s), s), v, s);
  return mx::multiply(mx::array(static_cast<float>(M_SQRT2)),
                      mx::multiply(sgn, mx::sqrt(v3, s), s), s);
}

mx::array post_transform(PostTransform t, const mx::array& z, mx::Stream s) {
  switch (t) {
    case PostTransform::None: return z;
    case PostTransform::Logistic: return mx::sigmoid(z, s);
    case PostTransform::Softmax: return mx::softmax(z, std::vector<int>{1}, /*precise=*/true, s);
    case PostTransform::SoftmaxZero: {
      // Entries with |v| <= 1e-7 count as absent: they are scaled by exp(-max) instead of
      // exponentiated, and left out of the sum (ORT's ComputeSoftmaxZero).
      auto vmax = mx::max(z, 1, true, s);
      auto nz = mx::greater(mx::abs(z, s), mx::array(1e-7f), s);
      auto e = mx::where(nz, mx::exp(mx::subtract(z, vmax, s), s),
                         mx::multiply(z, mx::exp(mx::negative(vmax, s), s), s), s);
      auto sum = mx::sum(mx::where(nz, e, mx::array(0.0f), s), 1, true, s);
      return mx::divide(e, sum, s);
    }
    case PostTransform::Probit: return probit(z, s);
  }
  return z;
}

mx::array rows_f32(const mx::array& x, mx::Stream s) {
  auto r = x.ndim() == 1 ? mx::reshape(x, {1, x.shape(0)}, s) : x;
  return r.dtype() == mx::float32 ? r : mx::astype(r, mx::float32, s);
}

}  // namespace ml

namespace {

using namespace ml;

constexpr std::initializer_list<DType> kMlNumeric = {DType::Float32, DType::Float64, DType::Int64,
                                                     DType::Int32};

Support ml_input(const NodeQuery& q, size_t i = 0) {
  if (auto s = input_dtype_in(q, i, kMlNumeric); !s) return s;
  if (q.gpu && q.input_dtype(i) == DType::Float64)
    return Support::no("float64 is not supported on the GPU");
  return Support::yes();
}
Support max_rank(const NodeQuery& q, int r) {
  if (q.input_rank(0) > r) return Support::no("input rank above " + std::to_string(r));
  return Support::yes();
}
void require_rank(const OpContext& c, int lo, int hi) {
  int r = c.in(0).ndim();
  if (r < lo || r > hi)
    c.fail("input rank " + std::to_string(r) + " is outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
}
bool has_strings(const graph::Node& n, std::string_view name) {
  const auto* a = n.attr(name);
  return a && !a->strings.empty();
}
mx::array floats(const std::vector<float>& v, mx::Shape shape) {
  return mx::array(v.data(), std::move(shape), mx::float32);
}
mx::array ints64(const std::vector<int64_t>& v) {
  return mx::array(v.data(), {static_cast<int>(v.size())}, mx::int64);
}

// ---------------------------------------------------------------------------------------------
// LinearClassifier / LinearRegressor: scores = X·coefficients^T + intercepts, in float32.

Support check_linear_classifier(const NodeQuery& q) {
  const auto& n = q.node;
  if (auto s = ml_input(q); !s) return s;
  if (auto s = max_rank(q, 2); !s) return s;
  if (has_strings(n, "classlabels_strings"))
    return Support::no("string class labels (MLX has no string dtype)");
  auto pt = parse_post_transform(n.attr_string("post_transform", "NONE"));
  if (!pt) return Support::no("unknown post_transform");
  const auto intercepts = n.attr_floats("intercepts");
  const auto coef = n.attr_floats("coefficients");
  const auto labels = n.attr_ints("classlabels_ints");
  // ORT sizes the scores by `intercepts`: without them it has no classes.
  if (intercepts.empty()) return Support::no("intercepts are required (ORT sizes the scores by them)");
  const size_t E = intercepts.size();
  if (coef.empty() || coef.size() % E != 0)
    return Support::no("coefficients are not a multiple of the class count");
  if (E >= 2 && labels.size() < E) return Support::no("fewer classlabels_ints than classes");
  // One score column with two labels: ORT writes [1 - s, s]; with PROBIT it leaves the second
  // column uninitialised.
  if (E == 1 && labels.size() == 2 && *pt == PostTransform::Probit)
    return Support::no("binary LinearClassifier with PROBIT (ORT's second score is undefined)");
  return Support::yes();
}

Outputs translate_linear_classifier(OpContext& c) {
  const auto& n = c.node;
  require_rank(c, 1, 2);
  auto x = rows_f32(c.in(0), c.s);
  const auto intercepts = n.attr_floats("intercepts");
  const auto coef = n.attr_floats("coefficients");
  const auto labels = n.attr_ints("classlabels_ints");
  const int E = static_cast<int>(intercepts.size());
  const int C = x.shape(1);
  if (static_cast<int>(coef.size()) != E * C) c.fail("coefficients do not match the input width");
  const auto pt = *parse_post_transform(n.attr_string("post_transform", "NONE"));
  auto W = floats(coef, {E, C});
  auto z = mx::add(mx::matmul(x, mx::transpose(W, {1, 0}, c.s), c.s), floats(intercepts, {1, E}), c.s);
  mx::array y = mx::array(0);
  if (E == 1) {
    // Binary with one score: the positive label wins for a score > 0.
    int64_t pos = labels.size() == 2 ? labels[1] : 1, neg = labels.size() == 2 ? labels[0] : 0;
    y = mx::where(mx::greater(mx::squeeze(z, 1, c.s), mx::array(0.0f), c.s),
                  mx::array(pos, mx::int64), mx::array(neg, mx::int64), c.s);
    if (labels.size() == 2) {
      // ORT adds the complementary class; of the transforms only LOGISTIC applies (first).
      if (pt == PostTransform::Logistic) z = mx::sigmoid(z, c.s);
      z = mx::concatenate({mx::subtract(mx::array(1.0f), z, c.s), z}, 1, c.s);
    }
    else if (pt == PostTransform::Probit)  // the only transform ORT applies to one score
      z = probit(z, c.s);
  } else {
    // First maximum of the raw scores (ORT compares with '>').
    auto idx = mx::argmax(z, 1, false, c.s);
    y = mx::take(ints64(std::vector<int64_t>(labels.begin(), labels.begin() + E)), idx, 0, c.s);
    z = post_transform(pt, z, c.s);
  }
  return {y, z};
}

Support check_linear_regressor(const NodeQuery& q) {
  const auto& n = q.node;
  if (auto s = ml_input(q); !s) return s;
  if (auto s = max_rank(q, 2); !s) return s;
  auto pt = parse_post_transform(n.attr_string("post_transform", "NONE"));
  if (!pt) return Support::no("unknown post_transform");
  const auto targets = n.attr_int("targets", 1);
  const auto coef = n.attr_floats("coefficients");
  if (targets < 1 || coef.empty() || coef.size() % targets != 0)
    return Support::no("coefficients are not a multiple of targets");
  return Support::yes();
}

Outputs translate_linear_regressor(OpContext& c) {
  const auto& n = c.node;
  require_rank(c, 1, 2);
  auto x = rows_f32(c.in(0), c.s);
  const int T = static_cast<int>(n.attr_int("targets", 1));
  const auto coef = n.attr_floats("coefficients");
  const auto intercepts = n.attr_floats("intercepts");
  const int C = x.shape(1);
  if (static_cast<int>(coef.size()) != T * C) c.fail("coefficients do not match the input width");
  auto y = mx::matmul(x, mx::transpose(floats(coef, {T, C}), {1, 0}, c.s), c.s);
  // ORT uses the intercepts only when there is one per target.
  if (static_cast<int>(intercepts.size()) == T) y = mx::add(y, floats(intercepts, {1, T}), c.s);
  const auto pt = *parse_post_transform(n.attr_string("post_transform", "NONE"));
  if (T >= 2 || pt == PostTransform::Probit) y = post_transform(pt, y, c.s);
  return {y};
}

// ---------------------------------------------------------------------------------------------
// Normalizer: per row (a 1-D input is one row); the output is float32.

Support check_normalizer(const NodeQuery& q) {
  if (auto s = ml_input(q); !s) return s;
  if (auto s = max_rank(q, 2); !s) return s;
  auto norm = q.node.attr_string("norm", "MAX");
  if (norm != "MAX" && norm != "L1" && norm != "L2") return Support::no("unknown norm " + norm);
  return Support::yes();
}

Outputs translate_normalizer(OpContext& c) {
  require_rank(c, 1, 2);
  const auto& x0 = c.in(0);
  auto x = x0.dtype() == mx::float32 ? x0 : mx::astype(x0, mx::float32, c.s);
  const int axis = x.ndim() - 1;
  const auto norm = c.node.attr_string("norm", "MAX");
  mx::array d = mx::array(0.0f);
  if (norm == "MAX")  // the maximum itself, not the largest magnitude (ORT)
    d = mx::max(x, axis, true, c.s);
  else if (norm == "L1")
    d = mx::sum(mx::abs(x, c.s), axis, true, c.s);
  else
    d = mx::sqrt(mx::sum(mx::square(x, c.s), axis, true, c.s), c.s);
  // A zero norm leaves the row unchanged.
  auto zero = mx::equal(d, mx::array(0.0f), c.s);
  return {mx::where(zero, x, mx::divide(x, mx::where(zero, mx::array(1.0f), d, c.s), c.s), c.s)};
}

// ---------------------------------------------------------------------------------------------
// Scaler: (X - offset) * scale, offset/scale of one value or one per feature; float32 output.

Support check_scaler(const NodeQuery& q) {
  if (auto s = ml_input(q); !s) return s;
  auto scale = q.node.attr_floats("scale"), offset = q.node.attr_floats("offset");
  if (scale.empty() || scale.size() != offset.size())
    return Support::no("scale and offset must have the same, non-zero length (as ORT)");
  // ORT indexes per-feature values by i % shape[1], which is the last axis only up to rank 2.
  if (scale.size() > 1 && q.input_rank(0) > 2)
    return Support::no("per-feature scale on a rank > 2 input");
  return Support::yes();
}

Outputs translate_scaler(OpContext& c) {
  require_rank(c, 1, 8);
  auto scale = c.node.attr_floats("scale"), offset = c.node.attr_floats("offset");
  const auto& x0 = c.in(0);
  const int C = x0.ndim() == 1 ? x0.shape(0) : x0.shape(1);
  const int k = static_cast<int>(scale.size());
  if (k != 1 && (k != C || x0.ndim() > 2))
    c.fail("scale/offset must have 1 or " + std::to_string(C) + " values");
  // Double inputs are scaled in double (ORT's arithmetic), everything else in float32.
  const mx::Dtype ct = x0.dtype() == mx::float64 ? mx::float64 : mx::float32;
  auto x = mx::astype(x0, ct, c.s);
  auto off = mx::astype(floats(offset, {k}), ct, c.s), sc = mx::astype(floats(scale, {k}), ct, c.s);
  auto y = mx::multiply(mx::subtract(x, off, c.s), sc, c.s);
  return {y.dtype() == mx::float32 ? y : mx::astype(y, mx::float32, c.s)};
}

// ---------------------------------------------------------------------------------------------
// Binarizer: 1 where X > threshold, else 0, in X's dtype.

Support check_binarizer(const NodeQuery& q) { return ml_input(q); }

Outputs translate_binarizer(OpContext& c) {
  const auto& x = c.in(0);
  const double thr = c.node.attr_float("threshold", 0.0f);
  // Integers compare as float (C++'s int-to-float promotion in ORT's kernel).
  auto xc = x.dtype() == mx::float64 ? x : mx::astype(x, mx::float32, c.s);
  auto gt = mx::greater(xc, mx::array(thr, xc.dtype()), c.s);
  return {mx::astype(gt, x.dtype(), c.s)};
}

// ---------------------------------------------------------------------------------------------
// ArrayFeatureExtractor: X[..., Y] on the last axis; a 1-D X gives [1, len(Y)] (ORT).

Support check_array_feature_extractor(const NodeQuery& q) {
  if (auto s = ml_input(q); !s) return s;
  return input_dtype_in(q, 1, {DType::Int64});
}

Outputs translate_array_feature_extractor(OpContext& c) {
  require_rank(c, 1, 8);
  const auto& x = c.in(0);
  if (c.in(1).size() == 0) c.fail("Y (the indices) is empty");
  auto idx = mx::flatten(c.checked_indices(c.in(1), {x.shape(-1)}, false, "Y", 1), c.s);
  auto z = mx::take(x, idx, -1, c.s);
  if (x.ndim() == 1) z = mx::reshape(z, {1, static_cast<int>(idx.size())}, c.s);
  return {z};
}

// ---------------------------------------------------------------------------------------------
// Imputer: replaces replaced_value (NaN matches NaN) by the imputed value(s).

Support check_imputer(const NodeQuery& q) {
  const auto& n = q.node;
  if (auto s = input_dtype_in(q, 0, {DType::Float32, DType::Int64}); !s) return s;
  const auto fl = n.attr_floats("imputed_value_floats");
  const auto in = n.attr_ints("imputed_value_int64s");
  if (fl.empty() == in.empty()) return Support::no("exactly one of imputed_value_floats/int64s");
  const DType t = q.input_dtype(0);
  if (t == DType::Float32 && fl.empty()) return Support::no("float input needs imputed_value_floats");
  if (t == DType::Int64 && in.empty()) return Support::no("int64 input needs imputed_value_int64s");
  if (std::max(fl.size(), in.size()) > 1 && q.input_rank(0) > 2)
    return Support::no("per-feature values on a rank > 2 input");
  return Support::yes();
}

Outputs translate_imputer(OpContext& c) {
  require_rank(c, 1, 8);
  const auto& x = c.in(0);
  const int C = x.ndim() == 1 ? x.shape(0) : x.shape(1);
  mx::array imputed = mx::array(0), hit = mx::array(false);
  size_t k;
  if (x.dtype() == mx::float32) {
    auto v = c.node.attr_floats("imputed_value_floats");
    k = v.size();
    const float rep = c.node.attr_float("replaced_value_float", 0.0f);
    hit = std::isnan(rep) ? mx::isnan(x, c.s) : mx::equal(x, mx::array(rep), c.s);
    imputed = k == static_cast<size_t>(C) ? floats(v, {C}) : mx::array(v[0]);
  } else {
    auto v = c.node.attr_ints("imputed_value_int64s");
    k = v.size();
    const int64_t rep = c.node.attr_int("replaced_value_int64", 0);
    hit = mx::equal(x, mx::array(rep, mx::int64), c.s);
    imputed = k == static_cast<size_t>(C) ? ints64(v) : mx::array(v[0], mx::int64);
  }
  // ORT: one value per feature when the count matches the width, else the first value.
  if (k == static_cast<size_t>(C) && x.ndim() > 2) c.fail("per-feature values on a rank > 2 input");
  if (k == static_cast<size_t>(C) && x.ndim() == 2) imputed = mx::reshape(imputed, {1, C}, c.s);
  return {mx::where(hit, imputed, x, c.s)};
}

// ---------------------------------------------------------------------------------------------
// OneHotEncoder (int64 categories): [..., len(cats)] float32; values cast to int64 first.

Support check_one_hot_encoder(const NodeQuery& q) {
  const auto& n = q.node;
  if (auto s = ml_input(q); !s) return s;
  if (auto s = max_rank(q, 2); !s) return s;
  if (has_strings(n, "cats_strings"))
    return Support::no("string categories (MLX has no string dtype)");
  auto cats = n.attr_ints("cats_int64s");
  if (cats.empty()) return Support::no("no categories");
  if (std::set<int64_t>(cats.begin(), cats.end()).size() != cats.size())
    return Support::no("duplicate categories");
  // zeros=0 makes an unknown category a run-time error, which needs the data on the host.
  if (n.attr_int("zeros", 1) == 0) return Support::no("zeros=0 (error on unknown categories)");
  return Support::yes();
}

Outputs translate_one_hot_encoder(OpContext& c) {
  require_rank(c, 0, 2);
  auto x = mx::astype(c.in(0), mx::int64, c.s);  // float -> int64 truncates, as static_cast
  auto cats = ints64(c.node.attr_ints("cats_int64s"));
  return {mx::astype(mx::equal(mx::expand_dims(x, -1, c.s), cats, c.s), mx::float32, c.s)};
}

// ---------------------------------------------------------------------------------------------
// FeatureVectorizer: each input as [N, rest], truncated or zero-padded to its inputdimensions
// entry, concatenated into [N, sum] float32.

Support check_feature_vectorizer(const NodeQuery& q) {
  const auto dims = q.node.attr_ints("inputdimensions");
  if (dims.size() != q.num_inputs()) return Support::no("inputdimensions does not match the inputs");
  for (auto d : dims)
    if (d < 0) return Support::no("negative inputdimensions");
  for (size_t i = 0; i < q.num_inputs(); ++i)
    if (auto s = ml_input(q, i); !s) return s;
  return Support::yes();
}

Outputs translate_feature_vectorizer(OpContext& c) {
  const auto dims = c.node.attr_ints("inputdimensions");
  const auto& x0 = c.in(0);
  if (x0.ndim() == 0) c.fail("scalar input");
  const int N = x0.ndim() == 1 ? 1 : x0.shape(0);
  std::vector<mx::array> parts;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const auto& xi = c.in(i);
    if (xi.ndim() == 0) c.fail("scalar input");
    const int rows = xi.ndim() == 1 ? 1 : xi.shape(0);
    if (rows != N) c.fail("inputs have different batch sizes");
    auto r = mx::astype(mx::reshape(xi, {N, static_cast<int>(xi.size() / std::max(N, 1))}, c.s),
                        mx::float32, c.s);
    const int want = static_cast<int>(dims[i]), have = r.shape(1);
    if (have > want) r = mx::slice(r, {0, 0}, {N, want}, c.s);
    if (have < want) r = mx::pad(r, {{0, 0}, {0, want - have}}, mx::array(0.0f), "constant", c.s);
    parts.push_back(r);
  }
  return {mx::concatenate(parts, 1, c.s)};
}

// ---------------------------------------------------------------------------------------------
// LabelEncoder (opsets 2-4): maps each input value found among `keys` to the value at the same
// position, others to the default. Numeric keys/values only: strings have no MLX dtype. The
// lookup compares every element with every key (an (..., K) mask) and gathers the value of the
// matching key. Opset 4's keys may be NaN, which matches any NaN input (the spec's rule).

struct LabelMap {
  DType key_type = DType::Undefined, value_type = DType::Undefined;
  std::vector<double> keys, values;  // int64 keys/values are held exactly as int64 below
  std::vector<int64_t> ikeys, ivalues;
  double def = 0;
  int64_t idef = 0;
};

// Reads one side (keys or values) of the map: `<side>_tensor` (opset 4) or the typed lists.
// Returns an error message, or "" on success.
std::string read_side(const graph::Node& n, const std::string& side, DType* type,
                      std::vector<double>* f, std::vector<int64_t>* i) {
  if (const auto* a = n.attr(side + "_tensor"); a && a->t) {
    *type = a->t->dtype;
    if (!graph::is_float(*type) && !graph::is_integer(*type))
      return side + "_tensor of type " + graph::dtype_name(*type) + " (numeric types only)";
    if (graph::is_float(*type)) *f = a->t->to_floats(); else *i = a->t->to_ints();
    return {};
  }
  if (has_strings(n, side + "_strings")) return side + "_strings (MLX has no string dtype)";
  if (const auto* a = n.attr(side + "_int64s"); a && !a->ints.empty()) {
    *type = DType::Int64;
    *i = a->ints;
    return {};
  }
  if (const auto* a = n.attr(side + "_floats"); a && !a->floats.empty()) {
    *type = DType::Float32;
    f->assign(a->floats.begin(), a->floats.end());
    return {};
  }
  return "no " + side + " given";
}

std::string read_label_map(const graph::Node& n, LabelMap* m) {
  if (auto e = read_side(n, "keys", &m->key_type, &m->keys, &m->ikeys); !e.empty()) return e;
  if (auto e = read_side(n, "values", &m->value_type, &m->values, &m->ivalues); !e.empty())
    return e;
  const size_t nk = std::max(m->keys.size(), m->ikeys.size());
  if (nk != std::max(m->values.size(), m->ivalues.size()))
    return "keys and values differ in length";
  if (nk > 65536) return "more than 65536 keys (the lookup compares every key)";
  // Duplicate keys: which value wins is the map implementation's choice; leave them to ORT.
  if (!m->ikeys.empty() && std::set<int64_t>(m->ikeys.begin(), m->ikeys.end()).size() != nk)
    return "duplicate keys";
  if (!m->keys.empty()) {
    std::set<double> seen;
    size_t nans = 0;
    for (double k : m->keys) {
      if (std::isnan(k)) ++nans; else seen.insert(k);
    }
    if (seen.size() + std::min<size_t>(nans, 1) != nk) return "duplicate keys";
    if (nans && n.since_version < 4) return "NaN keys before opset 4 (no matching rule)";
  }
  if (const auto* a = n.attr("default_tensor"); a && a->t) {
    if (a->t->numel() != 1 || a->t->dtype != m->value_type)
      return "default_tensor must be one value of the values' type";
    if (graph::is_float(m->value_type)) m->def = a->t->float_at(0); else m->idef = a->t->int_at(0);
  } else if (graph::is_float(m->value_type)) {
    m->def = n.attr_float("default_float", -0.0f);
  } else {
    m->idef = n.attr_int("default_int64", -1);
  }
  return {};
}

Support check_label_encoder(const NodeQuery& q) {
  LabelMap m;
  if (auto e = read_label_map(q.node, &m); !e.empty()) return Support::no(e);
  for (DType t : {m.key_type, m.value_type}) {
    if (!to_mlx_dtype(t)) return Support::no(std::string("type ") + graph::dtype_name(t));
    if (q.gpu && t == DType::Float64) return Support::no("float64 is not supported on the GPU");
  }
  DType in = q.input_dtype(0);
  if (in != DType::Undefined && in != m.key_type)
    return Support::no(std::string("input type ") + graph::dtype_name(in) + " differs from keys' " +
                       graph::dtype_name(m.key_type));
  return Support::yes();
}

Outputs translate_label_encoder(OpContext& c) {
  LabelMap m;
  if (auto e = read_label_map(c.node, &m); !e.empty()) c.fail(e);
  const auto s = c.s;
  const auto& x = c.in(0);
  const int nk = static_cast<int>(std::max(m.keys.size(), m.ikeys.size()));
  // Host values -> arrays of their type (exact: they were read from that type). float64 stays
  // float64 (CPU only, declined on GPUs); other floats go through float32, never float64, so
  // no float64 op reaches a GPU stream.
  auto host = [&](DType t, std::vector<double> f, std::vector<int64_t> i, int n) {
    if (t == DType::Float64) return mx::array(f.data(), {n}, mx::float64);
    if (graph::is_float(t)) {
      std::vector<float> v(f.begin(), f.end());
      return mx::astype(mx::array(v.data(), {n}, mx::float32), mlx_dtype(t), s);
    }
    return mx::astype(mx::array(i.data(), {n}, mx::int64), mlx_dtype(t), s);
  };
  auto side = [&](DType t, const std::vector<double>& f, const std::vector<int64_t>& i) {
    return host(t, f, i, nk);
  };
  auto def = mx::reshape(host(m.value_type, {m.def}, {m.idef}, 1), {}, s);
  if (nk == 0 || x.size() == 0) return {mx::broadcast_to(def, x.shape(), s)};
  auto keys = side(m.key_type, m.keys, m.ikeys);
  auto values = side(m.value_type, m.values, m.ivalues);
  if (keys.dtype() != x.dtype()) c.fail("input type differs from the keys' type");
  auto xe = mx::expand_dims(x, -1, s);
  auto eq = mx::equal(xe, keys, s);
  if (graph::is_float(m.key_type))
    eq = mx::logical_or(eq, mx::logical_and(mx::isnan(xe, s), mx::isnan(keys, s), s), s);
  auto found = mx::any(eq, -1, false, s);
  auto pos = mx::argmax(mx::astype(eq, mx::uint8, s), -1, false, s);
  return {mx::where(found, mx::take(values, pos, s), def, s)};
}

constexpr std::string_view kLinearNotes =
    "int64 class labels only (no strings); a binary classifier with two labels and PROBIT is "
    "declined; PROBIT uses ORT's erfinv approximation";

const OpEntry kOps[] = {
    {"ai.onnx.ml", "LinearClassifier", 1, kAnyOpset, check_linear_classifier,
     translate_linear_classifier, kLinearNotes},
    {"ai.onnx.ml", "LinearRegressor", 1, kAnyOpset, check_linear_regressor,
     translate_linear_regressor},
    {"ai.onnx.ml", "Normalizer", 1, kAnyOpset, check_normalizer, translate_normalizer},
    {"ai.onnx.ml", "Scaler", 1, kAnyOpset, check_scaler, translate_scaler},
    {"ai.onnx.ml", "Binarizer", 1, kAnyOpset, check_binarizer, translate_binarizer},
    {"ai.onnx.ml", "ArrayFeatureExtractor", 1, kAnyOpset, check_array_feature_extractor,
     translate_array_feature_extractor, "numeric tensors only (no strings)"},
    {"ai.onnx.ml", "Imputer", 1, kAnyOpset, check_imputer, translate_imputer,
     "float32 and int64 inputs"},
    {"ai.onnx.ml", "OneHotEncoder", 1, kAnyOpset, check_one_hot_encoder, translate_one_hot_encoder,
     "cats_int64s only; zeros=0 (error on unknown category) is declined"},
    {"ai.onnx.ml", "FeatureVectorizer", 1, kAnyOpset, check_feature_vectorizer,
     translate_feature_vectorizer},
    {"ai.onnx.ml", "TreeEnsembleRegressor", 1, 4, check_tree_regressor, translate_tree_regressor,
     "*_as_tensor attributes must be float32"},
    {"ai.onnx.ml", "TreeEnsembleClassifier", 1, 4, check_tree_classifier,
     translate_tree_classifier,
     "int64 class labels only; binary cases where ORT leaves a score undefined are declined"},
    {"ai.onnx.ml", "TreeEnsemble", 5, kAnyOpset, check_tree_ensemble, translate_tree_ensemble},
    {"ai.onnx.ml", "LabelEncoder", 2, 4, check_label_encoder, translate_label_encoder,
     "numeric keys/values only (no strings); duplicate keys declined; at most 65536 keys"},
};

}  // namespace

std::span<const OpEntry> ml_ops() { return kOps; }

}  // namespace ortmlx::ops
