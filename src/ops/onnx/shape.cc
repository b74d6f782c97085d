// Shape and layout ops: Reshape, Transpose, Concat, Split, (Un)Squeeze, Flatten, Expand, Tile,
// Pad, CenterCropPad, Identity, Depth/SpaceToDepth, Trilu, Dropout (inference).
// Shape parameters (Reshape's shape, Split's sizes, axes, pads, ...) are read on the host with
// ctx.host_ints: ONNX gives them as int64 tensors, MLX wants int32 Shapes (to_shape checks).
// The generators (Shape, Size, Cast, Constant, ConstantOfShape, Range, EyeLike) are in
// shape_gen.cc and appended to this family's table.
#include <algorithm>
#include <climits>
#include <numeric>
#include <vector>

#include "graph/fuse_conv_activation.h"
#include "kernels/cpu/kernels.h"
#include "ops/common.h"
#include "ops/switches.h"

namespace ortmlx::ops {

std::span<const OpEntry> shape_gen_ops();  // shape_gen.cc

namespace {

int rank_of(const mx::array& a) { return static_cast<int>(a.ndim()); }

// Axes from the attribute `name` (before opset `input_since`) or from input `i` (from then on).
std::optional<std::vector<int64_t>> axes_param(OpContext& c, int input_since, size_t i,
                                               const char* name = "axes") {
  if (c.node.since_version >= input_since) {
    if (!c.has(i)) return std::nullopt;
    return c.host_ints(i);
  }
  if (!c.node.has_attr(name)) return std::nullopt;
  return c.node.attr_ints(name);
}

// ---- Reshape ----------------------------------------------------------------------------------

// 0 copies the input dim (unless allowzero=1, where it is a real 0), -1 is inferred.
Outputs translate_reshape(OpContext& c) {
  const auto& x = c.in(0);
  auto req = c.node.since_version < 5 ? c.node.attr_ints("shape") : c.host_ints(1);
  bool allowzero = c.node.attr_int("allowzero", 0) != 0;
  std::vector<int64_t> out(req.size());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t v = req[i];
    if (v == -1) {
      if (infer >= 0) c.fail("more than one -1 in the target shape");
      infer = static_cast<int>(i);
      continue;
    }
    if (v == 0 && !allowzero) {
      if (i >= static_cast<size_t>(rank_of(x))) c.fail("0 in the target shape past the input rank");
      v = x.shape(static_cast<int>(i));
    }
    if (v < 0) c.fail("invalid dim " + std::to_string(v) + " in the target shape");
    out[i] = v;
    known *= v;
  }
  int64_t total = static_cast<int64_t>(x.size());
  if (infer >= 0) {
    if (known == 0 || total % known != 0) c.fail("cannot infer the -1 dim");
    out[infer] = total / known;
  } else if (known != total) {
    c.fail("target shape has " + std::to_string(known) + " elements, input has " +
           std::to_string(total));
  }
  return {mx::reshape(x, to_shape(out), c.s)};
}

Support check_reshape(const NodeQuery& q) {
  if (q.node.since_version < 5 && !q.node.has_attr("shape"))
    return Support::no("Reshape-1 without a shape attribute");
  return Support::yes();
}

// ---- Transpose, Concat, Split ------------------------------------------------------------------

Outputs translate_transpose(OpContext& c) {
  const auto& x = c.in(0);
  if (!c.node.has_attr("perm")) return {mx::transpose(x, c.s)};  // default: reverse the dims
  auto perm = to_axes(c.node.attr_ints("perm"), rank_of(x));
  if (static_cast<int>(perm.size()) != rank_of(x)) c.fail("perm length differs from the rank");
  return {mx::transpose(x, perm, c.s)};
}

Outputs translate_concat(OpContext& c) {
  std::vector<mx::array> xs;
  for (size_t i = 0; i < c.num_inputs(); ++i)
    if (c.has(i)) xs.push_back(c.in(i));
  if (xs.empty()) c.fail("no inputs");
  int axis = norm_axis(c.node.attr_int("axis", 1), xs[0].ndim());
  // Convolutions whose outputs only this reads, in 16-channel blocks: computed into it.
  if (c.node.attr_int(graph::kConcatOfConvs, 0) == 1 && translation_switches().cpu_concat_convs)
    if (auto y = cpu_dnnl_convs_concat(xs, axis, c.s)) return {*y};
  return {concat_nonempty(std::move(xs), axis, c.s)};
}

// Sizes from the `split` input (opset 13+) or attribute (< 13); otherwise equal parts. Opset 18's
// num_outputs allows an uneven split: ceil(dim / n) per part and a smaller last part.
Outputs translate_split(OpContext& c) {
  const auto& x = c.in(0);
  int axis = norm_axis(c.node.attr_int("axis", 0), rank_of(x));
  int64_t dim = x.shape(axis);
  const size_t n_out = c.node.outputs.size();
  // An empty `split` means "not given" (ORT treats it so): equal parts.
  std::vector<int64_t> sizes;
  if (c.has(1)) {
    sizes = c.host_ints(1);
  } else if (c.node.since_version < 13 && c.node.has_attr("split")) {
    sizes = c.node.attr_ints("split");
  }
  if (sizes.empty()) {
    int64_t n = static_cast<int64_t>(n_out);
    if (c.node.since_version >= 18 && c.node.has_attr("num_outputs"))
      n = c.node.attr_int("num_outputs", n);
    if (n != static_cast<int64_t>(n_out) || n <= 0) c.fail("num_outputs differs from the outputs");
    int64_t chunk = (dim + n - 1) / n;
    if (c.node.since_version < 18 && dim % n != 0)
      c.fail("dim " + std::to_string(dim) + " does not split evenly into " + std::to_string(n));
    sizes.assign(n_out, chunk);
    sizes.back() = dim - chunk * (n - 1);
    if (sizes.back() < 0) c.fail("num_outputs leaves an empty tail past the end");
  }
  if (sizes.size() != n_out) c.fail("split has " + std::to_string(sizes.size()) + " sizes for " +
                                    std::to_string(n_out) + " outputs");
  Outputs outs;
  // Along the last axis of rows at hand flat (rows_source): slices of those, shaped back.
  const auto rows = axis == rank_of(x) - 1 && rank_of(x) > 2 ? rows_source(x) : std::nullopt;
  mx::Shape start(rank_of(x), 0), stop = x.shape();
  int64_t at = 0;
  for (auto sz : sizes) {
    if (sz < 0 || at + sz > dim) c.fail("split sizes do not add up to the axis length");
    const int lo = static_cast<int>(at), hi = static_cast<int>(at + sz);
    if (rows) {
      outs.push_back(rows_to(mx::slice(*rows, {0, lo}, {rows->shape(0), hi}, c.s), x, c.s));
    } else {
      start[axis] = lo;
      stop[axis] = hi;
      outs.push_back(mx::slice(x, start, stop, c.s));
    }
    at += sz;
  }
  if (at != dim) c.fail("split sizes do not add up to the axis length");
  return outs;
}

// ---- Unsqueeze, Squeeze, Flatten ---------------------------------------------------------------

// Axes count in the output rank (r + len(axes)).
Outputs translate_unsqueeze(OpContext& c) {
  const auto& x = c.in(0);
  auto axes = axes_param(c, 13, 1);
  if (!axes) c.fail("axes are missing");
  int out_rank = rank_of(x) + static_cast<int>(axes->size());
  std::vector<bool> is_new(out_rank, false);
  for (auto a : *axes) {
    int k = norm_axis(a, out_rank);
    if (is_new[k]) c.fail("duplicate axis " + std::to_string(a));
    is_new[k] = true;
  }
  mx::Shape out;
  int src = 0;
  for (int k = 0; k < out_rank; ++k) out.push_back(is_new[k] ? 1 : x.shape(src++));
  return {mx::reshape(x, out, c.s)};
}

// No axes (or an empty axes tensor, as ORT reads it): drop every dim of size 1. ONNX rejects
// squeezing a dim that is not 1.
Outputs translate_squeeze(OpContext& c) {
  const auto& x = c.in(0);
  auto axes = axes_param(c, 13, 1);
  std::vector<bool> drop(rank_of(x), false);
  if (!axes || axes->empty()) {
    for (int k = 0; k < rank_of(x); ++k) drop[k] = x.shape(k) == 1;
  } else {
    for (auto a : *axes) {
      int k = norm_axis(a, rank_of(x));
      if (x.shape(k) != 1) c.fail("axis " + std::to_string(a) + " has size " +
                                  std::to_string(x.shape(k)) + ", not 1");
      drop[k] = true;
    }
  }
  mx::Shape out;
  for (int k = 0; k < rank_of(x); ++k)
    if (!drop[k]) out.push_back(x.shape(k));
  return {mx::reshape(x, out, c.s)};
}

// 2-D result: (prod(d[:axis]), prod(d[axis:])); axis may equal the rank.
Outputs translate_flatten(OpContext& c) {
  const auto& x = c.in(0);
  int r = rank_of(x);
  int64_t axis = c.node.attr_int("axis", 1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) c.fail("axis out of range");
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < r; ++k) (k < axis ? outer : inner) *= x.shape(k);
  return {mx::reshape(x, to_shape({outer, inner}), c.s)};
}

