// Einsum and Det.
//
// Einsum: the equation is parsed here (not by MLX) so every ONNX form is handled the same way:
// repeated labels in one operand become diagonals, ellipses are expanded to concrete dims with
// numpy broadcasting, size-1 dims broadcast against the other operands' sizes, and the implicit
// output (no "->") is the ellipsis dims followed by the labels used exactly once, sorted. The
// remaining plain contraction goes to mx::einsum for floats (matmul-based, path-optimised);
// integers go through broadcast-multiply-and-sum, since MLX's matmul is floating point only.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

constexpr int kLetters = 52;  // label ids: 'A'-'Z' = 0..25, 'a'-'z' = 26..51 (ASCII order)
constexpr int kEllipsis = -1;  // marker in a parsed term

struct Equation {
  std::vector<std::vector<int>> inputs;  // label ids or kEllipsis
  bool explicit_output = false;
  std::vector<int> output;
};

// Parses the equation; returns an error message or "".
std::string parse_equation(std::string eq, Equation& out) {
  eq.erase(std::remove_if(eq.begin(), eq.end(), [](unsigned char ch) { return std::isspace(ch); }),
           eq.end());
  auto parse_term = [](const std::string& t, std::vector<int>& ids) -> std::string {
    for (size_t i = 0; i < t.size(); ++i) {
      char ch = t[i];
      if (ch >= 'A' && ch <= 'Z') ids.push_back(ch - 'A');
      else if (ch >= 'a' && ch <= 'z') ids.push_back(ch - 'a' + 26);
      else if (t.compare(i, 3, "...") == 0) {
        if (std::count(ids.begin(), ids.end(), kEllipsis)) return "more than one ellipsis in a term";
        ids.push_back(kEllipsis);
        i += 2;
      } else {
        return std::string("invalid character '") + ch + "'";
      }
    }
    return {};
  };
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  if (arrow != std::string::npos) {
    out.explicit_output = true;
    if (auto e = parse_term(eq.substr(arrow + 2), out.output); !e.empty()) return e;
  }
  size_t start = 0;
  for (;;) {
    auto comma = lhs.find(',', start);
    out.inputs.emplace_back();
    if (auto e = parse_term(lhs.substr(start, comma - start), out.inputs.back()); !e.empty())
      return e;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {};
}

// One operand during the contraction: the array and one label id per axis (ellipsis dims get
// ids kLetters + position).
struct Operand {
  mx::array a;
  std::vector<int> labels;
};

// Transposes/expands `op` to the label order `order` (labels missing from op get size-1 dims).
mx::array align(const Operand& op, const std::vector<int>& order, mx::Stream s) {
  std::vector<int> perm;
  for (int l : order) {
    auto it = std::find(op.labels.begin(), op.labels.end(), l);
    if (it != op.labels.end()) perm.push_back(static_cast<int>(it - op.labels.begin()));
  }
  mx::array t = mx::transpose(op.a, perm, s);
  mx::Shape shape;
  for (int l : order) {
    auto it = std::find(op.labels.begin(), op.labels.end(), l);
    shape.push_back(it == op.labels.end() ? 1 : op.a.shape(static_cast<int>(it - op.labels.begin())));
  }
  return mx::reshape(t, shape, s);
}

// Sums out the labels of `op` that are not in `keep`.
void sum_out(Operand& op, const std::set<int>& keep, mx::Stream s) {
  std::vector<int> axes, labels;
  for (size_t i = 0; i < op.labels.size(); ++i) {
    if (keep.count(op.labels[i])) labels.push_back(op.labels[i]);
    else axes.push_back(static_cast<int>(i));
  }
  if (axes.empty()) return;
  op.a = mx::sum(op.a, axes, false, s);
  op.labels = std::move(labels);
}

// Long because the equation is parsed, checked against the operands and lowered (diagonals,
// reductions, one contraction) in one pass over the same label tables.
Outputs translate_einsum(OpContext& c) {
  Equation eq;
  if (auto e = parse_equation(c.node.attr_string("equation", ""), eq); !e.empty()) c.fail(e);
  const size_t n = eq.inputs.size();
  if (n != c.num_inputs()) c.fail("equation has " + std::to_string(n) + " operands, node has " +
                                  std::to_string(c.num_inputs()));
  const auto dtype = c.in(0).dtype();
  const bool up = compute_half_in_f32(c.in(0), c.s);

  // Ellipsis dims: right-aligned across operands, like numpy broadcasting.
  int n_ell = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& t = eq.inputs[i];
    int letters = static_cast<int>(std::count_if(t.begin(), t.end(), [](int l) { return l >= 0; }));
    bool has_ell = letters != static_cast<int>(t.size());
    int rank = static_cast<int>(c.in(i).ndim());
    if (rank < letters || (!has_ell && rank != letters))
      c.fail("operand " + std::to_string(i) + " has rank " + std::to_string(rank) +
             ", its term has " + std::to_string(letters) + " labels");
    if (has_ell) n_ell = std::max(n_ell, rank - letters);
  }

  // Expand each term to one label per axis and take diagonals of repeated labels.
  std::vector<Operand> ops;
  std::map<int, int> count;  // label -> number of uses over all terms (for the implicit output)
  for (size_t i = 0; i < n; ++i) {
    mx::array a = c.in(i);
    if (a.dtype() != dtype) c.fail("operands have different dtypes");
    if (up) a = mx::astype(a, mx::float32, c.s);
    const int rank = static_cast<int>(a.ndim());
    std::vector<int> labels;
    for (int l : eq.inputs[i]) {
      if (l != kEllipsis) { labels.push_back(l); ++count[l]; continue; }
      int k = rank - static_cast<int>(eq.inputs[i].size()) + 1;  // dims under this ellipsis
      for (int j = 0; j < k; ++j) labels.push_back(kLetters + n_ell - k + j);
    }
    // Diagonal of the first repeated pair, until the labels are unique.
    auto repeated = [&labels]() -> std::pair<int, int> {
      for (size_t p = 0; p < labels.size(); ++p)
        for (size_t q = p + 1; q < labels.size(); ++q)
          if (labels[p] == labels[q]) return {static_cast<int>(p), static_cast<int>(q)};
      return {-1, -1};
    };
    for (auto [p, q] = repeated(); p >= 0; std::tie(p, q) = repeated()) {
      if (a.shape(p) != a.shape(q))
        c.fail("repeated label with different dims in operand " + std::to_string(i));
      a = mx::diagonal(a, 0, p, q, c.s);  // removes axes p and q, appends the diagonal
      int l = labels[p];
      labels.erase(labels.begin() + q);
      labels.erase(labels.begin() + p);
      labels.push_back(l);
    }
    ops.push_back({a, labels});
  }

  std::vector<int> out_labels;
  for (int j = 0; j < n_ell; ++j) out_labels.push_back(kLetters + j);
  if (eq.explicit_output) {
    out_labels.clear();
    bool had_ell = false;
    for (int l : eq.output) {
      if (l == kEllipsis) {
        had_ell = true;
        for (int j = 0; j < n_ell; ++j) out_labels.push_back(kLetters + j);
      } else {
        if (!count.count(l)) c.fail("output label does not appear in any input");
        out_labels.push_back(l);
      }
    }
    if (!had_ell && n_ell > 0) c.fail("ellipsis dims are missing from the output");
    std::set<int> uniq(out_labels.begin(), out_labels.end());
    if (uniq.size() != out_labels.size()) c.fail("repeated label in the output");
  } else {
    for (auto [l, k] : count)  // std::map: sorted by id = ASCII order
      if (k == 1) out_labels.push_back(l);
  }

  // Broadcast sizes per label (size-1 dims stretch, like numpy).
  std::map<int, int> size;
  for (const auto& op : ops)
    for (size_t k = 0; k < op.labels.size(); ++k) {
      int d = op.a.shape(static_cast<int>(k));
      auto [it, fresh] = size.emplace(op.labels[k], d);
      if (fresh || d == 1) continue;
      if (it->second == 1) it->second = d;
      else if (it->second != d) c.fail("label dims do not match across operands");
    }

  // Labels needed by the output or another operand stay; the rest sum out right away.
  const std::set<int> out_set(out_labels.begin(), out_labels.end());
  for (size_t i = 0; i < ops.size(); ++i) {
    std::set<int> keep = out_set;
    for (size_t j = 0; j < ops.size(); ++j)
      if (j != i) keep.insert(ops[j].labels.begin(), ops[j].labels.end());
    sum_out(ops[i], keep, c.s);
  }

  mx::array result = mx::array(0);
  if (mx::issubdtype(ops[0].a.dtype(), mx::floating)) {
    // A plain equation (unique labels, no ellipsis) for MLX, with size-1 dims broadcast.
    std::map<int, char> letter;
    for (const auto& op : ops)
      for (int l : op.labels)
        if (!letter.count(l)) {
          int k = static_cast<int>(letter.size());
          if (k >= kLetters) c.fail("too many distinct labels for MLX's einsum");
          letter[l] = static_cast<char>(k < 26 ? 'a' + k : 'A' + (k - 26));
        }
    std::string plain;
    std::vector<mx::array> arrays;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (i) plain += ',';
      mx::Shape target;
      for (int l : ops[i].labels) {
        plain += letter[l];
        target.push_back(size[l]);
      }
      arrays.push_back(mx::broadcast_to(ops[i].a, target, c.s));
    }
    plain += "->";
    for (int l : out_labels) plain += letter[l];
    result = mx::einsum(plain, arrays, c.s);
  } else {
    // Pairwise broadcast multiply, summing out each label once no later operand needs it.
    Operand acc = ops[0];
    for (size_t i = 1; i < ops.size(); ++i) {
      std::vector<int> order = acc.labels;
      for (int l : ops[i].labels)
        if (std::find(order.begin(), order.end(), l) == order.end()) order.push_back(l);
      acc = {mx::multiply(align(acc, order, c.s), align(ops[i], order, c.s), c.s), order};
      std::set<int> keep = out_set;
      for (size_t j = i + 1; j < ops.size(); ++j)
        keep.insert(ops[j].labels.begin(), ops[j].labels.end());
      sum_out(acc, keep, c.s);
    }
    mx::Shape target;
    for (int l : out_labels) target.push_back(size[l]);
    result = mx::broadcast_to(align(acc, out_labels, c.s), target, c.s);
  }
  return {mx::astype(result, dtype, c.s)};
}

