// Signal generators: HannWindow, HammingWindow, BlackmanWindow (opset 17) and MelWeightMatrix
// (opset 17). DFT/STFT live in math.cc.
//
// Every input of these ops is a scalar that fixes the output's *shape* (window size, number of
// bins), so it is read on the host and the whole output is computed there, in the precision
// ORT's CPU kernels use (onnxruntime/core/providers/cpu/signal/window_functions.cc): double for
// the window terms and mel scale conversions (the range check of the edges is in float there).
// The result becomes a constant of the
// translated graph; the engine records the host reads, so a compiled replay is keyed by them.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// The output_datatype attribute (default float). The value is a TensorProto type number.
DType output_datatype(const graph::Node& n) {
  return static_cast<DType>(n.attr_int("output_datatype", static_cast<int64_t>(DType::Float32)));
}

Support check_output_datatype(const NodeQuery& q) {
  DType t = output_datatype(q.node);
  if (!is_numeric(t) || !to_mlx_dtype(t))
    return Support::no(std::string("output_datatype ") + graph::dtype_name(t) +
                       " has no MLX dtype");
  if (q.gpu && t == DType::Float64) return Support::no("float64 output on a GPU");
  return Support::yes();
}

// Host values -> an MLX array of the requested type. Floats are rounded from double (as
// static_cast<T> does); integers are truncated toward zero (also static_cast<T>).
mx::array host_to_array(const std::vector<double>& v, mx::Shape shape, DType t, mx::Stream s) {
  if (t == DType::Float64) return mx::array(v.begin(), shape, mx::float64);
  if (graph::is_float(t)) {
    std::vector<float> f(v.begin(), v.end());
    return mx::astype(mx::array(f.begin(), shape, mx::float32), mlx_dtype(t), s);
  }
  std::vector<int64_t> i(v.size());
  for (size_t k = 0; k < v.size(); ++k) i[k] = static_cast<int64_t>(v[k]);
  return mx::astype(mx::array(i.begin(), shape, mx::int64), mlx_dtype(t), s);
}

// ---- windows ----------------------------------------------------------------------------------

// A generalized cosine window: a0 - a1 cos(w n) + a2 cos(2 w n), w = 2 pi / N with N = size
// (periodic) or size - 1 (symmetric). ORT's kernel uses pi = 3.14159265 (not M_PI); the
// ~1e-9 relative difference is far below float32 rounding, but double outputs follow it too.
// The coefficients are floats there (0.42f, 25.f / 46.f, ...), widened to double per term.
Outputs cosine_window(OpContext& c, float a0, float a1, float a2) {
  const int64_t size = c.host_int(0);
  if (size < 0) c.fail("size must be non-negative");
  if (size > INT32_MAX) c.fail("size is too large");
  const bool periodic = c.node.attr_int("periodic", 1) != 0;
  constexpr double kPi = 3.14159265;
  // A symmetric window of size 1 divides by zero: ORT's kernel then yields NaN (0 * inf), and
  // so does this formula.
  const double step = 2 * kPi / static_cast<double>(periodic ? size : size - 1);
  std::vector<double> v(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const double a = step * static_cast<double>(i);
    v[i] = a0 - a1 * std::cos(a) + (a2 == 0 ? 0.0 : double{a2} * std::cos(2 * a));
  }
  return {host_to_array(v, {static_cast<int>(size)}, output_datatype(c.node), c.s)};
}

Outputs translate_hann(OpContext& c) { return cosine_window(c, 0.5f, 0.5f, 0.f); }
Outputs translate_hamming(OpContext& c) {
  constexpr float a0 = 25.f / 46.f;
  return cosine_window(c, a0, 1.f - a0, 0.f);
}
Outputs translate_blackman(OpContext& c) {
  // ORT derives the coefficients from alpha = 0.16 in float: a0 = 0.5f - 0.08f is not 0.42f.
  constexpr float a2 = 0.16f / 2.f;
  return cosine_window(c, 0.5f - a2, 0.5f, a2);
}

Support check_window(const NodeQuery& q) {
  if (auto r = input_dtype_in(q, 0, {DType::Int32, DType::Int64}); !r) return r;
  return check_output_datatype(q);
}

// ---- MelWeightMatrix --------------------------------------------------------------------------

double hz_to_mel(double hz) { return 2595 * std::log10(1 + hz / 700); }
double mel_to_hz(double mel) { return 700 * (std::pow(10, mel / 2595) - 1); }