// ---- Expand, Tile ------------------------------------------------------------------------------

// Bidirectional (numpy) broadcast of the input with `shape`; either side may have lower rank.
Outputs translate_expand(OpContext& c) {
  const auto& x = c.in(0);
  auto shape = c.host_ints(1);
  for (auto d : shape)
    if (d < 0) c.fail("shape has a negative dimension (" + std::to_string(d) + ")");
  int r = std::max<int>(rank_of(x), static_cast<int>(shape.size()));
  std::vector<int64_t> out(r);
  for (int k = 0; k < r; ++k) {
    int xi = k - (r - rank_of(x)), si = k - (r - static_cast<int>(shape.size()));
    int64_t a = xi >= 0 ? x.shape(xi) : 1, b = si >= 0 ? shape[si] : 1;
    if (a != b && a != 1 && b != 1)
      c.fail("shape " + std::to_string(b) + " does not broadcast with dim " + std::to_string(a));
    out[k] = a == 1 ? b : a;
  }
  return {mx::broadcast_to(x, to_shape(out), c.s)};
}

Outputs translate_tile(OpContext& c) {
  const auto& x = c.in(0);
  auto reps = c.host_ints(1);
  if (static_cast<int>(reps.size()) != rank_of(x)) c.fail("repeats length differs from the rank");
  if (rank_of(x) == 0) return {x};
  auto r = to_shape(reps);
  return {mx::tile(x, std::vector<int>(r.begin(), r.end()), c.s)};
}

