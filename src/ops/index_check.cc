// OpContext::checked_indices: out-of-range indices fail the run, checked where it costs nothing.
#include <algorithm>
#include <string>

#include "ops/op_context.h"

namespace ortmlx::ops {

namespace {

std::string range_str(int64_t d, bool negative) {
  return "[" + std::to_string(negative ? -d : 0) + "," + std::to_string(d - 1) + "]";
}

// Host data of `a` when reading it costs no evaluation (no sync).
bool on_host(const mx::array& a) { return a.is_available() && a.flags().row_contiguous; }

}  // namespace

mx::array OpContext::checked_indices(const mx::array& idx, const std::vector<int64_t>& dims,
                                     bool negative, const std::string& what, int input) const {
  if (dims.empty() || idx.size() == 0) return idx;
  const bool last_axis = dims.size() > 1;
  auto bound_array = [&](mx::Dtype t) {
    if (!last_axis) return mx::array(dims[0], t);
    return mx::astype(mx::array(dims.begin(), {static_cast<int>(dims.size())}, mx::int64), t, s);
  };
  auto clipped = [&] {
    const auto t = idx.dtype();
    const auto hi = mx::subtract(bound_array(t), mx::array(1, t), s);
    const auto lo = negative ? mx::negative(bound_array(t), s) : mx::zeros_like(hi, s);
    return mx::clip(idx, lo, hi, s);
  };
  if (hooks_ && !hooks_->index_checks) return clipped();
  std::optional<mx::array> host;
  if (on_host(idx)) host = idx;
  if (!host && input >= 0 && hooks_ && hooks_->constant_value) host = hooks_->constant_value(input);
  if (!host && (!hooks_ || hooks_->index_diagnose || !hooks_->index_flag)) {
    // Without an engine (unit tests), or diagnosing a failed run: read it now.
    mx::array a = mx::contiguous(idx, false, s);
    a.eval();
    host = a;
  }
  if (host) {
    if (!on_host(*host)) {
      *host = mx::contiguous(*host, false, s);
      host->eval();
    }
    const auto v = evaluated_ints(*host);
    for (size_t e = 0; e < v.size(); ++e) {
      const int64_t d = dims[e % dims.size()];
      if (v[e] >= d || v[e] < (negative ? -d : 0))
        fail("indices element out of data bounds: " + what + "[" + std::to_string(e) +
             "] = " + std::to_string(v[e]) + " must be within the inclusive range " +
             range_str(d, negative));
    }
    return idx;
  }
  const auto t = idx.dtype();
  const auto b = bound_array(t);
  auto bad = mx::greater_equal(idx, b, s);
  if (negative || mx::issubdtype(t, mx::signedinteger))
    bad = mx::logical_or(bad, mx::less(idx, negative ? mx::negative(b, s) : mx::array(0, t), s), s);
  hooks_->index_flag(mx::any(bad, s));
  return clipped();
}

}  // namespace ortmlx::ops
