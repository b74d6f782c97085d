// AffineGrid (opset 20): the sampling grid GridSample reads, from a batch of affine matrices.
//
//   theta (N, 2, 3), size (N, C, H, W)     -> grid (N, H, W, 2)
//   theta (N, 3, 4), size (N, C, D, H, W)  -> grid (N, D, H, W, 3)
//
// `size` fixes the output shape, so it is read on the host, and the base grid (the normalized
// coordinates of every output pixel, innermost dim first: [x, y, (z,) 1]) is built there too.
// The per-batch product base @ theta^T is an MLX matmul on the run-time theta.
#include <string>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// Normalized coordinates of n pixel positions along one dim, as ORT's kernel builds them:
// Eigen's LinSpaced(n, -1, 1), scaled by (n - 1) / n without align_corners (pixel centers:
// (2i + 1) / n - 1). For n == 1 LinSpaced returns its upper end, so ORT's single position is 1
// with align_corners (ONNX's reference, via numpy.linspace, says -1) and 0 without; this
// follows ORT, the reference EP here.
// Computed in double; float grids round once at the end (ORT computes in T: the difference is
// within float rounding).
std::vector<double> axis_coords(int64_t n, bool align_corners) {
  std::vector<double> v(static_cast<size_t>(n));
  if (n == 1) {
    v[0] = align_corners ? 1.0 : 0.0;
    return v;
  }
  const double step = 2.0 / static_cast<double>(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    // Eigen fills the first half from the low end and the second from the high end.
    double x = i < n / 2 ? -1.0 + static_cast<double>(i) * step
                         : 1.0 - static_cast<double>(n - 1 - i) * step;
    if (!align_corners) x = x * static_cast<double>(n - 1) / static_cast<double>(n);
    v[i] = x;
  }
  return v;
}

Support check_affine_grid(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  if (int r = q.input_rank(0); r >= 0 && r != 3)
    return Support::no("theta must be 3-D (N, 2, 3) or (N, 3, 4)");
  return Support::yes();
}

Outputs translate_affine_grid(OpContext& c) {
  const mx::array& theta = c.in(0);
  const auto size = c.host_ints(1);
  const bool align = c.node.attr_int("align_corners", 0) != 0;
  if (size.size() != 4 && size.size() != 5) c.fail("size must have 4 (2-D) or 5 (3-D) elements");
  const int nd = static_cast<int>(size.size()) - 2;  // spatial dims: 2 or 3
  if (theta.ndim() != 3 || theta.shape(1) != nd || theta.shape(2) != nd + 1)
    c.fail("theta must be (N, " + std::to_string(nd) + ", " + std::to_string(nd + 1) +
           ") for a " + std::to_string(nd) + "-D size");
  if (theta.shape(0) != size[0]) c.fail("theta's batch differs from size[0]");
  int64_t points = 1;
  for (int d = 0; d < nd; ++d) {
    if (size[2 + d] < 0) c.fail("size has a negative dim");
    points *= size[2 + d];
  }
  if (points > INT32_MAX / (nd + 1)) c.fail("the grid is too large");

  // Spatial dims in ONNX order (D,) H, W; coordinates are listed innermost first: x (W), y (H),
  // z (D). Rows run over the output positions in row-major order.
  std::vector<std::vector<double>> coords;
  for (int d = 0; d < nd; ++d) coords.push_back(axis_coords(size[2 + d], align));
  std::vector<double> base(static_cast<size_t>(points * (nd + 1)));
  std::vector<int64_t> idx(nd, 0);
  for (int64_t p = 0; p < points; ++p) {
    double* row = &base[p * (nd + 1)];
    for (int k = 0; k < nd; ++k) row[k] = coords[nd - 1 - k][idx[nd - 1 - k]];
    row[nd] = 1.0;
    for (int d = nd - 1; d >= 0; --d) {  // next position, last dim fastest
      if (++idx[d] < size[2 + d]) break;
      idx[d] = 0;
    }
  }
  // float64 stays float64; halves are computed in float32 (the base grid needs its resolution).
  const mx::Shape bshape{static_cast<int>(points), nd + 1};
  const bool f64 = theta.dtype() == mx::float64;
  auto b = f64 ? mx::array(base.begin(), bshape, mx::float64)
               : mx::array(std::vector<float>(base.begin(), base.end()).begin(), bshape,
                           mx::float32);
  auto th = mx::astype(theta, b.dtype(), c.s);
  // (P, nd+1) @ (N, nd+1, nd) -> (N, P, nd)
  auto g = mx::matmul(b, mx::swapaxes(th, 1, 2, c.s), c.s);
  mx::Shape out{theta.shape(0)};
  for (int d = 0; d < nd; ++d) out.push_back(static_cast<int>(size[2 + d]));
  out.push_back(nd);
  return {mx::astype(mx::reshape(g, out, c.s), theta.dtype(), c.s)};
}

const OpEntry kOps[] = {
    {"", "AffineGrid", 20, kAnyOpset, check_affine_grid, translate_affine_grid,
     "2-D and 3-D; size is read on the host; a 1-pixel dim follows ORT (1 with align_corners)"},
};

}  // namespace

std::span<const OpEntry> affine_grid_ops() { return kOps; }

}  // namespace ortmlx::ops
