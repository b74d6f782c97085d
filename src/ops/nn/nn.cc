// Convolutions (Conv, ConvTranspose) and the nn family table; pooling lives in pool.cc,
// Resize/Upsample in resize.cc, GridSample in grid_sample.cc and RoiAlign in roi_align.cc.
// ONNX is channels-first with OIHW weights, MLX's conv_general is channels-last with OHWI
// weights: inputs and weights are transposed in, the result back out.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include <mlx/primitives.h>

#include "graph/fuse_conv_activation.h"
#include "kernels/cpu/kernels.h"
#include "ops/nn/nn_internal.h"
#include "ops/switches.h"

namespace ortmlx::ops::nn {

std::vector<int> channels_last_perm(int rank) {
  std::vector<int> p{0};
  for (int i = 2; i < rank; ++i) p.push_back(i);
  p.push_back(1);
  return p;
}

std::vector<int> channels_first_perm(int rank) {
  std::vector<int> p{0, rank - 1};
  for (int i = 1; i < rank - 1; ++i) p.push_back(i);
  return p;
}

std::vector<int64_t> spatial_attr(const graph::Node& n, const char* name, size_t dims,
                                  int64_t def) {
  auto v = n.attr_ints(name);
  if (v.empty()) return std::vector<int64_t>(dims, def);
  if (v.size() != dims)
    throw TranslateError(std::string("[") + n.op_type + "] attribute '" + name + "' has " +
                         std::to_string(v.size()) + " values for " + std::to_string(dims) +
                         " spatial dims");
  return v;
}

std::vector<int64_t> pads_attr(const graph::Node& n, size_t dims) {
  return spatial_attr(n, "pads", 2 * dims, 0);
}

Support check_auto_pad(const NodeQuery& q) {
  auto a = q.node.attr_string("auto_pad", "NOTSET");
  if (a == "NOTSET" || a == "VALID" || a == "SAME_UPPER" || a == "SAME_LOWER")
    return Support::yes();
  return Support::no("auto_pad '" + a + "' is not an ONNX value");
}

Support check_spatial_attrs(const NodeQuery& q) {
  const int r = q.input_rank(0);
  if (r < 3) return Support::yes();
  const size_t nd = r - 2;
  for (const char* a : {"strides", "dilations", "kernel_shape", "output_padding", "pads"}) {
    auto v = q.node.attr_ints(a);
    size_t want = std::string_view(a) == "pads" ? 2 * nd : nd;
    if (!v.empty() && v.size() != want)
      return Support::no(std::string(a) + " has " + std::to_string(v.size()) + " values for " +
                         std::to_string(nd) + " spatial dims");
  }
  for (const char* a : {"strides", "dilations", "kernel_shape"})
    for (auto v : q.node.attr_ints(a))
      if (v < 1) return Support::no(std::string(a) + " must be >= 1");
  return Support::yes();
}

Support check_rank(const NodeQuery& q, size_t i, int min_rank, int max_rank) {
  int r = q.input_rank(i);
  if (r < 0 || (r >= min_rank && r <= max_rank)) return Support::yes();
  return Support::no("input " + std::to_string(i) + " has rank " + std::to_string(r) +
                     "; supported ranks are " + std::to_string(min_rank) + ".." +
                     std::to_string(max_rank));
}

mx::Dtype compute_dtype(const mx::array& x, mx::Stream s) {
  return compute_half_in_f32(x, s) ? mx::float32 : x.dtype();
}

}  // namespace ortmlx::ops::nn

