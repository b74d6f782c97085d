// Shared by the nn family files: nn.cc (Conv, ConvTranspose and the family table), pool.cc
// (the pooling ops), resize.cc (Resize, Upsample), grid_sample.cc and roi_align.cc. ONNX lays
// images out channels-first (N, C, D1..Dn); MLX's convolutions want channels-last (N, D1..Dn, C).
#pragma once

#include <functional>

#include <string>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops::nn {

// (N, C, D1..Dn) -> (N, D1..Dn, C) and back.
std::vector<int> channels_last_perm(int rank);
std::vector<int> channels_first_perm(int rank);

// An int-list attribute with one value per spatial dim; `def` fills it when absent or empty.
// Throws (-> decline / ORT error) when present with the wrong length.
std::vector<int64_t> spatial_attr(const graph::Node& n, const char* name, size_t dims, int64_t def);
// pads: [begin_1..begin_n, end_1..end_n], zeros when absent.
std::vector<int64_t> pads_attr(const graph::Node& n, size_t dims);

// Declines an auto_pad value ONNX does not define.
Support check_auto_pad(const NodeQuery& q);
// Declines when input 0's rank is known and strides / dilations / kernel_shape /
// output_padding (one per spatial dim) or pads (two per spatial dim) have another length.
Support check_spatial_attrs(const NodeQuery& q);
// Declines input i when its rank is known and outside [min_rank, max_rank].
Support check_rank(const NodeQuery& q, size_t i, int min_rank, int max_rank);

// fp16/bf16 on the CPU backend are computed in float32 (see common.h); this is the dtype the
// math runs in for `x`.
mx::Dtype compute_dtype(const mx::array& x, mx::Stream s);

// Sliding-window geometry over nd spatial dims: kernel, stride, dilation, the explicit
// padding at each end (lo/hi), and the input/output lengths.
struct Window {
  size_t nd = 0;
  std::vector<int64_t> kernel, stride, dil, lo, hi, in, out;
  bool empty() const;  // some output length is 0
};

// Every window of x as a strided view: the spatial dims [first, first+nd) of x become
// out_1..out_n in place and k_1..k_n are appended, e.g. (N, C, D..) -> (N, C, out.., k..) for
// first = 2. The input is padded with `pad_value` (lo at the start, and at the end whatever the
// last window needs) or cropped where that is negative. (pool.cc)
mx::array windows(const mx::array& x, const Window& w, int first, const mx::array& pad_value,
                  mx::Stream s);

// The same padded input, one strided view per kernel tap (last kernel dim fastest): visit(view,
// tap) with view shaped like windows()'s without the k dims: the elements that tap reads for
// every output position. Folding the views elementwise (max, add, multiply-add) is what MLX
// fuses into one kernel when compiled; its reductions over window axes take a slow generic path
// on the CPU. (pool.cc)
void for_each_tap(const mx::array& x, const Window& w, int first, const mx::array& pad_value,
                  mx::Stream s, const std::function<void(const mx::array&, int64_t)>& visit);

// pool.cc
Support check_max_pool(const NodeQuery& q);
Support check_avg_pool(const NodeQuery& q);
Support check_lp_pool(const NodeQuery& q);
Support check_global_pool(const NodeQuery& q);
Outputs translate_max_pool(OpContext& c);
Outputs translate_avg_pool(OpContext& c);
Outputs translate_lp_pool(OpContext& c);
Outputs translate_global_avg_pool(OpContext& c);
Outputs translate_global_max_pool(OpContext& c);
Outputs translate_global_lp_pool(OpContext& c);

// resize.cc
Support check_resize(const NodeQuery& q);
Support check_upsample(const NodeQuery& q);
Outputs translate_resize(OpContext& c);
Outputs translate_upsample(OpContext& c);

// grid_sample.cc
Support check_grid_sample(const NodeQuery& q);
Outputs translate_grid_sample(OpContext& c);

// roi_align.cc
Support check_roi_align(const NodeQuery& q);
Outputs translate_roi_align(OpContext& c);

}  // namespace ortmlx::ops::nn
