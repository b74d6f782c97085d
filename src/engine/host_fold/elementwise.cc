// Elementwise folds (folds.h): arithmetic, Min/Max, comparisons, logic, Neg/Abs, Where, Cast.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>

#include "engine/host_fold/folds.h"
#include "ops/op_context.h"

namespace ortmlx::ops::host_fold {

Folded arithmetic(const graph::Node& n, const In& in) {
  const Ints &a = *in[0], &b = *in[1];
  if (a.dtype != b.dtype || is_bool(a)) return std::nullopt;
  const std::string_view op = n.op_type;
  const mx::Dtype t = a.dtype;
  // Narrow dtypes compute in int64 and wrap; for Div the operands are already in range, so
  // truncation in int64 equals truncation in the narrow type (except MIN / -1, refused).
  if (is_float(t))  // exact integer results only (see the top of the file)
    return elementwise({&a, &b}, t, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
      int64_t y = 0;
      bool inexact = false;  // an int64 overflow, or a quotient with a fraction
      if (op == "Add") inexact = __builtin_add_overflow(x[0], x[1], &y);
      else if (op == "Sub") inexact = __builtin_sub_overflow(x[0], x[1], &y);
      else if (op == "Mul") inexact = __builtin_mul_overflow(x[0], x[1], &y);
      else if (x[1] == 0 || x[0] % x[1] != 0) inexact = true;  // Div
      else y = x[0] / x[1];
      if (inexact) return std::nullopt;
      // x + (-x) and x - x are +0 in IEEE arithmetic; a zero product or quotient with a
      // negative operand is -0, which an integer cannot hold.
      if (y == 0 && (op == "Mul" || op == "Div") && (x[0] < 0 || x[1] < 0)) return std::nullopt;
      return y;
    });
  return elementwise({&a, &b}, t, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "Add") return add_w(x[0], x[1]);
    if (op == "Sub") return sub_w(x[0], x[1]);
    if (op == "Mul") return mul_w(x[0], x[1]);
    if (x[1] == 0 || (x[1] == -1 && x[0] == INT64_MIN)) return std::nullopt;  // Div
    return x[0] / x[1];
  });
}

Folded min_max(const graph::Node& n, const In& in) {
  std::vector<const Ints*> xs;
  for (const auto& x : in) {
    if (!x || x->dtype != in[0]->dtype || is_bool(*x)) return std::nullopt;
    xs.push_back(&*x);
  }
  if (xs.empty()) return std::nullopt;
  const bool is_max = n.op_type == "Max";
  return elementwise(xs, xs[0]->dtype, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    return is_max ? *std::max_element(x.begin(), x.end()) : *std::min_element(x.begin(), x.end());
  });
}

Folded compare(const graph::Node& n, const In& in) {
  const Ints &a = *in[0], &b = *in[1];
  if (a.dtype != b.dtype) return std::nullopt;
  const std::string_view op = n.op_type;
  if (is_bool(a) && op != "Equal") return std::nullopt;
  return elementwise({&a, &b}, mx::bool_, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "Equal") return x[0] == x[1];
    if (op == "Less") return x[0] < x[1];
    if (op == "Greater") return x[0] > x[1];
    if (op == "LessOrEqual") return x[0] <= x[1];
    return x[0] >= x[1];  // GreaterOrEqual
  });
}

Folded logical(const graph::Node& n, const In& in) {
  const std::string_view op = n.op_type;
  if (op == "Not") {
    if (!is_bool(*in[0])) return std::nullopt;
    return elementwise({&*in[0]}, mx::bool_, [](const std::vector<int64_t>& x) -> std::optional<int64_t> { return !x[0]; });
  }
  const Ints &a = *in[0], &b = *in[1];
  if (!is_bool(a) || !is_bool(b)) return std::nullopt;
  return elementwise({&a, &b}, mx::bool_, [&](const std::vector<int64_t>& x) -> std::optional<int64_t> {
    if (op == "And") return x[0] && x[1];
    if (op == "Or") return x[0] || x[1];
    return x[0] != x[1];  // Xor
  });
}

Folded unary(const graph::Node& n, const In& in) {
  const Ints& a = *in[0];
  if (is_bool(a)) return std::nullopt;
  if (n.op_type == "Neg") {
    if (is_float(a.dtype))  // -0 is refused (see Mul)
      return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> {
        if (x[0] == 0) return std::nullopt;
        return -x[0];
      });
    if (!is_signed(a)) return std::nullopt;
    return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> { return sub_w(0, x[0]); });
  }
  return elementwise({&a}, a.dtype, [](const std::vector<int64_t>& x) -> std::optional<int64_t> {  // Abs
    return x[0] < 0 ? sub_w(0, x[0]) : x[0];
  });
}

Folded where(const graph::Node&, const In& in) {
  const Ints &c = *in[0], &x = *in[1], &y = *in[2];
  if (!is_bool(c) || x.dtype != y.dtype) return std::nullopt;
  return elementwise({&c, &x, &y}, x.dtype, [](const std::vector<int64_t>& v) -> std::optional<int64_t> {
    return v[0] ? v[1] : v[2];
  });
}

Folded cast(const graph::Node& n, const In& in) {
  auto to = to_mlx_dtype(static_cast<graph::DType>(n.attr_int("to", 0)));
  if (!to || !covered(*to)) return std::nullopt;
  Ints r = *in[0];
  const bool from_float = is_float(r.dtype);
  r.dtype = *to;
  for (auto& x : r.v) {
    if (is_float(*to)) {
      if (!exact_in(x, *to)) return std::nullopt;  // the cast would round
    } else if (from_float && *to != mx::bool_ && wrap(x, *to) != x) {
      return std::nullopt;  // out of the integer type's range: no defined result
    } else {
      x = wrap(x, *to);
    }
  }
  return r;
}

}  // namespace ortmlx::ops::host_fold