Support check_einsum(const NodeQuery& q) {
  Equation eq;
  if (auto e = parse_equation(q.node.attr_string("equation", ""), eq); !e.empty())
    return Support::no("equation: " + e);
  if (eq.inputs.size() != q.num_inputs()) return Support::no("equation/operand count mismatch");
  for (size_t i = 0; i < q.num_inputs(); ++i)
    if (auto s = numeric_input(q, i); !s) return s;
  return Support::yes();
}

// Det: MLX's LU factorisation runs on the CPU only, in float32/float64. The determinant is the
// product of U's diagonal, negated for an odd number of row swaps, from mx::linalg::lu_factor:
// MLX's own linalg::det returns float64 results only float32-accurate (relative errors up to
// ~5e-7 on random 5x5 matrices), while its float64 LU is exact to float64 rounding.
Outputs translate_det(OpContext& c) {
  mx::array x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2 || x.shape(-1) != x.shape(-2)) c.fail("input must be [*, M, M]");
  const auto dtype = x.dtype();
  if (dtype != mx::float32 && dtype != mx::float64) x = mx::astype(x, mx::float32, c.s);
  const int n = x.shape(-1);
  if (n == 0) return {mx::astype(mx::ones(mx::Shape(x.shape().begin(), x.shape().end() - 2), x.dtype(), c.s), dtype, c.s)};
  auto [lu, pivots] = mx::linalg::lu_factor(x, c.s);
  auto det = mx::prod(mx::diagonal(lu, 0, -2, -1, c.s), -1, false, c.s);
  // LAPACK's pivots: row i was swapped with row pivots[i] (i itself when none).
  auto swaps = mx::sum(mx::not_equal(mx::astype(pivots, mx::int32, c.s), mx::arange(n, mx::int32, c.s), c.s),
                       -1, false, c.s);
  auto odd = mx::equal(mx::remainder(swaps, mx::array(2, swaps.dtype()), c.s), mx::array(1, swaps.dtype()), c.s);
  det = mx::where(odd, mx::negative(det, c.s), det, c.s);
  return {mx::astype(det, dtype, c.s)};
}

Support check_det(const NodeQuery& q) {
  if (q.gpu) return Support::no("MLX's LU factorisation (Det) runs on the CPU only");
  return float_input(q, 0);
}

const OpEntry kOps[] = {
    {"", "Einsum", 12, kAnyOpset, check_einsum, translate_einsum,
     "floats via mx::einsum; integers by broadcast multiply + sum"},
    {"", "Det", 11, kAnyOpset, check_det, translate_det, "CPU only (MLX's LU)"},
};

}  // namespace

std::span<const OpEntry> math_ops() { return kOps; }

}  // namespace ortmlx::ops
