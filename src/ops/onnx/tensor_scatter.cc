// TensorScatter (opset 24): the KV-cache write. For every batch row b, `update`'s S entries
// along `axis` are written into `past_cache` starting at write_indices[b] (0 when absent);
// mode "circular" wraps positions modulo the cache length.
//
// write_indices changes at every decode step, so it stays graph data (a host read would make
// each step a new compiled signature). Instead of a scatter (MLX's scatter does no bounds
// checking, and these indices are run-time data), every cache position p *gathers* its source:
// i = p - write_indices[b] (mod the cache length for circular); positions with 0 <= i < S take
// update[..., i, ...], the rest keep the past value. A negative write index, and in linear mode
// a write past the cache end, fail the run (as on ORT's CPU EP).
#include <string>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

Support check_tensor_scatter(const NodeQuery& q) {
  auto mode = q.node.attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular")
    return Support::no("TensorScatter mode '" + mode + "' (linear and circular exist)");
  if (auto r = input_dtype_in(q, 2, {DType::Int64}); !r) return r;
  int rank = q.input_rank(0);
  if (rank >= 0) {
    if (rank < 2) return Support::no("past_cache must have rank >= 2 (batch + sequence)");
    int64_t axis = q.node.attr_int("axis", -2);
    if (axis < -rank || axis >= rank) return Support::no("axis is out of range");
    if (axis == 0 || axis == -rank) return Support::no("axis cannot be the batch axis 0");
  }
  return Support::yes();
}

Outputs translate_tensor_scatter(OpContext& c) {
  const mx::array& past = c.in(0);
  const mx::array& upd = c.in(1);
  const int rank = static_cast<int>(past.ndim());
  const int axis = norm_axis(c.node.attr_int("axis", -2), rank);
  if (axis == 0) c.fail("axis cannot be the batch axis 0");
  if (static_cast<int>(upd.ndim()) != rank) c.fail("update must have past_cache's rank");
  for (int d = 0; d < rank; ++d)
    if (d != axis && upd.shape(d) != past.shape(d))
      c.fail("update and past_cache differ in dim " + std::to_string(d));
  const int len = past.shape(axis), n = upd.shape(axis), batch = past.shape(0);
  if (n > len) c.fail("update is longer than the cache along axis");
  if (n == 0 || past.size() == 0) return {past};

  // Shapes that broadcast along (batch, axis) only.
  mx::Shape pos_shape(rank, 1), wi_shape(rank, 1);
  pos_shape[axis] = len;
  wi_shape[0] = batch;
  auto pos = mx::reshape(mx::arange(len, mx::int64, c.s), pos_shape, c.s);
  if (c.has(2) && c.in(2).size() != static_cast<size_t>(batch))
    c.fail("write_indices must have one entry per batch row");
  const bool circular = c.node.attr_string("mode", "linear") == "circular";
  auto wi = c.has(2) ? mx::reshape(mx::astype(c.checked_indices(c.in(2), {circular ? len : len - n + 1},
                                                                false, "write_indices", 2),
                                              mx::int64, c.s), wi_shape, c.s)
                     : mx::zeros(wi_shape, mx::int64, c.s);
  auto i = mx::subtract(pos, wi, c.s);
  if (circular) {
    // Positive remainder whatever the sign convention of the integer remainder.
    auto m = mx::array(static_cast<int64_t>(len));
    i = mx::remainder(mx::add(mx::remainder(i, m, c.s), m, c.s), m, c.s);
  }
  auto valid = mx::logical_and(mx::greater_equal(i, mx::array(int64_t{0}), c.s),
                               mx::less(i, mx::array(static_cast<int64_t>(n)), c.s), c.s);
  auto src = mx::astype(mx::clip(i, mx::array(int64_t{0}), mx::array(static_cast<int64_t>(n - 1)),
                                 c.s),
                        mx::int32, c.s);
  mx::Shape gather_shape = upd.shape();
  gather_shape[axis] = len;
  auto taken = mx::take_along_axis(upd, mx::broadcast_to(src, gather_shape, c.s), axis, c.s);
  return {mx::where(valid, taken, past, c.s)};
}

const OpEntry kOps[] = {
    {"", "TensorScatter", 24, kAnyOpset, check_tensor_scatter, translate_tensor_scatter,
     "out-of-range write_indices fail the run"},
};

}  // namespace

std::span<const OpEntry> tensor_scatter_ops() { return kOps; }

}  // namespace ortmlx::ops
