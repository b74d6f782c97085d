// The less common convolution-shaped ops: ConvInteger and QLinearConv (exact integer
// accumulation), DeformConv (bilinear sampling at learned offsets), Col2Im and MaxUnpool (the
// scatter inverses of im2col and MaxPool). Conv/ConvTranspose and pooling are in nn.cc/pool.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "ops/int_matmul.h"
#include "ops/nn/nn_internal.h"

namespace ortmlx::ops {

namespace {

using namespace nn;

// Output geometry of a convolution over x's spatial dims (channels-first x, weight (M, C/g, K..)),
// with auto_pad resolved as in nn.cc's Conv: SAME splits the total padding with the odd one at
// the end (SAME_UPPER) or at the beginning (SAME_LOWER).
Window conv_window(OpContext& c, const mx::array& x, const mx::array& w) {
  const auto& n = c.node;
  if (x.ndim() < 3) c.fail("input must have rank >= 3 (N, C, spatial..)");
  if (w.ndim() != x.ndim()) c.fail("weight rank differs from input rank");
  const size_t nd = x.ndim() - 2;
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  auto ks = n.attr_ints("kernel_shape");
  if (!ks.empty() && ks != k) c.fail("kernel_shape does not match the weight's shape");
  Window win;
  win.nd = nd;
  win.kernel = k;
  win.stride = spatial_attr(n, "strides", nd, 1);
  win.dil = spatial_attr(n, "dilations", nd, 1);
  auto pads = pads_attr(n, nd);
  auto auto_pad = n.attr_string("auto_pad", "NOTSET");
  for (size_t d = 0; d < nd; ++d) {
    int64_t in = x.shape(2 + d), dk = (k[d] - 1) * win.dil[d] + 1, b = pads[d], e = pads[nd + d];
    if (auto_pad == "VALID") {
      b = e = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t out = (in + win.stride[d] - 1) / win.stride[d];
      int64_t total = std::max<int64_t>((out - 1) * win.stride[d] + dk - in, 0);
      b = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      e = total - b;
    }
    if (in + b + e < dk) c.fail("the dilated kernel is larger than the padded input");
    win.in.push_back(in);
    win.lo.push_back(b);
    win.hi.push_back(e);
    win.out.push_back((in + b + e - dk) / win.stride[d] + 1);
  }
  return win;
}

// conv(x, w) for integer-valued x (N, C, D..) and w (M, C/g, K..) with |values| < 2^8, padding
// with zeros, exact: im2col (a strided window view) + exact_matmul, returned as int32 (ORT's
// accumulator type; the exact int64 sum is reduced modulo 2^32 like its wrap-around).
mx::array int_conv(OpContext& c, const mx::array& x, const mx::array& w, const Window& win,
                   int groups) {
  const auto s = c.s;
  const int N = x.shape(0), C = x.shape(1), M = w.shape(0);
  if (C % groups || M % groups || w.shape(1) * groups != C)
    c.fail("input channels " + std::to_string(C) + " / weight " + std::to_string(w.shape(1)) +
           " do not match group " + std::to_string(groups));
  const int cg = C / groups, mg = M / groups;
  int64_t P = 1, K = 1;
  for (size_t d = 0; d < win.nd; ++d) {
    P *= win.out[d];
    K *= win.kernel[d];
  }
  mx::Shape out_shape{N, M};
  for (auto o : win.out) out_shape.push_back(static_cast<int>(o));
  if (x.size() == 0 || w.size() == 0 || P == 0) return mx::zeros(out_shape, mx::int32, s);
  if (N * P * cg * K > INT32_MAX) c.fail("the im2col matrix is too large");
  // (N, C, out.., k..) -> (N, g, C/g, P, K) -> (g, N, P, C/g, K) -> (g, N*P, C/g*K)
  auto v = windows(x, win, 2, mx::array(0, x.dtype()), s);
  v = mx::reshape(v, {N, groups, cg, static_cast<int>(P), static_cast<int>(K)}, s);
  v = mx::reshape(mx::transpose(v, {1, 0, 3, 2, 4}, s),
                  {groups, static_cast<int>(N * P), static_cast<int>(cg * K)}, s);
  // (M, C/g, K..) -> (g, M/g, C/g*K) -> (g, C/g*K, M/g)
  auto wk = mx::swapaxes(mx::reshape(w, {groups, mg, static_cast<int>(cg * K)}, s), 1, 2, s);
  auto y = mx::astype(exact_matmul(v, wk, 8, s), mx::int32, s);  // (g, N*P, M/g)
  y = mx::transpose(mx::reshape(y, {groups, N, static_cast<int>(P), mg}, s), {1, 0, 3, 2}, s);
  return mx::reshape(y, out_shape, s);
}

// (v - zero_point) in int32; an 8-bit difference lies in [-255, 255]. A per-output-channel zero
// point (M,) of the weight is brought onto axis 0.
mx::array centered(const mx::array& v, const std::optional<mx::array>& zp, bool per_out_channel,
                   mx::Stream s) {
  auto vi = mx::astype(v, mx::int32, s);
  if (!zp) return vi;
  auto z = mx::astype(*zp, mx::int32, s);
  if (z.size() == 1) {
    z = mx::reshape(z, {}, s);
  } else if (per_out_channel && z.ndim() == 1 && z.shape(0) == v.shape(0)) {
    mx::Shape sh(v.ndim(), 1);
    sh[0] = v.shape(0);
    z = mx::reshape(z, sh, s);
  } else {
    throw TranslateError(per_out_channel
                             ? "weight zero point must be a scalar or one per output channel"
                             : "input zero point must be a scalar");
  }
  return mx::subtract(vi, z, s);
}

Support check_int_conv_common(const NodeQuery& q) {
  if (auto r = check_auto_pad(q); !r) return r;
  if (auto r = check_rank(q, 0, 3, 5); !r) return r;
  if (q.node.attr_int("group", 1) < 1) return Support::no("group must be >= 1");
  for (auto p : q.node.attr_ints("pads"))
    if (p < 0) return Support::no("negative pads");
  return check_spatial_attrs(q);
}

Support check_8bit(const NodeQuery& q, std::initializer_list<size_t> idx) {
  for (auto i : idx)
    if (auto r = input_dtype_in(q, i, {DType::Int8, DType::UInt8}); !r) return r;
  return Support::yes();
}

// ---- ConvInteger ------------------------------------------------------------------------------

Support check_conv_integer(const NodeQuery& q) {
  if (auto r = check_8bit(q, {0, 1, 2, 3}); !r) return r;
  return check_int_conv_common(q);
}

// Padding with zeros after subtracting the zero point equals ORT's padding of the raw input
// with x_zero_point.
Outputs translate_conv_integer(OpContext& c) {
  const auto& x = c.in(0);
  const auto& w = c.in(1);
  std::optional<mx::array> xz, wz;
  if (c.has(2)) xz = c.in(2);
  if (c.has(3)) wz = c.in(3);
  auto win = conv_window(c, x, w);
  return {int_conv(c, centered(x, xz, false, c.s), centered(w, wz, true, c.s), win,
                   static_cast<int>(c.node.attr_int("group", 1)))};
}

// ---- QLinearConv ------------------------------------------------------------------------------

Support check_qlinear_conv(const NodeQuery& q) {
  if (auto r = check_8bit(q, {0, 2, 3, 5, 7}); !r) return r;
  for (size_t i : {1, 4, 6})
    if (auto r = input_dtype_in(q, i, {DType::Float32}); !r) return r;
  if (auto r = input_dtype_in(q, 8, {DType::Int32}); !r) return r;
  return check_int_conv_common(q);
}

// Requantized like ORT's kernel (MLAS): the int32 accumulator (+ bias) times the float32 scale
// x_scale * w_scale[m] / y_scale, rounded half to even, plus y_zero_point, saturated.
Outputs translate_qlinear_conv(OpContext& c) {
  const auto s = c.s;
  const auto& x = c.in(0);
  const auto& w = c.in(3);
  auto win = conv_window(c, x, w);
  auto acc = int_conv(c, centered(x, c.in(2), false, s), centered(w, c.in(5), true, s), win,
                      static_cast<int>(c.node.attr_int("group", 1)));
  const int rank = static_cast<int>(x.ndim());
  mx::Shape chan(rank, 1);
  chan[1] = -1;
  if (c.has(8)) acc = mx::add(acc, mx::reshape(c.in(8), chan, s), s);
  auto ws = c.in(4);
  if (ws.size() != 1 && !(ws.ndim() == 1 && ws.shape(0) == w.shape(0)))
    c.fail("w_scale must be a scalar or one per output channel");
  ws = ws.size() == 1 ? mx::reshape(ws, {}, s) : mx::reshape(ws, chan, s);
  auto scale = mx::divide(mx::multiply(mx::reshape(c.in(1), {}, s), ws, s),
                          mx::reshape(c.in(6), {}, s), s);
  const auto& yzp = c.in(7);
  if (yzp.size() != 1) c.fail("y_zero_point must be a scalar");
  const auto out = yzp.dtype();
  const float lo = out == mx::int8 ? -128.f : 0.f, hi = out == mx::int8 ? 127.f : 255.f;
  auto v = mx::round(mx::multiply(mx::astype(acc, mx::float32, s), scale, s), 0, s);
  v = mx::add(v, mx::astype(mx::reshape(yzp, {}, s), mx::float32, s), s);
  v = mx::clip(v, mx::array(lo), mx::array(hi), s);
  return {mx::astype(v, out, s)};
}

// ---- DeformConv -------------------------------------------------------------------------------

Support check_deform_conv(const NodeQuery& q) {
  for (size_t i : {0, 1, 2, 3, 4})
    if (auto r = float_input(q, i); !r) return r;
  if (auto r = check_rank(q, 0, 4, 4); !r) return r;  // ORT's kernel is 2-D only as well
  if (q.node.attr_int("group", 1) < 1 || q.node.attr_int("offset_group", 1) < 1)
    return Support::no("group and offset_group must be >= 1");
  for (auto p : q.node.attr_ints("pads"))
    if (p < 0) return Support::no("negative pads");
  return check_spatial_attrs(q);
}

// Every output position (oh, ow) and kernel tap (i, j) samples x at
//   (oh*stride - pad_begin + i*dilation + dy,  ow*stride - pad_begin + j*dilation + dx)
// with (dy, dx) from `offset` (N, offset_group*kH*kW*2, oH, oW), bilinearly: each of the four
// neighbouring pixels outside the image contributes zero. The samples (times `mask`, when
// given) form an im2col matrix that one grouped matmul reduces with the weights.
Outputs translate_deform_conv(OpContext& c) {
  const auto s = c.s;
  const auto& x0 = c.in(0);
  const auto& w0 = c.in(1);
  if (x0.ndim() != 4) c.fail("only 2-D DeformConv is supported (input must be 4-D)");
  auto win = conv_window(c, x0, w0);
  const int N = x0.shape(0), C = x0.shape(1), H = x0.shape(2), W = x0.shape(3), M = w0.shape(0);
  const int groups = static_cast<int>(c.node.attr_int("group", 1));
  const int og = static_cast<int>(c.node.attr_int("offset_group", 1));
  if (C % groups || M % groups || w0.shape(1) * groups != C)
    c.fail("input channels / weight do not match group");
  if (C % og) c.fail("input channels are not divisible by offset_group");
  const int kh = static_cast<int>(win.kernel[0]), kw = static_cast<int>(win.kernel[1]);
  const int oh = static_cast<int>(win.out[0]), ow = static_cast<int>(win.out[1]);
  const int K = kh * kw, P = oh * ow;
  const auto& off0 = c.in(2);
  if (off0.ndim() != 4 || off0.shape(0) != N || off0.shape(1) != og * K * 2 ||
      off0.shape(2) != oh || off0.shape(3) != ow)
    c.fail("offset must be (N, offset_group*kH*kW*2, oH, oW)");
  if (c.has(4) && (c.in(4).ndim() != 4 || c.in(4).shape(1) != og * K))
    c.fail("mask must be (N, offset_group*kH*kW, oH, oW)");
  mx::Shape out_shape{N, M, oh, ow};
  if (x0.size() == 0 || w0.size() == 0 || P == 0) return {mx::zeros(out_shape, x0.dtype(), s)};

  const mx::Dtype t = x0.dtype() == mx::float64 ? mx::float64 : mx::float32;
  // The undeformed sample positions of every (tap, output position), computed on the host.
  std::vector<float> bh(static_cast<size_t>(K) * P), bw(bh.size());
  for (int i = 0; i < kh; ++i)
    for (int j = 0; j < kw; ++j)
      for (int y = 0; y < oh; ++y)
        for (int z = 0; z < ow; ++z) {
          size_t k = (static_cast<size_t>(i * kw + j) * oh + y) * ow + z;
          bh[k] = static_cast<float>(y * win.stride[0] - win.lo[0] + i * win.dil[0]);
          bw[k] = static_cast<float>(z * win.stride[1] - win.lo[1] + j * win.dil[1]);
        }
  auto base_h = mx::astype(mx::array(bh.begin(), {K, P}, mx::float32), t, s);
  auto base_w = mx::astype(mx::array(bw.begin(), {K, P}, mx::float32), t, s);
  // offset -> (N, og, K, 2, P)
  auto off = mx::reshape(mx::astype(off0, t, s), {N, og, K, 2, P}, s);
  auto take2 = [&](int which) {
    return mx::squeeze(mx::slice(off, {0, 0, 0, which, 0}, {N, og, K, which + 1, P}, s), 3, s);
  };
  auto h = mx::add(take2(0), base_h, s), w = mx::add(take2(1), base_w, s);  // (N, og, K, P)
  auto h0 = mx::floor(h, s), w0f = mx::floor(w, s);
  auto lh = mx::subtract(h, h0, s), lw = mx::subtract(w, w0f, s);
  auto one = mx::array(1.0, t);
  const int cpg = C / og;
  auto xr = mx::reshape(mx::astype(x0, t, s), {N, og, cpg, H * W}, s);
  std::optional<mx::array> cols;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      auto yi = mx::add(h0, mx::array(static_cast<double>(dy), t), s);
      auto xi = mx::add(w0f, mx::array(static_cast<double>(dx), t), s);
      auto valid = mx::logical_and(
          mx::logical_and(mx::greater_equal(yi, mx::array(0.0, t), s),
                          mx::less_equal(yi, mx::array(H - 1.0, t), s), s),
          mx::logical_and(mx::greater_equal(xi, mx::array(0.0, t), s),
                          mx::less_equal(xi, mx::array(W - 1.0, t), s), s),
          s);
      auto wt = mx::multiply(dy ? lh : mx::subtract(one, lh, s),
                             dx ? lw : mx::subtract(one, lw, s), s);
      wt = mx::where(valid, wt, mx::array(0.0, t), s);
      auto yc = mx::clip(yi, mx::array(0.0, t), mx::array(H - 1.0, t), s);
      auto xc = mx::clip(xi, mx::array(0.0, t), mx::array(W - 1.0, t), s);
      auto idx = mx::astype(mx::add(mx::multiply(yc, mx::array(static_cast<double>(W), t), s), xc, s),
                            mx::int32, s);
      idx = mx::broadcast_to(mx::reshape(idx, {N, og, 1, K * P}, s), {N, og, cpg, K * P}, s);
      auto v = mx::multiply(mx::take_along_axis(xr, idx, 3, s),
                            mx::reshape(wt, {N, og, 1, K * P}, s), s);
      cols = cols ? mx::add(*cols, v, s) : v;
    }
  if (c.has(4))
    cols = mx::multiply(*cols, mx::reshape(mx::astype(c.in(4), t, s), {N, og, 1, K * P}, s), s);
  // (N, og, C/og, K*P) = (N, C, K, P) -> (N, g, C/g*K, P); weights (g, M/g, C/g*K).
  const int cg = C / groups, mg = M / groups;
  auto colg = mx::reshape(*cols, {N, groups, cg * K, P}, s);
  auto wg = mx::reshape(mx::astype(w0, t, s), {1, groups, mg, cg * K}, s);
  auto y = mx::reshape(mx::matmul(wg, colg, s), out_shape, s);  // (N, g, M/g, P)
  if (c.has(3)) y = mx::add(y, mx::reshape(mx::astype(c.in(3), t, s), {1, M, 1, 1}, s), s);
  return {mx::astype(y, x0.dtype(), s)};
}

// ---- Col2Im -----------------------------------------------------------------------------------

Support check_col2im(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  if (auto r = check_rank(q, 0, 3, 3); !r) return r;
  for (size_t i : {1, 2})
    if (auto r = input_dtype_in(q, i, {DType::Int64}); !r) return r;
  return Support::yes();
}

// The inverse of im2col: input (N, C*prod(block), L) holds one column per sliding-window
// position; each value is added into the (padded) image at its window position, then the
// padding is cut off. The geometry comes from image_shape/block_shape (host reads), so the
// target of every column entry is computed on the host and one scatter-add does the sum.
Outputs translate_col2im(OpContext& c) {
  const auto s = c.s;
  const auto& x = c.in(0);
  const auto img = c.host_ints(1), blk = c.host_ints(2);
  const size_t nd = img.size();
  if (nd == 0 || blk.size() != nd) c.fail("image_shape and block_shape must have equal lengths");
  if (x.ndim() != 3) c.fail("input must be 3-D (N, C*prod(block_shape), L)");
  auto strides = spatial_attr(c.node, "strides", nd, 1);
  auto dil = spatial_attr(c.node, "dilations", nd, 1);
  auto pads = pads_attr(c.node, nd);
  std::vector<int64_t> padded(nd), out(nd);
  int64_t K = 1, L = 1, total = 1;
  for (size_t d = 0; d < nd; ++d) {
    if (img[d] < 0 || blk[d] < 1 || strides[d] < 1 || dil[d] < 1 || pads[d] < 0 ||
        pads[nd + d] < 0)
      c.fail("invalid image_shape/block_shape/strides/dilations/pads");
    padded[d] = img[d] + pads[d] + pads[nd + d];
    int64_t dk = (blk[d] - 1) * dil[d] + 1;
    out[d] = padded[d] < dk ? 0 : (padded[d] - dk) / strides[d] + 1;
    K *= blk[d];
    L *= out[d];
    total *= padded[d];
  }
  if (x.shape(1) % K) c.fail("input dim 1 is not a multiple of prod(block_shape)");
  if (x.shape(2) != L)
    c.fail("input has " + std::to_string(x.shape(2)) + " columns; the geometry gives " +
           std::to_string(L));
  if (total > INT32_MAX || K * L > INT32_MAX) c.fail("the image is too large");
  const int N = x.shape(0), C = static_cast<int>(x.shape(1) / K);
  mx::Shape oshape{N, C};
  for (auto v : img) oshape.push_back(static_cast<int>(v));
  if (x.size() == 0 || total == 0) return {mx::zeros(oshape, x.dtype(), s)};

  // Column entry (k, l), k over the block and l over window positions (both row-major), lands
  // at padded coordinate out_pos(l) * stride + block_pos(k) * dilation in every dim.
  std::vector<int32_t> target(static_cast<size_t>(K * L));
  std::vector<int64_t> kp(nd, 0);
  for (int64_t k = 0; k < K; ++k) {
    std::vector<int64_t> lp(nd, 0);
    for (int64_t l = 0; l < L; ++l) {
      int64_t flat = 0;
      for (size_t d = 0; d < nd; ++d) flat = flat * padded[d] + lp[d] * strides[d] + kp[d] * dil[d];
      target[k * L + l] = static_cast<int32_t>(flat);
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        if (++lp[d] < out[d]) break;
        lp[d] = 0;
      }
    }
    for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
      if (++kp[d] < blk[d]) break;
      kp[d] = 0;
    }
  }
  const int KL = static_cast<int>(K * L);
  auto idx = mx::broadcast_to(mx::array(target.begin(), {1, 1, KL}, mx::int32), {N, C, KL}, s);
  auto vals = mx::reshape(x, {N, C, KL}, s);
  auto acc = mx::scatter_add_axis(mx::zeros({N, C, static_cast<int>(total)}, x.dtype(), s), idx,
                                  vals, 2, s);
  mx::Shape pshape{N, C}, start(nd + 2, 0), stop{N, C};
  for (size_t d = 0; d < nd; ++d) {
    pshape.push_back(static_cast<int>(padded[d]));
    start[2 + d] = static_cast<int>(pads[d]);
    stop.push_back(static_cast<int>(pads[d] + img[d]));
  }
  return {mx::slice(mx::reshape(acc, pshape, s), start, stop, s)};
}