// ---- Pad, CenterCropPad ------------------------------------------------------------------------

// Source index of each output position along an axis of length n padded by lo/hi (>= 0) for
// the index-based modes. reflect mirrors without repeating the edge (numpy 'reflect').
std::vector<int32_t> pad_indices(const std::string& mode, int64_t n, int64_t lo, int64_t hi) {
  std::vector<int32_t> idx(n + lo + hi);
  for (int64_t o = 0; o < static_cast<int64_t>(idx.size()); ++o) {
    int64_t i = o - lo, v;
    if (mode == "edge") {
      v = std::clamp<int64_t>(i, 0, n - 1);
    } else if (mode == "wrap") {
      v = ((i % n) + n) % n;
    } else {  // reflect
      int64_t p = 2 * (n - 1);
      if (p == 0) {
        v = 0;
      } else {
        int64_t m = ((i % p) + p) % p;
        v = m < n ? m : p - m;
      }
    }
    idx[o] = static_cast<int32_t>(v);
  }
  return idx;
}

// Negative pads crop. Cropping happens first, so reflect/edge/wrap read the cropped tensor
// (what ORT does). constant uses mx::pad; the other modes gather with host-built indices.
mx::array pad_array(OpContext& c, mx::array x, std::vector<int64_t> lo, std::vector<int64_t> hi,
                    const std::string& mode, const std::optional<mx::array>& value) {
  const int r = rank_of(x);
  bool crop = false, grow = false;
  for (int k = 0; k < r; ++k) {
    crop |= lo[k] < 0 || hi[k] < 0;
    grow |= lo[k] > 0 || hi[k] > 0;
  }
  if (crop) {
    mx::Shape start(r, 0), stop = x.shape();
    for (int k = 0; k < r; ++k) {
      int64_t s = std::max<int64_t>(-lo[k], 0), e = x.shape(k) + std::min<int64_t>(hi[k], 0);
      if (e < s) c.fail("negative pads remove more than the whole axis");
      start[k] = static_cast<int>(s);
      stop[k] = static_cast<int>(e);
      lo[k] = std::max<int64_t>(lo[k], 0);
      hi[k] = std::max<int64_t>(hi[k], 0);
    }
    x = mx::slice(x, start, stop, c.s);
  }
  if (!grow) return x;
  if (mode == "constant") {
    std::vector<int> axes(r);
    std::iota(axes.begin(), axes.end(), 0);
    mx::Shape l = to_shape(lo), h = to_shape(hi);
    mx::array v = value ? *value : mx::array(0, x.dtype());
    return mx::pad(x, axes, l, h, v, "constant", c.s);
  }
  for (int k = 0; k < r; ++k) {
    if (lo[k] == 0 && hi[k] == 0) continue;
    int64_t n = x.shape(k);
    if (n == 0) c.fail("cannot " + mode + "-pad an empty axis");
    auto idx = pad_indices(mode, n, lo[k], hi[k]);
    mx::array ia(idx.begin(), {static_cast<int>(idx.size())}, mx::int32);
    x = mx::take(x, ia, k, c.s);
  }
  return x;
}