namespace ortmlx::ops {

namespace {

using namespace nn;

std::vector<int> to_int(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// The begin padding of an auto_pad SAME split: the odd one goes to the end for SAME_UPPER and
// to the beginning for SAME_LOWER. Written as ORT's ComputePad does, with C++ division that
// truncates toward zero: for a negative total (stride above the kernel) SAME_LOWER's begin is
// (total + 1) / 2, e.g. 0 for -2 (total - total / 2 would give -1 and shift every window).
int64_t same_begin(int64_t total, bool upper) { return upper ? total / 2 : (total + 1) / 2; }

// The windows of a channels-last convolution: x (N, D.., C), w (M, K.., C/groups).
Window conv_window(const mx::array& x, const mx::array& w, const std::vector<int>& stride,
                   const std::vector<int>& lo, const std::vector<int>& hi, const std::vector<int>& dilation) {
  Window win;
  win.nd = x.ndim() - 2;
  for (size_t d = 0; d < win.nd; ++d) {
    int64_t k = w.shape(1 + d), dk = (k - 1) * dilation[d] + 1, in = x.shape(1 + d);
    win.kernel.push_back(k);
    win.stride.push_back(stride[d]);
    win.dil.push_back(dilation[d]);
    win.lo.push_back(lo[d]);
    win.hi.push_back(hi[d]);
    win.in.push_back(in);
    win.out.push_back((in + lo[d] + hi[d] - dk) / stride[d] + 1);
  }
  return win;
}

// A convolution as im2col (a strided window view) + one batched matmul over the groups. Used
// where MLX's CPU convolution falls short: it accumulates float64 in float32 (this is exact), and
// it runs grouped convolutions (other than depthwise), kernel dilation and input dilation
// (ConvTranspose's stride) through a naive loop, an order of magnitude slower than its plain
// convolution. Same contract as conv_general: x (N, D.., C), w (M, K.., C/groups), non-negative
// padding.
mx::array conv_im2col(const mx::array& x, const mx::array& w, const std::vector<int>& stride,
                   const std::vector<int>& lo, const std::vector<int>& hi,
                   const std::vector<int>& dilation, const std::vector<int>& input_dilation,
                   int groups, bool flip, mx::Stream s) {
  const int rank = x.ndim(), nd = rank - 2;
  mx::array xi = x;
  bool dilate = false;
  for (int v : input_dilation) dilate = dilate || v > 1;
  if (dilate) {  // interleave zeros between input elements
    mx::Shape dshape = x.shape(), start(rank, 0), step(rank, 1);
    for (int d = 0; d < nd; ++d) {
      dshape[1 + d] = (x.shape(1 + d) - 1) * input_dilation[d] + 1;
      step[1 + d] = input_dilation[d];
    }
    xi = mx::slice_update(mx::zeros(dshape, x.dtype(), s), x, start, dshape, step, s);
  }
  const Window win = conv_window(xi, w, stride, lo, hi, dilation);
  int64_t P = 1, K = 1;
  for (int d = 0; d < nd; ++d) {
    P *= win.out[d];
    K *= win.kernel[d];
  }
  const int N = x.shape(0), C = x.shape(-1), M = w.shape(0), cg = C / groups, mg = M / groups;
  // (N, out.., C, K..) -> (g, N*P, C/g * K)
  mx::array v = windows(xi, win, 1, mx::array(0.0, x.dtype()), s);
  v = mx::transpose(mx::reshape(v, {static_cast<int>(N * P), groups, static_cast<int>(cg * K)}, s),
                    {1, 0, 2}, s);
  mx::array wk = w;
  if (flip)
    for (int d = 0; d < nd; ++d)
      wk = mx::take(wk, mx::arange(w.shape(1 + d) - 1, -1, -1, s), 1 + d, s);
  // (M, K.., C/g) -> (M, C/g, K..) -> (g, C/g * K, M/g)
  std::vector<int> perm{0, nd + 1};
  for (int d = 0; d < nd; ++d) perm.push_back(1 + d);
  wk = mx::reshape(mx::transpose(wk, perm, s), {groups, mg, static_cast<int>(cg * K)}, s);
  mx::array y = mx::matmul(v, mx::transpose(wk, {0, 2, 1}, s), s);  // (g, N*P, M/g)
  mx::Shape out_shape{N};
  for (auto o : win.out) out_shape.push_back(static_cast<int>(o));
  out_shape.push_back(M);
  return mx::reshape(mx::transpose(y, {1, 0, 2}, s), out_shape, s);
}

// A depthwise convolution (one input channel per group, one output channel per input channel)
// as a fold over the kernel taps: y += view_tap * w[:, tap], elementwise (fused when compiled).
// MLX's CPU conv runs depthwise through its naive loop too: 9.9 ms for 3x3 over 64x56x56, ~0.3
// MFLOP-ms of work. x (N, D.., C), w (C, K.., 1), non-negative padding, no input dilation.
mx::array conv_depthwise_taps(const mx::array& x, const mx::array& w, const std::vector<int>& stride,
                              const std::vector<int>& lo, const std::vector<int>& hi,
                              const std::vector<int>& dilation, bool flip, mx::Stream s) {
  const int C = x.shape(-1);
  const Window win = conv_window(x, w, stride, lo, hi, dilation);
  auto taps = mx::reshape(w, {C, -1}, s);  // (C, K) with the last kernel dim fastest
  const int K = taps.shape(1);
  std::optional<mx::array> acc;
  for_each_tap(x, win, 1, mx::array(0, x.dtype()), s, [&](const mx::array& v, int64_t t) {
    const int k = flip ? K - 1 - static_cast<int>(t) : static_cast<int>(t);
    auto wk = mx::reshape(mx::slice(taps, {0, k}, {C, k + 1}, s), {C}, s);  // on the channel axis
    auto term = mx::multiply(v, wk, s);
    acc = acc ? mx::add(*acc, term, s) : term;
  });
  return *acc;
}

// Runs conv_general, splitting the groups by hand for 3-D (MLX only groups 1-D and 2-D).
// x: (N, D.., C) channels-last; w: (M, K.., C/groups).
mx::array grouped_conv(const mx::array& x, const mx::array& w, const std::vector<int>& stride,
                       const std::vector<int>& lo, const std::vector<int>& hi,
                       const std::vector<int>& dilation, const std::vector<int>& input_dilation,
                       int groups, bool flip, mx::Stream s) {
  int nd = x.ndim() - 2;
  const bool depthwise = groups > 1 && x.shape(-1) == groups && w.shape(0) == groups;
  bool input_dilated = false;
  for (int v : input_dilation) input_dilated = input_dilated || v > 1;
  if (s.device == mx::Device::cpu && depthwise && !input_dilated && x.dtype() != mx::float64 &&
      static_cast<int64_t>(w.size()) / groups <= 49)
    return conv_depthwise_taps(x, w, stride, lo, hi, dilation, flip, s);
  bool naive_on_cpu = groups > 1 || input_dilated;
  for (int v : dilation) naive_on_cpu = naive_on_cpu || v > 1;
  if (x.dtype() == mx::float64 || (s.device == mx::Device::cpu && naive_on_cpu))
    return conv_im2col(x, w, stride, lo, hi, dilation, input_dilation, groups, flip, s);
  if (groups == 1 || nd < 3)
    return mx::conv_general(x, w, stride, lo, hi, dilation, input_dilation, groups, flip, s);
  int cg = x.shape(-1) / groups, mg = w.shape(0) / groups;
  std::vector<mx::array> parts;
  for (int g = 0; g < groups; ++g) {
    auto xg = mx::slice(x, {0, 0, 0, 0, g * cg},
                        {x.shape(0), x.shape(1), x.shape(2), x.shape(3), (g + 1) * cg}, s);
    auto wg = mx::slice(w, {g * mg, 0, 0, 0, 0},
                        {(g + 1) * mg, w.shape(1), w.shape(2), w.shape(3), w.shape(4)}, s);
    parts.push_back(mx::conv_general(xg, wg, stride, lo, hi, dilation, input_dilation, 1, flip, s));
  }
  return mx::concatenate(parts, -1, s);
}

namespace {

using graph::ConvActivation;

// A fused residual Add's operand: a Conv's input 3 (ONNX's Conv has three; graph/fuse_conv_activation).
std::optional<mx::array> conv_residual(OpContext& c) {
  if (!c.has(3)) return std::nullopt;
  return c.in(3);
}

// The activation steps a fused Conv carries (graph/fuse_conv_activation.h) as MLX ops on its
// output y, in y's dtype (`residual`: AddInput's operand).
mx::array apply_activations(const std::vector<ConvActivation>& steps, mx::array y, mx::Stream s,
                            const std::optional<mx::array>& residual = std::nullopt) {
  auto k = [&y](double v) { return mx::array(v, y.dtype()); };
  for (const auto& st : steps) {
    switch (st.kind) {
      case ConvActivation::Kind::AddInput:
        if (!residual) throw std::invalid_argument("a fused residual Add without its operand");
        y = mx::add(y, mx::astype(*residual, y.dtype(), s), s);
        break;
      case ConvActivation::Kind::Relu: y = mx::maximum(y, k(0), s); break;
      case ConvActivation::Kind::LeakyRelu:
        y = mx::where(mx::less(y, k(0), s), mx::multiply(k(st.a), y, s), y, s);
        break;
      case ConvActivation::Kind::Clip:
        if (std::isfinite(st.a)) y = mx::maximum(y, k(st.a), s);
        if (std::isfinite(st.b)) y = mx::minimum(y, k(st.b), s);
        break;
      case ConvActivation::Kind::Mul: y = mx::multiply(y, k(st.a), s); break;
      case ConvActivation::Kind::Add: y = mx::add(y, k(st.a), s); break;
      case ConvActivation::Kind::HardSigmoid:
        y = mx::minimum(mx::maximum(mx::add(mx::multiply(k(st.a), y, s), k(st.b), s), k(0), s), k(1), s);
        break;
      case ConvActivation::Kind::HardSwish:
        y = mx::divide(mx::multiply(y, mx::minimum(mx::maximum(mx::add(y, k(3), s), k(0), s), k(6), s), s), k(6), s);
        break;
      case ConvActivation::Kind::Sigmoid: y = sigmoid_precise(y, s); break;
      case ConvActivation::Kind::Tanh: y = tanh_precise(y, s); break;
      case ConvActivation::Kind::Swish: y = mx::multiply(y, sigmoid_precise(y, s), s); break;
    }
  }
  return y;
}

// The longest prefix of `steps` oneDNN applies as post-ops; `covered` says how many steps that is.
// Consecutive scalar Mul/Add steps become one linear post-op, and a post-op whose kind came
// earlier with other parameters ends the prefix: oneDNN 2.6 computes the later one with the
// earlier one's parameters (two clips, two linears).
std::vector<ConvPostOp> post_ops_of(const std::vector<ConvActivation>& steps, size_t& covered) {
  std::vector<ConvPostOp> ops;
  covered = 0;
  for (const auto& st : steps) {
    std::vector<ConvPostOp> more;
    switch (st.kind) {
      case ConvActivation::Kind::Relu: more = {{ConvPostOp::Relu}}; break;
      case ConvActivation::Kind::LeakyRelu: more = {{ConvPostOp::Relu, st.a}}; break;
      case ConvActivation::Kind::Clip: more = {{ConvPostOp::Clip, st.a, st.b}}; break;
      case ConvActivation::Kind::Mul: more = {{ConvPostOp::Linear, st.a, 0.f}}; break;
      case ConvActivation::Kind::Add: more = {{ConvPostOp::Linear, 1.f, st.a}}; break;
      case ConvActivation::Kind::HardSigmoid: more = {{ConvPostOp::Linear, st.a, st.b}, {ConvPostOp::Clip, 0.f, 1.f}}; break;
      case ConvActivation::Kind::HardSwish: more = {{ConvPostOp::HardSwish, 1.f / 6.f, 0.5f}}; break;
      case ConvActivation::Kind::Sigmoid: more = {{ConvPostOp::Logistic}}; break;
      case ConvActivation::Kind::Tanh: more = {{ConvPostOp::Tanh}}; break;
      case ConvActivation::Kind::Swish: more = {{ConvPostOp::Swish, 1.f}}; break;
      case ConvActivation::Kind::AddInput: return ops;  // not a post-op: it and the rest after
    }
    auto merged = ops;
    for (const auto& op : more) {
      if (op.kind == ConvPostOp::Linear && !merged.empty() && merged.back().kind == ConvPostOp::Linear) {
        auto& l = merged.back();  // a * (alpha * y + beta), or (alpha * y + beta) + b
        if (op.beta == 0.f) l.alpha *= op.alpha, l.beta *= op.alpha;
        else if (op.alpha == 1.f) l.beta += op.beta;
        else merged.push_back(op);
      } else {
        merged.push_back(op);
      }
    }
    bool clash = false;
    for (size_t i = 0; i < merged.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        clash |= merged[i].kind == merged[j].kind &&
                 (merged[i].alpha != merged[j].alpha || merged[i].beta != merged[j].beta);
    if (clash) break;
    ops = std::move(merged);
    ++covered;
  }
  return ops;
}

}  // namespace

namespace {

// The plan for `gt`; where oneDNN has no kernel in 16-channel blocks, the one in its own pick of
// layout (gt says which).
std::shared_ptr<const DnnlConvPlan> conv_plan(DnnlConvShape& gt, mx::Stream s) {
  auto plan = cpu_dnnl_conv_plan(gt, s);
  if (!plan && gt.blocked16) {
    gt.blocked16 = gt.winograd = false;
    plan = cpu_dnnl_conv_plan(gt, s);
  }
  return plan;
}

// A convolution whose steps start with a residual Add (graph/fuse_conv_activation: AddInput)
// through oneDNN with the Add as its first post-op (Sum) and the steps after it that oneDNN
// takes: the residual added while each output block is in registers, written over the residual's
// buffer where nothing reads it afterwards (kConvResidualFree) or nothing else holds it (ORT's
// Conv + Add + Relu fusion does the same). std::nullopt
// when oneDNN has no fast kernel with those post-ops or the residual is not in the layout the
// convolution writes.
std::optional<mx::array> conv_add_through_library(OpContext& c, const mx::array& x0, const mx::array& w0,
                                                  DnnlConvShape gt, const std::vector<graph::ConvActivation>& steps,
                                                  const mx::array& residual) {
  if (steps.empty() || residual.shape() != gt.y || compute_dtype(residual, c.s) != mx::float32) return std::nullopt;
  size_t covered = 0;
  const std::vector<graph::ConvActivation> after(steps.begin() + 1, steps.end());
  gt.post_ops = post_ops_of(after, covered);
  gt.post_ops.insert(gt.post_ops.begin(), ConvPostOp{ConvPostOp::Sum});
  auto plan = conv_plan(gt, c.s);
  if (!plan) return std::nullopt;
  auto weights = [&] {
    return c.prepared("dnnl_conv_w/" + gt.key(), {1}, [&] { return cpu_dnnl_conv_weights(plan, w0, c.s); });
  };
  std::optional<mx::array> bias;
  if (c.has(2)) bias = c.in(2);
  const bool over_residual = c.node.attr_int(graph::kConvResidualFree, 0) == 1;
  auto y = cpu_dnnl_conv_add(plan, gt, x0, weights, bias, residual, over_residual, c.s);
  if (!y) return std::nullopt;
  return apply_activations({after.begin() + static_cast<std::ptrdiff_t>(covered), after.end()},
                           mx::astype(*y, x0.dtype(), c.s), c.s);
}

}  // namespace

// A float32 convolution (or, g.transposed, a ConvTranspose) on MLX's CPU device through oneDNN
// (kernels/cpu/dnnl_conv.cc), in ONNX's own layout, with the weight laid out for it once per
// program; std::nullopt when that path is off, unavailable for this geometry or too small.
// `flops`: the product's work, 2 x weight elements x batch x (output or, transposed, input)
// positions.
std::optional<mx::array> conv_through_library(OpContext& c, const mx::array& x0, const mx::array& w0,
                                              const DnnlConvShape& g, double flops,
                                              const std::vector<graph::ConvActivation>& steps) {
  if (c.s.device != mx::Device::cpu || !translation_switches().cpu_conv_library ||
      compute_dtype(x0, c.s) != mx::float32 || (c.has(2) && (c.in(2).ndim() != 1 || c.in(2).shape(0) != g.y[1])))
    return std::nullopt;
  // Below some work (a few microseconds of it) waking oneDNN's second thread and the layout
  // reorders cost more than they save: small convolutions stay MLX's.
  if (flops < static_cast<double>(translation_switches().cpu_conv_library_min_flops)) return std::nullopt;
  DnnlConvShape gt = g;
  if (!parallel_work(flops)) gt.threads = 1;
  // On AVX-512 CPUs, channels in blocks of 16 (MLAS's NCHWc layout) where they are multiples of
  // 16, so that a 3 x 3 stride-1 convolution can run as Winograd's algorithm (oneDNN's kernels
  // read and write that layout only) with its neighbours in the same layout, no reorders between.
  // (graph/fuse_conv_activation.h: all of a graph's convolutions or none.)
  if (!g.transposed && g.x.size() == 4 && c.node.attr_int(graph::kConvBlocked16, 0) == 1) {
    gt.blocked16 = true;
    // (Not on planes under 8 x 8: a 7 x 7 plane's 2 x 2 tiles pad it to 8 x 8, and the
    // transforms cost what the products save.)
    gt.winograd = translation_switches().cpu_conv_winograd && g.groups == 1 && g.x[1] % 16 == 0 &&
                  g.w[2] == 3 && g.w[3] == 3 && g.stride == std::vector<int>{1, 1} &&
                  g.dilation == std::vector<int>{1, 1} && g.y[2] >= 8 && g.y[3] >= 8;
  }
  const auto residual = conv_residual(c);
  if (!steps.empty() && steps[0].kind == graph::ConvActivation::Kind::AddInput && residual &&
      translation_switches().cpu_conv_add && translation_switches().cpu_conv_blocked)
    if (auto y = conv_add_through_library(c, x0, w0, gt, steps, *residual)) return y;
  size_t covered = 0;
  gt.post_ops = post_ops_of(steps, covered);
  auto plan = conv_plan(gt, c.s);
  if (!plan && covered) {  // no fast kernel with those post-ops: the convolution alone, steps as MLX ops
    gt.post_ops.clear();
    covered = 0;
    plan = conv_plan(gt, c.s);
  }
  if (!plan) return std::nullopt;
  auto w = c.prepared("dnnl_conv_w/" + gt.key(), {1}, [&] { return cpu_dnnl_conv_weights(plan, w0, c.s); });
  std::optional<mx::array> bias;
  if (c.has(2)) bias = c.in(2);
  auto y = mx::astype(cpu_dnnl_conv(plan, gt, x0, w, bias, c.s, translation_switches().cpu_conv_blocked), x0.dtype(), c.s);
  const std::vector<graph::ConvActivation> rest(steps.begin() + static_cast<std::ptrdiff_t>(covered), steps.end());
  if (rest.empty()) return y;
  // The steps oneDNN did not take (a kind repeated with other constants) are elementwise with
  // scalar constants: run on the blocked buffer they leave the output blocked, so the next
  // convolution reads it without an unblocking and a reorder back (PP-LCNet's affine after
  // HardSwish after an affine).
  if (rest[0].kind == graph::ConvActivation::Kind::AddInput) {
    // The residual as the Add node would have taken it: over two blocked buffers of one layout
    // (BlockedSteps), a Relu after it joining that pass; else as MLX ops.
    if (!residual) throw std::invalid_argument("a fused residual Add without its operand");
    auto z = blocked_steps(y, {{CpuBlockedStep::Kind::AddBuffer, *residual}}, c.s);
    if (!z) return apply_activations(rest, y, c.s, residual);
    size_t next = 1;
    for (; next < rest.size() && rest[next].kind == graph::ConvActivation::Kind::Relu; ++next)
      if (auto r = blocked_steps(*z, {{CpuBlockedStep::Kind::Relu, std::nullopt}}, c.s)) z = r;
      else break;
    return apply_activations({rest.begin() + static_cast<std::ptrdiff_t>(next), rest.end()}, *z, c.s);
  }
  auto on_buffer = [&](const std::vector<mx::array>& a) { return apply_activations(rest, a[0], c.s); };
  if (auto z = cpu_dnnl_blocked_channel_map(y, {}, on_buffer, c.s)) return z;
  return apply_activations(rest, y, c.s);
}

// 2 x the weight's elements x the batch x the positions of `positions` (spatial dims from 2).
double conv_flops(const mx::array& w, const mx::Shape& positions) {
  double f = 2.0 * static_cast<double>(w.size()) * positions[0];
  for (size_t d = 2; d < positions.size(); ++d) f *= positions[d];
  return f;
}

// Shared claim-time checks for Conv / ConvTranspose.
Support check_conv_common(const NodeQuery& q) {
  if (auto s = float_input(q, 0); !s) return s;
  if (auto s = float_input(q, 1); !s) return s;
  if (auto s = check_auto_pad(q); !s) return s;
  if (auto s = check_rank(q, 0, 3, 5); !s) return s;
  if (auto s = check_rank(q, 1, 3, 5); !s) return s;
  if (q.node.attr_int("group", 1) < 1) return Support::no("group must be >= 1");
  for (auto p : q.node.attr_ints("pads"))
    if (p < 0) return Support::no("negative pads");
  return check_spatial_attrs(q);
}

// auto_pad SAME with a stride above the dilated kernel can ask for a negative total padding
// ((ceil(in/s) - 1) * s + dk - in < 0). A negative end padding only drops unused input (the crop
// in translate_conv matches ORT), but ORT's CPU kernel places the windows differently from that
// crop when the begin padding is negative (fuzz finding): declined at claim time then, and when
// the spatial size or the kernel is not known statically.
Support check_same_pad_stride(const NodeQuery& q) {
  auto auto_pad = q.node.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") return Support::yes();
  auto strides = q.node.attr_ints("strides");
  auto kernel = q.node.attr_ints("kernel_shape");
  const auto* w = q.input_info(1);
  if (kernel.empty() && w && w->has_shape && w->dims.size() > 2)
    kernel.assign(w->dims.begin() + 2, w->dims.end());
  const auto* x = q.input_info(0);
  auto dil = q.node.attr_ints("dilations");
  for (size_t d = 0; d < strides.size(); ++d) {
    int64_t s = strides[d], k = d < kernel.size() ? kernel[d] : -1;
    if (s <= 1) continue;
    if (k < 1) return Support::no("auto_pad SAME with a stride > 1 and an unknown kernel size");
    int64_t dk = (k - 1) * (d < dil.size() ? dil[d] : 1) + 1;
    if (s <= dk) continue;
    int64_t in = x && x->has_shape && x->dims.size() == strides.size() + 2 ? x->dims[2 + d] : -1;
    if (in < 0 || same_begin(((in + s - 1) / s - 1) * s + dk - in, auto_pad == "SAME_UPPER") < 0)
      return Support::no("auto_pad SAME with a stride above the (dilated) kernel size and a "
                         "negative begin padding (ORT places those windows differently)");
  }
  return Support::yes();
}

Support check_conv(const NodeQuery& q) {
  if (auto s = check_conv_common(q); !s) return s;
  return check_same_pad_stride(q);
}

// Validates the weight against the input and returns the kernel's spatial shape.
std::vector<int64_t> conv_kernel(OpContext& c, const mx::array& x, const mx::array& w) {
  if (x.ndim() < 3 || x.ndim() > 5) c.fail("only 1-D, 2-D and 3-D convolutions are supported");
  if (w.ndim() != x.ndim()) c.fail("weight rank differs from input rank");
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  auto ks = c.node.attr_ints("kernel_shape");
  if (!ks.empty() && ks != k) c.fail("kernel_shape does not match the weight's shape");
  return k;
}

namespace {

// A 1x1 convolution with stride 1 and no padding on MLX's CPU device, as one (batched) product over
// NCHW as it lies: y[n, g] = w[g] (Mg x Cg) @ x[n, g] (Cg x H*W). MLX's path would transpose the
// activations to NHWC and back and, for groups, add an im2col view and its copies around a
// batched product. Grouped ones take it before oneDNN (whose grouped kernels reorder to and from
// its blocked layout on every call), others where oneDNN declines (under cpu_dnnl_min_flops).
// std::nullopt where it does not apply.
std::optional<mx::array> pointwise_conv_as_product(OpContext& c, const mx::array& x0, const mx::array& w0,
                                                   const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                                                   const std::vector<int>& lo, const std::vector<int>& hi, int groups,
                                                   const mx::Shape& out_shape, mx::Dtype cd,
                                                   const std::vector<ConvActivation>& steps) {
  if (c.s.device != mx::Device::cpu || !cpu_row_kernels_enabled()) return std::nullopt;
  for (size_t d = 0; d < kernel.size(); ++d)
    if (kernel[d] != 1 || strides[d] != 1 || lo[d] != 0 || hi[d] != 0) return std::nullopt;
  const int N = x0.shape(0), C = x0.shape(1), M = w0.shape(0), cg = C / groups, mg = M / groups;
  if (cg == 1 && groups > 1) return std::nullopt;  // depthwise: a per-channel scale, not a product
  int P = 1;
  for (int d = 2; d < static_cast<int>(x0.ndim()); ++d) P *= x0.shape(d);
  if (cd == mx::float32 && x0.dtype() == mx::float32 && (!c.has(2) || c.in(2).ndim() == 1)) {
    // The EP's kernel over NCHW as it lies (kernels/cpu/pointwise.cc), bias and a first Relu inside.
    auto w = c.prepared("pointwise_conv_w", {1}, [&] { return mx::contiguous(mx::reshape(w0, {M, cg}, c.s), false, c.s); });
    std::optional<mx::array> bias;
    if (c.has(2)) bias = mx::astype(c.in(2), mx::float32, c.s);
    // A fused residual Add (and the Relu after it) in the tiles too.
    const bool add = !steps.empty() && steps[0].kind == graph::ConvActivation::Kind::AddInput;
    const size_t first = add ? 1 : 0;
    const bool relu = steps.size() > first && steps[first].kind == graph::ConvActivation::Kind::Relu;
    const double flops = 2.0 * N * M * cg * P;
    const bool parallel = parallel_work(flops);
    const auto residual = conv_residual(c);
    if (auto y = cpu_pointwise_conv(x0, w, bias, groups, relu, parallel, c.is_constant(1), c.s,
                                    add ? residual : std::nullopt))
      return apply_activations({steps.begin() + static_cast<std::ptrdiff_t>(first + (relu ? 1 : 0)), steps.end()}, *y,
                               c.s, residual);
    if (add) {  // a residual of another shape (broadcast): the kernel without it, the Add after
      if (auto y = cpu_pointwise_conv(x0, w, bias, groups, false, parallel, c.is_constant(1), c.s))
        return apply_activations(steps, *y, c.s, residual);
    }
  }
  // Weight and bias in their product shapes once per program, and a single image without its
  // batch axis (no broadcast of w over it): each reshape or broadcast is a primitive every run.
  const std::string dt = std::to_string(static_cast<int>(cd.val()));
  auto w = c.prepared("pointwise_w/" + dt, {1}, [&] { return mx::reshape(mx::astype(w0, cd, c.s), {groups, mg, cg}, c.s); });
  auto x = N == 1 ? mx::reshape(mx::astype(x0, cd, c.s), {groups, cg, P}, c.s)
                  : mx::reshape(mx::astype(x0, cd, c.s), {N, groups, cg, P}, c.s);
  auto y = mx::reshape(mx::matmul(w, x, c.s), out_shape, c.s);  // (N, g, Mg, P) -> (N, M, D..)
  if (c.has(2)) {
    mx::Shape bshape(x0.ndim() - 1, 1);
    bshape[0] = M;
    y = mx::add(y, c.prepared("pointwise_b/" + dt, {2}, [&] { return mx::reshape(mx::astype(c.in(2), cd, c.s), bshape, c.s); }), c.s);
  }
  return mx::astype(apply_activations(steps, y, c.s, conv_residual(c)), x0.dtype(), c.s);
}

}  // namespace

// A 2-D float32 depthwise convolution of small planes as the EP's kernel over NCHW
// (kernels/cpu/depthwise.cc), where its input comes in NCHW from the EP's pointwise kernel or a
// layout op (shufflenet's channel shuffles): oneDNN would reorder it in and its output back.
// Anywhere else (after a oneDNN convolution and its elementwise tail, as in MobileNet blocks)
// oneDNN keeps the chain in its blocked layout, which measured faster; so do larger planes (its
// blocked kernel vectorizes across channels, and a reorder is a small share of the work).
constexpr int64_t kDepthwiseMaxPositions = 1024;

std::optional<mx::array> depthwise_conv_kernel(OpContext& c, const mx::array& x0, const mx::array& w0,
                                               const std::vector<int64_t>& strides, const std::vector<int>& lo,
                                               const std::vector<int>& hi, const std::vector<int64_t>& dil, int groups,
                                               const mx::Shape& out_shape, const std::vector<ConvActivation>& steps) {
  const auto& sw = translation_switches();
  if (c.s.device != mx::Device::cpu || !sw.cpu_depthwise || x0.ndim() != 4 || x0.dtype() != mx::float32 ||
      groups != x0.shape(1) || w0.shape(0) != groups || (c.has(2) && c.in(2).ndim() != 1) ||
      static_cast<int64_t>(out_shape[2]) * out_shape[3] > kDepthwiseMaxPositions)
    return std::nullopt;
  if (sw.cpu_conv_library) {
    const std::string_view from = x0.has_primitive() ? x0.primitive().name() : "";
    if (from != "PointwiseConv" && from != "Reshape" && from != "Transpose" && from != "DepthwiseConv")
      return std::nullopt;
  }
  std::optional<mx::array> bias;
  if (c.has(2)) bias = mx::astype(c.in(2), mx::float32, c.s);
  const bool relu = !steps.empty() && steps[0].kind == graph::ConvActivation::Kind::Relu;
  const double flops = 2.0 * static_cast<double>(w0.size()) * out_shape[0] * out_shape[2] * out_shape[3];
  const bool parallel = parallel_work(flops);
  auto y = cpu_depthwise_conv(x0, w0, bias, to_int(strides), lo, hi, to_int(dil), relu, parallel, c.s);
  if (!y) return std::nullopt;
  return apply_activations({steps.begin() + (relu ? 1 : 0), steps.end()}, *y, c.s, conv_residual(c));
}

Outputs translate_conv(OpContext& c) {
  const auto& n = c.node;
  const mx::array& x0 = c.in(0);
  const mx::array& w0 = c.in(1);
  auto kernel = conv_kernel(c, x0, w0);
  const int rank = x0.ndim();
  const size_t nd = rank - 2;
  const int groups = static_cast<int>(n.attr_int("group", 1));
  const int C = x0.shape(1), M = w0.shape(0);
  if (C % groups || M % groups || w0.shape(1) * groups != C)
    c.fail("input channels " + std::to_string(C) + " / weight " + std::to_string(w0.shape(1)) +
           " do not match group " + std::to_string(groups));
  auto strides = spatial_attr(n, "strides", nd, 1);
  auto dil = spatial_attr(n, "dilations", nd, 1);
  auto pads = pads_attr(n, nd);
  auto auto_pad = n.attr_string("auto_pad", "NOTSET");

  mx::Dtype cd = compute_dtype(x0, c.s);
  mx::array x = mx::transpose(mx::astype(x0, cd, c.s), channels_last_perm(rank), c.s);
  // The OHWI weight is prepared once per program when W is an initializer: as a lazy transpose
  // MLX's CPU conv would copy it into that layout on every run.
  mx::array w = c.prepared("conv_w_ohwi/" + std::to_string(static_cast<int>(cd.val())), {1}, [&] {
    return mx::contiguous(mx::transpose(mx::astype(w0, cd, c.s), channels_last_perm(rank), c.s), false, c.s);
  });

  std::vector<int> lo(nd), hi(nd);
  mx::Shape out_shape{x0.shape(0), M};
  mx::Shape crop_start(rank, 0), crop_stop = x.shape();
  bool crop = false;
  for (size_t d = 0; d < nd; ++d) {
    int64_t in = x0.shape(2 + d), dk = (kernel[d] - 1) * dil[d] + 1;
    int64_t b = pads[d], e = pads[nd + d];
    if (auto_pad == "VALID") {
      b = e = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      // output = ceil(in / stride); the padding that needs is split per ONNX's rule.
      int64_t out = (in + strides[d] - 1) / strides[d];
      int64_t total = (out - 1) * strides[d] + dk - in;
      b = same_begin(total, auto_pad == "SAME_UPPER");
      e = total - b;
    }
    // A negative SAME padding (kernel smaller than stride) drops input: crop it, since MLX's
    // convolutions take non-negative padding on every backend.
    if (b < 0) {
      crop_start[1 + d] = static_cast<int>(-b);
      b = 0;
      crop = true;
    }
    if (e < 0) {
      crop_stop[1 + d] = static_cast<int>(in + e);
      e = 0;
      crop = true;
    }
    int64_t padded = in + b + e;
    if (padded < dk) c.fail("the dilated kernel is larger than the padded input");
    lo[d] = static_cast<int>(b);
    hi[d] = static_cast<int>(e);
    out_shape.push_back(static_cast<int>((padded - dk) / strides[d] + 1));
  }
  const auto steps = graph::conv_activations(n);
  if (x0.size() == 0 || w0.size() == 0)
    return {apply_activations(steps, mx::zeros(out_shape, x0.dtype(), c.s), c.s, conv_residual(c))};
  if (!crop) {
    const DnnlConvShape g{x0.shape(), w0.shape(), out_shape, to_int(strides), lo, hi, to_int(dil), groups, c.has(2), {}};
    if (auto y = depthwise_conv_kernel(c, x0, w0, strides, lo, hi, dil, groups, out_shape, steps)) return {*y};
    if (groups > 1)  // grouped: one product beats oneDNN's grouped kernel with its reorders
      if (auto y = pointwise_conv_as_product(c, x0, w0, kernel, strides, lo, hi, groups, out_shape, cd, steps)) return {*y};
    if (auto y = conv_through_library(c, x0, w0, g, conv_flops(w0, out_shape), steps)) return {*y};
    if (auto y = pointwise_conv_as_product(c, x0, w0, kernel, strides, lo, hi, groups, out_shape, cd, steps)) return {*y};
  }
  if (crop) x = mx::slice(x, crop_start, crop_stop, c.s);

  mx::array y = grouped_conv(x, w, to_int(strides), lo, hi, to_int(dil), {}, groups, false, c.s);
  if (c.has(2)) y = mx::add(y, mx::astype(c.in(2), cd, c.s), c.s);  // (M,) on the channel axis
  y = mx::transpose(y, channels_first_perm(rank), c.s);
  return {mx::astype(apply_activations(steps, y, c.s, conv_residual(c)), x0.dtype(), c.s)};
}

Support check_conv_transpose(const NodeQuery& q) { return check_conv_common(q); }

// ConvTranspose as a convolution of the stride-dilated input with the flipped kernel:
//   y = conv(dilate(x, stride), flip(w), padding (dk-1-pad_begin, dk-1-pad_end+output_padding))
// where dk = (k-1)*dilation + 1. Padding may come out negative (large pads): then the
// convolution runs with padding clamped at 0 and the result is sliced.
Outputs translate_conv_transpose(OpContext& c) {
  const auto& n = c.node;
  const mx::array& x0 = c.in(0);
  const mx::array& w0 = c.in(1);
  auto kernel = conv_kernel(c, x0, w0);
  const int rank = x0.ndim();
  const size_t nd = rank - 2;
  const int groups = static_cast<int>(n.attr_int("group", 1));
  const int C = x0.shape(1);
  if (C % groups || w0.shape(0) != C)
    c.fail("weight's first dim must equal input channels and be divisible by group");
  const int cg = C / groups, mg = w0.shape(1), M = mg * groups;
  auto strides = spatial_attr(n, "strides", nd, 1);
  auto dil = spatial_attr(n, "dilations", nd, 1);
  auto out_pad = spatial_attr(n, "output_padding", nd, 0);
  auto pads = pads_attr(n, nd);
  auto auto_pad = n.attr_string("auto_pad", "NOTSET");
  auto out_attr = n.attr_ints("output_shape");
  if (out_attr.size() == nd + 2) out_attr.erase(out_attr.begin(), out_attr.begin() + 2);
  if (!out_attr.empty() && out_attr.size() != nd) c.fail("output_shape has the wrong length");

  std::vector<int> lo(nd), hi(nd), lo_c(nd), hi_c(nd);
  mx::Shape out_shape{x0.shape(0), M};
  mx::Shape start(rank, 0), stop;
  bool slice_out = false;
  for (size_t d = 0; d < nd; ++d) {
    int64_t in = x0.shape(2 + d), s = strides[d], dk = (kernel[d] - 1) * dil[d] + 1;
    int64_t full = s * (in - 1) + out_pad[d] + dk;  // output length with no padding
    int64_t b = pads[d], e = pads[nd + d], out = 0;
    bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!out_attr.empty() || same) {
      // output_shape (or in*stride for SAME) fixes the output; pads are derived from it.
      out = out_attr.empty() ? in * s : out_attr[d];
      int64_t total = full - out;
      // A larger output (by less than a stride, like output_padding) gets zeros at the end;
      // ORT rejects anything more.
      if (total <= -s && !out_attr.empty())
        c.fail("output_shape is larger than the input and convolution parameters allow");
      b = total < 0 ? 0 : same_begin(total, auto_pad == "SAME_UPPER");
    } else {
      if (auto_pad == "VALID") b = e = 0;
      out = full - b - e;
    }
    if (out < 0) c.fail("pads exceed the output size");
    int64_t dilated = s * (in - 1) + 1;
    int64_t l = dk - 1 - b;
    int64_t h = out - dilated - l + dk - 1;
    lo[d] = static_cast<int>(l);
    hi[d] = static_cast<int>(h);
    lo_c[d] = static_cast<int>(std::max<int64_t>(l, 0));
    hi_c[d] = static_cast<int>(std::max<int64_t>(h, 0));
    if (l < 0 || h < 0) slice_out = true;
    start[1 + d] = lo_c[d] - lo[d];
    out_shape.push_back(static_cast<int>(out));
  }
  int64_t out_numel = 1;
  for (auto d : out_shape) out_numel *= d;
  if (x0.size() == 0 || w0.size() == 0 || out_numel == 0)
    return {mx::zeros(out_shape, x0.dtype(), c.s)};

  if (c.s.device == mx::Device::cpu && translation_switches().cpu_patch_deconv && nd == 2 && groups == 1 && !slice_out) {
    // Kernel = stride, no padding: every input position its own output patch (a U-Net's or a
    // DB head's upsampling), computed over NCHW as it lies.
    bool patch = true;
    for (size_t d = 0; d < nd; ++d)
      patch = patch && kernel[d] == strides[d] && dil[d] == 1 && lo[d] == kernel[d] - 1 && hi[d] == kernel[d] - 1;
    if (patch) {
      std::optional<mx::array> bias;
      if (c.has(2)) bias = mx::astype(c.in(2), mx::float32, c.s);
      const double flops = conv_flops(w0, x0.shape());
      const bool parallel = parallel_work(flops);
      if (auto y = cpu_patch_deconv(x0, w0, bias, parallel, c.s)) return {*y};
    }
  }
  {
    // oneDNN's deconvolution pads the output: ONNX's begin padding, and the end padding less
    // output_padding (the conv-equivalent lo/hi above, read back).
    std::vector<int> pl(nd), pr(nd);
    for (size_t d = 0; d < nd; ++d) {
      const int dk = static_cast<int>((kernel[d] - 1) * dil[d] + 1);
      pl[d] = dk - 1 - lo[d];
      pr[d] = dk - 1 - hi[d];
    }
    DnnlConvShape g{x0.shape(), w0.shape(), out_shape, to_int(strides), pl, pr, to_int(dil), groups, c.has(2), {}};
    g.transposed = true;
    if (auto y = conv_through_library(c, x0, w0, g, conv_flops(w0, x0.shape()), {})) return {*y};
  }
  mx::Dtype cd = compute_dtype(x0, c.s);
  mx::array x = mx::transpose(mx::astype(x0, cd, c.s), channels_last_perm(rank), c.s);
  // (C, M/g, K..) -> (g, C/g, M/g, K..) -> (g, M/g, K.., C/g) -> (M, K.., C/g)
  mx::Shape gshape{groups, cg, mg};
  gshape.insert(gshape.end(), w0.shape().begin() + 2, w0.shape().end());
  std::vector<int> perm{0, 2};
  for (int i = 0; i < static_cast<int>(nd); ++i) perm.push_back(3 + i);
  perm.push_back(1);
  mx::Shape wshape{M};
  wshape.insert(wshape.end(), w0.shape().begin() + 2, w0.shape().end());
  wshape.push_back(cg);
  mx::array w = c.prepared("convT_w/" + std::to_string(static_cast<int>(cd.val())), {1}, [&] {  // see Conv
    return mx::contiguous(mx::reshape(mx::transpose(mx::reshape(mx::astype(w0, cd, c.s), gshape, c.s), perm, c.s),
                                      wshape, c.s), false, c.s);
  });

  mx::array y = grouped_conv(x, w, std::vector<int>(nd, 1), lo_c, hi_c, to_int(dil),
                             to_int(strides), groups, /*flip=*/true, c.s);
  if (slice_out) {
    stop = y.shape();
    for (size_t d = 0; d < nd; ++d) stop[1 + d] = start[1 + d] + out_shape[2 + d];
    y = mx::slice(y, start, stop, c.s);
  }
  if (c.has(2)) y = mx::add(y, mx::astype(c.in(2), cd, c.s), c.s);
  y = mx::transpose(y, channels_first_perm(rank), c.s);
  return {mx::astype(y, x0.dtype(), c.s)};
}

constexpr const char* kPoolNotes = "1-D to 3-D";

const OpEntry kOps[] = {
    {"", "Conv", 1, kAnyOpset, check_conv, translate_conv,
     "1-D to 3-D; 3-D grouped convolutions run one group at a time; float64 runs as im2col + "
     "matmul (MLX's conv accumulates float64 in float32)"},
    {"", "ConvTranspose", 1, kAnyOpset, check_conv_transpose, translate_conv_transpose,
     "1-D to 3-D; an output_shape a stride or more past the natural output is an error (as in "
     "ORT)"},
    {"", "MaxPool", 1, kAnyOpset, check_max_pool, translate_max_pool,
     "1-D to 3-D; the Indices output is supported"},
    {"", "AveragePool", 1, kAnyOpset, check_avg_pool, translate_avg_pool, kPoolNotes},
    {"", "LpPool", 1, kAnyOpset, check_lp_pool, translate_lp_pool, kPoolNotes},
    {"", "GlobalAveragePool", 1, kAnyOpset, check_global_pool, translate_global_avg_pool},
    {"", "GlobalMaxPool", 1, kAnyOpset, check_global_pool, translate_global_max_pool},
    {"", "GlobalLpPool", 1, kAnyOpset, check_global_pool, translate_global_lp_pool},
    {"", "Resize", 10, kAnyOpset, check_resize, translate_resize,
     "linear/cubic on integer inputs declined; align_corners with scales divides by the integer "
     "output length, as the spec and ORT's CPU EP do (ONNX's reference, and the "
     "test_resize_downsample_scales_*_align_corners expected outputs, by input length * scale)"},
    {"", "Upsample", 7, 9, check_upsample, translate_upsample},
    {"", "GridSample", 16, kAnyOpset, check_grid_sample, translate_grid_sample,
     "1 to 3 spatial dims; linear/cubic need a float input"},
    {"", "RoiAlign", 10, kAnyOpset, check_roi_align, translate_roi_align,
     "sampling_ratio 0 (a grid per region from its size) reads the rois on the host"},
};

}  // namespace

std::span<const OpEntry> nn_ops() { return kOps; }

}  // namespace ortmlx::ops
