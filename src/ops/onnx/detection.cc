// NonMaxSuppression (opsets 10, 11).
//
// The output's length (how many boxes survive) depends on the data, and the algorithm is a
// sequential greedy loop, so it runs on the host: boxes and scores are read through the engine's
// host hook (which keeps this input signature eager, as a data-dependent result must be) and
// the selected indices come back as an int64 (count, 3) array of [batch, class, box] rows.
//
// The loop follows ORT's CPU kernel, the reference EP: candidates are boxes whose score is
// strictly above score_threshold (all boxes without one), visited by descending score with ties
// broken by the lower box index; a candidate is kept unless its IoU with an already kept box of
// the same class is strictly above iou_threshold; at most max_output_boxes_per_class per class
// (0 or absent: none). IoU is computed in float, as there: boxes whose intersection or area is
// not positive never suppress each other.
#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

struct Box {
  float x0, y0, x1, y1;  // min/max corners
};

// center_point_box 0: [y1, x1, y2, x2] with the corners in any order; 1: [xc, yc, w, h].
Box to_box(const float* b, bool center) {
  if (center) {
    const float hw = b[2] / 2, hh = b[3] / 2;
    return {b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh};
  }
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

bool suppresses(const Box& a, const Box& b, float iou_threshold) {
  const float ix0 = std::max(a.x0, b.x0), ix1 = std::min(a.x1, b.x1);
  if (ix1 <= ix0) return false;
  const float iy0 = std::max(a.y0, b.y0), iy1 = std::min(a.y1, b.y1);
  if (iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  if (inter <= 0.f) return false;
  const float area_a = (a.x1 - a.x0) * (a.y1 - a.y0), area_b = (b.x1 - b.x0) * (b.y1 - b.y0);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0.f || area_b <= 0.f || uni <= 0.f) return false;
  return inter / uni > iou_threshold;
}

Support check_nms(const NodeQuery& q) {
  if (auto r = input_dtype_in(q, 0, {DType::Float32}); !r) return r;
  if (auto r = input_dtype_in(q, 1, {DType::Float32}); !r) return r;
  if (auto r = input_dtype_in(q, 2, {DType::Int64}); !r) return r;
  for (size_t i : {3, 4})
    if (auto r = input_dtype_in(q, i, {DType::Float32}); !r) return r;
  auto cpb = q.node.attr_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1) return Support::no("center_point_box must be 0 or 1");
  return Support::yes();
}

Outputs translate_nms(OpContext& c) {
  const auto& bshape = c.in(0).shape();
  const auto& sshape = c.in(1).shape();
  if (bshape.size() != 3 || bshape[2] != 4) c.fail("boxes must be (batch, boxes, 4)");
  if (sshape.size() != 3 || sshape[0] != bshape[0] || sshape[2] != bshape[1])
    c.fail("scores must be (batch, classes, boxes) matching boxes");
  const int64_t max_out = c.has(2) ? std::max<int64_t>(c.host_int(2), 0) : 0;
  const float iou = c.has(3) ? static_cast<float>(c.host_float(3)) : 0.f;
  const bool has_thr = c.has(4);
  const float thr = has_thr ? static_cast<float>(c.host_float(4)) : 0.f;
  if (iou < 0.f || iou > 1.f) c.fail("iou_threshold must be in [0, 1]");
  const bool center = c.node.attr_int("center_point_box", 0) != 0;
  const int batches = bshape[0], classes = sshape[1], n = bshape[1];

  std::vector<int64_t> rows;  // flattened [batch, class, box] triples
  if (max_out > 0 && n > 0 && classes > 0) {
    const auto bd = c.host_floats(0), sd = c.host_floats(1);
    const std::vector<float> boxes_f(bd.begin(), bd.end()), scores_f(sd.begin(), sd.end());
    std::vector<Box> boxes(static_cast<size_t>(n));
    std::vector<int> order;
    std::vector<int> kept;
    for (int b = 0; b < batches; ++b) {
      for (int i = 0; i < n; ++i) boxes[i] = to_box(&boxes_f[(static_cast<size_t>(b) * n + i) * 4], center);
      for (int k = 0; k < classes; ++k) {
        const float* sc = &scores_f[(static_cast<size_t>(b) * classes + k) * n];
        order.clear();
        for (int i = 0; i < n; ++i)
          if (!has_thr || sc[i] > thr) order.push_back(i);
        // Descending score; stable, so equal scores keep ascending box index.
        std::stable_sort(order.begin(), order.end(), [&](int l, int r) { return sc[l] > sc[r]; });
        kept.clear();
        for (int i : order) {
          if (static_cast<int64_t>(kept.size()) >= max_out) break;
          bool keep = true;
          for (int j : kept)
            if (suppresses(boxes[i], boxes[j], iou)) {
              keep = false;
              break;
            }
          if (keep) kept.push_back(i);
        }
        for (int i : kept) rows.insert(rows.end(), {int64_t{b}, int64_t{k}, int64_t{i}});
      }
    }
  }
  const int count = static_cast<int>(rows.size() / 3);
  if (count == 0) return {mx::zeros({0, 3}, mx::int64, c.s)};
  return {mx::array(rows.begin(), {count, 3}, mx::int64)};
}

const OpEntry kOps[] = {
    {"", "NonMaxSuppression", 10, kAnyOpset, check_nms, translate_nms,
     "float32 boxes/scores; runs on the host (the output length is data-dependent), so the "
     "node's signature stays eager"},
};

}  // namespace

std::span<const OpEntry> detection_ops() { return kOps; }

}  // namespace ortmlx::ops