// pads: attribute before opset 11 ('paddings' in opset 1), then input 1 laid out
// [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over all axes or over input 3's axes (18+).
Outputs translate_pad(OpContext& c) {
  const auto& x = c.in(0);
  const int r = rank_of(x);
  const int v = c.node.since_version;
  std::string mode = c.node.attr_string("mode", "constant");
  std::vector<int64_t> pads;
  std::vector<int> axes;
  std::optional<mx::array> value;
  if (v < 11) {
    pads = c.node.attr_ints(v < 2 ? "paddings" : "pads");
    value = mx::array(c.node.attr_float("value", 0.f), x.dtype());
  } else {
    pads = c.host_ints(1);
    if (c.has(2)) {
      const auto& cv = c.in(2);
      if (cv.size() != 1) c.fail("constant_value must hold one element");
      value = mx::astype(mx::reshape(cv, {}, c.s), x.dtype(), c.s);
    }
    if (v >= 18 && c.has(3)) axes = to_axes(c.host_ints(3), r);
  }
  if (axes.empty() && !(v >= 18 && c.has(3))) {
    axes.resize(r);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (pads.size() != 2 * axes.size())
    c.fail("pads has " + std::to_string(pads.size()) + " values for " +
           std::to_string(axes.size()) + " axes");
  std::vector<int64_t> lo(r, 0), hi(r, 0);
  std::vector<bool> seen(r, false);
  for (size_t k = 0; k < axes.size(); ++k) {
    if (seen[axes[k]]) c.fail("duplicate axis in axes");
    seen[axes[k]] = true;
    lo[axes[k]] = pads[k];
    hi[axes[k]] = pads[k + axes.size()];
  }
  return {pad_array(c, x, lo, hi, mode, value)};
}

Support check_pad(const NodeQuery& q) {
  auto mode = q.node.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" &&
      !(mode == "wrap" && q.node.since_version >= 19))
    return Support::no("Pad mode '" + mode + "' is not supported");
  return Support::yes();
}