// A bank of num_mel_bins triangular filters over the num_spectrogram_bins = dft_length/2 + 1
// bins of a real DFT, shape (num_spectrogram_bins, num_mel_bins). num_mel_bins + 2 points are
// spaced evenly on the mel scale between the edges (the step divides by num_mel_bins + 2, as
// ONNX's reference and ORT do), mapped back to DFT bin indices by floor((dft_length + 1) * hz /
// sample_rate); filter i rises from point i to point i+1 and falls to point i+2.
Outputs translate_mel_weight_matrix(OpContext& c) {
  const int64_t mel_bins = c.host_int(0), dft_length = c.host_int(1), rate = c.host_int(2);
  const float lo_hz = static_cast<float>(c.host_float(3)),
              hi_hz = static_cast<float>(c.host_float(4));
  if (mel_bins <= 0 || dft_length <= 0 || rate <= 0)
    c.fail("num_mel_bins, dft_length and sample_rate must be positive");
  const int64_t spec_bins = dft_length / 2 + 1;
  if (mel_bins > INT32_MAX || spec_bins * mel_bins > INT32_MAX) c.fail("the output is too large");
  // The edge check runs in float in ORT's kernel (int64 * float promotes to float there), the
  // filter points in double.
  for (float edge : {lo_hz, hi_hz}) {
    double b = std::floor(static_cast<float>(dft_length + 1) * edge / static_cast<float>(rate));
    if (b < 0 || b >= static_cast<double>(spec_bins))
      c.fail("lower/upper_edge_hertz give a filter bank outside the DFT bins for this "
             "dft_length and sample_rate");
  }
  const double lo_mel = hz_to_mel(lo_hz), hi_mel = hz_to_mel(hi_hz);
  const double step = (hi_mel - lo_mel) / static_cast<double>(mel_bins + 2);
  std::vector<int64_t> pts(static_cast<size_t>(mel_bins + 2));
  for (size_t i = 0; i < pts.size(); ++i) {
    const double hz = mel_to_hz(lo_mel + step * static_cast<double>(i));
    double b = std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(rate));
    // The mel scale is monotonic, so every point lies between the two checked edges.
    pts[i] = static_cast<int64_t>(std::clamp(b, 0.0, static_cast<double>(spec_bins - 1)));
  }
  const DType t = output_datatype(c.node);
  std::vector<double> w(static_cast<size_t>(spec_bins * mel_bins), 0.0);
  auto at = [&](int64_t bin, int64_t mel) -> double& { return w[bin * mel_bins + mel]; };
  // Weights are ratios of small integers, computed in the output type as ORT does (rounded
  // once more by host_to_array for float outputs, which leaves a float ratio unchanged).
  auto ratio = [&](int64_t num, int64_t den) {
    return t == DType::Float64 ? static_cast<double>(num) / static_cast<double>(den)
                               : static_cast<double>(static_cast<float>(num) /
                                                     static_cast<float>(den));
  };
  for (int64_t i = 0; i < mel_bins; ++i) {
    const int64_t l = pts[i], m = pts[i + 1], h = pts[i + 2];
    if (m == l)
      at(m, i) = 1;
    else
      for (int64_t j = l; j <= m; ++j) at(j, i) = ratio(j - l, m - l);
    for (int64_t j = m; j < h; ++j) at(j, i) = ratio(h - j, h - m);
  }
  return {host_to_array(w, {static_cast<int>(spec_bins), static_cast<int>(mel_bins)}, t, c.s)};
}

Support check_mel_weight_matrix(const NodeQuery& q) {
  for (size_t i = 0; i < 3; ++i)
    if (auto r = input_dtype_in(q, i, {DType::Int32, DType::Int64}); !r) return r;
  for (size_t i = 3; i < 5; ++i)
    if (auto r = float_input(q, i); !r) return r;
  return check_output_datatype(q);
}

constexpr std::string_view kNotes =
    "computed on the host from the scalar inputs (they fix the output shape)";

const OpEntry kOps[] = {
    {"", "HannWindow", 17, kAnyOpset, check_window, translate_hann, kNotes},
    {"", "HammingWindow", 17, kAnyOpset, check_window, translate_hamming, kNotes},
    {"", "BlackmanWindow", 17, kAnyOpset, check_window, translate_blackman, kNotes},
    {"", "MelWeightMatrix", 17, kAnyOpset, check_mel_weight_matrix, translate_mel_weight_matrix,
     kNotes},
};

}  // namespace

std::span<const OpEntry> signal_ops() { return kOps; }

}  // namespace ortmlx::ops
