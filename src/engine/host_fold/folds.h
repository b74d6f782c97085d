// The host folder's values and its folds by op family (engine/host_fold/): internal to
// host_fold.cc, which dispatches to them (see host_fold.h, and host_fold.cc for the semantics).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <mlx/mlx.h>

#include "engine/host_fold/host_fold.h"
#include "graph/view.h"

namespace ortmlx::ops::host_fold {

using Dims = std::vector<int64_t>;

// A small tensor's values as int64 (every covered dtype fits), its shape and its dtype.
struct Ints {
  std::vector<int64_t> v;
  Dims shape;
  mx::Dtype dtype = mx::int64;
};
using In = std::vector<std::optional<Ints>>;
using Folded = std::optional<Ints>;
using FoldFn = Folded (*)(const graph::Node&, const In&);

// ---- values (values.cc) ----
bool is_float(mx::Dtype t);
bool covered(mx::Dtype t);  // the dtypes folded at all
int64_t numel(const Dims& d);
bool exact_in(int64_t x, mx::Dtype t);
std::optional<int64_t> float_as_integer(double x);
std::optional<Ints> read(const mx::array& a);
int64_t wrap(int64_t x, mx::Dtype t);
mx::array to_array(Ints h);
bool int_param(const std::optional<Ints>& h);
std::optional<int64_t> axis_in(int64_t a, int64_t rank);
bool scalar_like(const Ints& h);
std::optional<Dims> broadcast(const std::vector<const Dims*>& shapes);
std::vector<int64_t> spread(const Ints& a, const Dims& out);
Folded elementwise(const std::vector<const Ints*>& xs, mx::Dtype out_dtype,
                   const std::function<std::optional<int64_t>(const std::vector<int64_t>&)>& f);

inline bool is_bool(const Ints& h) { return h.dtype == mx::bool_; }
inline bool is_signed(const Ints& h) { return mx::issubdtype(h.dtype, mx::signedinteger); }

// Wrapping integer arithmetic without signed-overflow UB (wrap() then narrows to the dtype).
inline int64_t add_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
inline int64_t sub_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
inline int64_t mul_w(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }

// ---- elementwise folds (elementwise.cc) ----
Folded arithmetic(const graph::Node& n, const In& in);  // Add Sub Mul Div
Folded min_max(const graph::Node& n, const In& in);
Folded compare(const graph::Node& n, const In& in);
Folded logical(const graph::Node& n, const In& in);
Folded unary(const graph::Node& n, const In& in);  // Neg Abs
Folded where(const graph::Node& n, const In& in);
Folded cast(const graph::Node& n, const In& in);

// ---- layout and generator folds (layout.cc) ----
Folded identity(const graph::Node& n, const In& in);
Folded unsqueeze(const graph::Node& n, const In& in);
Folded squeeze(const graph::Node& n, const In& in);
Folded reshape(const graph::Node& n, const In& in);
Folded gather(const graph::Node& n, const In& in);
Folded concat(const graph::Node& n, const In& in);
Folded slice(const graph::Node& n, const In& in);
Folded reduce_sum(const graph::Node& n, const In& in);
Folded range(const graph::Node& n, const In& in);
Folded expand(const graph::Node& n, const In& in);
Folded constant_of_shape(const graph::Node& n, const In& in);

}  // namespace ortmlx::ops::host_fold