// Crops (centred, the extra element on the high side) or zero-pads each axis to `shape`.
Outputs translate_center_crop_pad(OpContext& c) {
  const auto& x = c.in(0);
  const int r = rank_of(x);
  auto shape = c.host_ints(1);
  std::vector<int> axes;
  if (c.node.has_attr("axes")) {
    axes = to_axes(c.node.attr_ints("axes"), r);
  } else {
    axes.resize(r);
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (shape.size() != axes.size()) c.fail("shape length differs from the number of axes");
  std::vector<int64_t> lo(r, 0), hi(r, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t d = x.shape(axes[k]), t = shape[k];
    if (t < 0) c.fail("negative target size");
    if (t < d) {  // crop: start = (d - t) / 2
      lo[axes[k]] = -((d - t) / 2);
      hi[axes[k]] = -((d - t) - (d - t) / 2);
    } else {  // pad: before = (t - d) / 2
      lo[axes[k]] = (t - d) / 2;
      hi[axes[k]] = (t - d) - (t - d) / 2;
    }
  }
  return {pad_array(c, x, lo, hi, "constant", std::nullopt)};
}

// ---- DepthToSpace, SpaceToDepth, Trilu, Identity, Dropout ----------------------------------------

Outputs translate_depth_to_space(OpContext& c) {
  const auto& x = c.in(0);
  if (rank_of(x) != 4) c.fail("input must be 4-D (NCHW)");
  int b = static_cast<int>(c.node.attr_int("blocksize", 0));
  int n = x.shape(0), ch = x.shape(1), h = x.shape(2), w = x.shape(3);
  if (b <= 0 || ch % (b * b) != 0) c.fail("channels are not a multiple of blocksize^2");
  int oc = ch / (b * b);
  mx::array y = c.node.attr_string("mode", "DCR") == "CRD"
                    ? mx::transpose(mx::reshape(x, {n, oc, b, b, h, w}, c.s), {0, 1, 4, 2, 5, 3}, c.s)
                    : mx::transpose(mx::reshape(x, {n, b, b, oc, h, w}, c.s), {0, 3, 4, 1, 5, 2}, c.s);
  return {mx::reshape(y, {n, oc, h * b, w * b}, c.s)};
}

Support check_depth_to_space(const NodeQuery& q) {
  auto mode = q.node.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return Support::no("DepthToSpace mode '" + mode + "'");
  return Support::yes();
}

Outputs translate_space_to_depth(OpContext& c) {
  const auto& x = c.in(0);
  if (rank_of(x) != 4) c.fail("input must be 4-D (NCHW)");
  int b = static_cast<int>(c.node.attr_int("blocksize", 0));
  int n = x.shape(0), ch = x.shape(1), h = x.shape(2), w = x.shape(3);
  if (b <= 0 || h % b != 0 || w % b != 0) c.fail("H and W must be multiples of blocksize");
  auto y = mx::transpose(mx::reshape(x, {n, ch, h / b, b, w / b, b}, c.s), {0, 3, 5, 1, 2, 4}, c.s);
  return {mx::reshape(y, {n, ch * b * b, h / b, w / b}, c.s)};
}

// Keeps the upper (or lower) triangle of the last two dims, shifted by the diagonal k.
Outputs translate_trilu(OpContext& c) {
  const auto& x = c.in(0);
  if (rank_of(x) < 2) c.fail("input rank must be at least 2");
  int64_t k = c.has(1) ? c.host_int(1) : 0;
  // Any k beyond the matrix behaves like its edge; clamp so it fits MLX's int.
  int64_t rows = x.shape(-2), cols = x.shape(-1);
  k = std::clamp<int64_t>(k, -rows - 1, cols + 1);
  bool upper = c.node.attr_int("upper", 1) != 0;
  return {upper ? mx::triu(x, static_cast<int>(k), c.s) : mx::tril(x, static_cast<int>(k), c.s)};
}

// Sequences and optionals pass through as they are (Identity accepts any type from opset 14).
Outputs translate_identity(OpContext& c) { return c.emit({c.value(0)}); }

// Inference only: output = input. The mask is all true from opset 12 (the spec: nothing is
// dropped). Opsets 7-11 leave the test-mode mask undefined; ORT fills it with zeros/false, and
// so do we, so old models behave as they did there. bool from opset 10, the input type before.
// From opset 12 training_mode and ratio are inputs: training with ratio 0 drops nothing and is
// the identity too (mask all true). Training with ratio > 0 draws random numbers, which cannot
// match ORT's generator, so it is an error naming the op (read at run time: both may be
// computed values).
Outputs translate_dropout(OpContext& c) {
  const auto& x = c.in(0);
  if (c.node.since_version >= 12 && c.has(2) && c.host_int(2) != 0) {
    const double ratio = c.has(1) ? c.host_float(1) : 0.5;  // the spec's default ratio
    if (ratio != 0.0)
      c.fail("training_mode=true with ratio " + std::to_string(ratio) +
             " (random dropout) is not supported; only ratio 0 is deterministic");
  }
  Outputs outs{x};
  if (c.node.has_output(1)) {
    DType t = c.out_dtype(1);
    if (t == DType::Undefined) t = c.node.since_version >= 10 ? DType::Bool : c.in_dtype(0);
    auto d = mlx_dtype(t);
    outs.push_back(c.node.since_version >= 12 ? mx::ones(x.shape(), d, c.s)
                                              : mx::zeros(x.shape(), d, c.s));
  }
  return outs;
}

Support check_dropout(const NodeQuery& q) {
  if (q.node.since_version >= 12 && q.has_input(2)) {
    // Declined only when both are known: constant training_mode=true and a ratio that is a
    // non-zero constant or absent (default 0.5). Run-time values are checked at run time.
    const auto* r = q.has_input(1) ? q.constant(1) : nullptr;
    const bool random = !q.has_input(1) || (r && r->numel() > 0 && r->float_at(0) != 0.0);
    if (auto* t = q.constant(2); t && t->numel() > 0 && t->int_at(0) != 0 && random)
      return Support::no("Dropout with training_mode=true and ratio > 0 (random) is not supported");
  }
  return Support::yes();
}

const OpEntry kOps[] = {
    // Pure data movement: these also carry the byte storage of float8/float4/int4/uint4
    // (OpEntry::lowp; ops/lowp.h), whose values they never look at.
    {"", "Reshape", 1, kAnyOpset, check_reshape, translate_reshape, {}, /*lowp=*/true},
    {"", "Transpose", 1, kAnyOpset, nullptr, translate_transpose, {}, /*lowp=*/true},
    {"", "Concat", 1, kAnyOpset, nullptr, translate_concat},
    {"", "Split", 1, kAnyOpset, nullptr, translate_split},
    {"", "Unsqueeze", 1, kAnyOpset, nullptr, translate_unsqueeze, {}, /*lowp=*/true},
    {"", "Squeeze", 1, kAnyOpset, nullptr, translate_squeeze, {}, /*lowp=*/true},
    {"", "Flatten", 1, kAnyOpset, nullptr, translate_flatten, {}, /*lowp=*/true},
    {"", "Expand", 8, kAnyOpset, nullptr, translate_expand},
    {"", "Tile", 6, kAnyOpset, nullptr, translate_tile},
    {"", "Pad", 1, kAnyOpset, check_pad, translate_pad,
     "modes constant/reflect/edge/wrap; negative pads crop first"},
    {"", "CenterCropPad", 18, kAnyOpset, nullptr, translate_center_crop_pad},
    {"", "Identity", 1, kAnyOpset, nullptr, translate_identity,
     "tensors, sequences and optionals (these only inside a fused group)", /*lowp=*/true},
    {"", "DepthToSpace", 1, kAnyOpset, check_depth_to_space, translate_depth_to_space},
    {"", "SpaceToDepth", 1, kAnyOpset, nullptr, translate_space_to_depth},
    {"", "Trilu", 14, kAnyOpset, nullptr, translate_trilu},
    {"", "Dropout", 7, kAnyOpset, check_dropout, translate_dropout,
     "training_mode=true only with ratio 0 (identity); a random ratio > 0 is declined when "
     "constant, an error when given at run time"},
};

}  // namespace

std::span<const OpEntry> shape_ops() {
  // One table for the family: this file's entries, then the generators of shape_gen.cc.
  static const std::vector<OpEntry> table = [] {
    std::vector<OpEntry> t(std::begin(kOps), std::end(kOps));
    auto gen = shape_gen_ops();
    t.insert(t.end(), gen.begin(), gen.end());
    return t;
  }();
  return table;
}

}  // namespace ortmlx::ops