// ---- MaxUnpool --------------------------------------------------------------------------------

Support check_max_unpool(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  if (auto r = input_dtype_in(q, 1, {DType::Int64}); !r) return r;
  if (auto r = check_rank(q, 0, 3, 5); !r) return r;
  if (q.node.attr_ints("kernel_shape").empty()) return Support::no("kernel_shape is required");
  return check_spatial_attrs(q);
}

// Scatters X into a zero tensor at the flat indices I (MaxPool's Indices output: positions in
// the whole output tensor). The output shape is output_shape when given (host read), else the
// inverse of the pooling arithmetic: (in - 1) * stride - pad_begin - pad_end + kernel. MLX's
// scatter does no bounds checking: out-of-range indices fail the run (as on ORT's CPU EP;
// clipped into range with index_check=0); the extra slot that is cut off is a second guard.
// Duplicate indices (never
// produced by MaxPool) may resolve to any of the values.
Outputs translate_max_unpool(OpContext& c) {
  const auto s = c.s;
  const auto& x = c.in(0);
  const auto& ind = c.in(1);
  const size_t nd = x.ndim() < 3 ? 0 : x.ndim() - 2;
  if (nd == 0) c.fail("input must have rank >= 3");
  if (ind.shape() != x.shape()) c.fail("indices must have the input's shape");
  auto kernel = spatial_attr(c.node, "kernel_shape", nd, 1);
  auto strides = spatial_attr(c.node, "strides", nd, 1);
  auto pads = pads_attr(c.node, nd);
  std::vector<int64_t> shape;
  if (c.has(2)) {
    shape = c.host_ints(2);
    if (shape.size() != x.ndim()) c.fail("output_shape must have the input's rank");
  } else {
    shape = {x.shape(0), x.shape(1)};
    for (size_t d = 0; d < nd; ++d)
      shape.push_back((x.shape(2 + d) - 1) * strides[d] - pads[d] - pads[nd + d] + kernel[d]);
  }
  int64_t total = 1;
  for (auto v : shape) {
    if (v < 0) c.fail("negative output dim");
    total *= v;
  }
  if (total >= INT32_MAX) c.fail("the output is too large");
  if (total == 0 || x.size() == 0) return {mx::zeros(to_shape(shape), x.dtype(), s)};
  auto t = mx::array(total);
  auto fi = mx::flatten(c.checked_indices(ind, {total}, false, "I", 1), s);
  auto in_range = mx::logical_and(mx::greater_equal(fi, mx::array(int64_t{0}), s),
                                  mx::less(fi, mx::astype(t, fi.dtype(), s), s), s);
  auto idx = mx::astype(mx::where(in_range, fi, mx::astype(t, fi.dtype(), s), s), mx::int32, s);
  auto flat = mx::zeros({static_cast<int>(total) + 1}, x.dtype(), s);
  flat = mx::scatter(flat, idx, mx::reshape(x, {static_cast<int>(x.size()), 1}, s), 0, s);
  return {mx::reshape(mx::slice(flat, {0}, {static_cast<int>(total)}, s), to_shape(shape), s)};
}

const OpEntry kOps[] = {
    {"", "ConvInteger", 10, kAnyOpset, check_conv_integer, translate_conv_integer,
     "int8/uint8; exact int32 accumulation (im2col + exact float matmul)"},
    {"", "QLinearConv", 10, kAnyOpset, check_qlinear_conv, translate_qlinear_conv,
     "int8/uint8 with float32 scales; exact int32 accumulation, requantized like MLAS"},
    {"", "DeformConv", 19, kAnyOpset, check_deform_conv, translate_deform_conv, "2-D only"},
    {"", "Col2Im", 18, kAnyOpset, check_col2im, translate_col2im},
    {"", "MaxUnpool", 9, kAnyOpset, check_max_unpool, translate_max_unpool,
     "out-of-range indices fail the run; with output_shape the indices are flat positions in "
     "that shape, as on ORT's CPU EP (ONNX's reference and test_maxunpool_export_with_output_shape "
     "read them in the inferred shape)"},
};

}  // namespace

std::span<const OpEntry> conv_extra_ops() { return kOps; }

}  // namespace ortmlx::ops
