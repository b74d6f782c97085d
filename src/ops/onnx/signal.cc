// Signal generators: HannWindow, HammingWindow, BlackmanWindow (opset 17) and MelWeightMatrix
// (opset 17), and the transforms DFT (17, 20) and STFT (17).
//
// Every input of the generators is a scalar that fixes the output's *shape* (window size, number of
// bins), so it is read on the host and the whole output is computed there, in the precision
// ORT's CPU kernels use (onnxruntime/core/providers/cpu/signal/window_functions.cc): double for
// the window terms and mel scale conversions (the range check of the edges is in float there).
// The result becomes a constant of the
// translated graph; the engine records the host reads, so a compiled replay is keyed by them.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
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

// ---- DFT / STFT -------------------------------------------------------------------------------
//
// A signal is (..., 1) real or (..., 2) complex (real, imaginary). Transforms of up to
// kMatmulDftMax points are a product with cos/sin matrices computed in double on the host,
// their argument 2 pi ((k n) mod N) / N reduced first, so the terms at multiples of a quarter
// turn are exactly 0 and +-1, accumulated in float64 on the CPU device (float32 on the GPU):
// a spectrum that must vanish (the imaginary part of a real signal's bins 0 and N/2, or of the
// inverse of a conjugate-symmetric spectrum) then comes out zero to double rounding, as from
// numpy's double FFT, where a float32 FFT leaves noise of ~1e-6 of the signal's scale (ONNX's
// tests compare with atol 1e-7). Longer transforms go through mx::fft in complex64; float64
// inputs never do (MLX's FFT has no complex128).

constexpr int kMatmulDftMax = 1024;

// The real and imaginary parts of a signal, transformed axis last; `im` absent = real. In
// float64 for a float64 input or on the CPU device, else float32.
struct Signal {
  mx::array re;
  std::optional<mx::array> im;
  bool f64_input = false;  // float64 never goes through MLX's complex64 FFT
};

mx::Dtype dft_compute_dtype(mx::Dtype t, mx::Stream s) {
  return t == mx::float64 || s.device == mx::Device::cpu ? mx::float64 : mx::float32;
}

bool use_matmul_dft(const Signal& x, int64_t N, OpContext& c) {
  if (N <= kMatmulDftMax) return true;
  if (!x.f64_input) return false;
  if (N > 4 * kMatmulDftMax)
    c.fail("a float64 DFT of more than " + std::to_string(4 * kMatmulDftMax) +
           " points (MLX's FFT has no complex128)");
  return true;
}

// re + i im in complex64.
mx::array to_complex64(const Signal& x, mx::Stream s) {
  mx::array z = mx::astype(mx::astype(x.re, mx::float32, s), mx::complex64, s);
  if (x.im)
    z = mx::add(z,
                mx::multiply(mx::astype(mx::astype(*x.im, mx::float32, s), mx::complex64, s),
                             mx::array(mx::complex64_t{0.f, 1.f}), s),
                s);
  return z;
}

// cos / sin (2 pi k n / N) * w(k) for n < rows, k < cols, as a (rows, cols) or, transposed,
// (cols, rows) matrix. w is `scale`, doubled for 0 < k < N/2 with `c2r_weights` (the bins whose
// conjugates a one-sided inverse leaves implicit).
std::pair<mx::array, mx::array> twiddles(int64_t N, int64_t rows, int64_t cols, double scale,
                                         bool transposed, bool c2r_weights, mx::Dtype t) {
  std::vector<double> cs(static_cast<size_t>(rows * cols)), sn(cs.size());
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t r = (k * n) % N;  // k, n < 2^31 (shapes are int32)
      double cv, sv;
      if ((4 * r) % N == 0) {  // a multiple of a quarter turn: exact
        const int64_t q = 4 * r / N;
        cv = q == 0 ? 1 : q == 2 ? -1 : 0;
        sv = q == 1 ? 1 : q == 3 ? -1 : 0;
      } else {
        const double a = kTwoPi * static_cast<double>(r) / static_cast<double>(N);
        cv = std::cos(a);
        sv = std::sin(a);
      }
      double w = scale;
      if (c2r_weights && k > 0 && 2 * k != N) w *= 2;
      const size_t at =
          transposed ? static_cast<size_t>(k * rows + n) : static_cast<size_t>(n * cols + k);
      cs[at] = cv * w;
      sn[at] = sv * w;
    }
  mx::Shape shape = transposed ? mx::Shape{static_cast<int>(cols), static_cast<int>(rows)}
                               : mx::Shape{static_cast<int>(rows), static_cast<int>(cols)};
  if (t == mx::float64)
    return {mx::array(cs.begin(), shape, mx::float64), mx::array(sn.begin(), shape, mx::float64)};
  std::vector<float> cf(cs.begin(), cs.end()), sf(sn.begin(), sn.end());
  return {mx::array(cf.begin(), shape, mx::float32), mx::array(sf.begin(), shape, mx::float32)};
}

// The first `len` entries of the last axis, zero padded to `len` when shorter.
mx::array fit_last(const mx::array& a, int64_t len, mx::Stream s) {
  const int L = a.shape(-1), last = static_cast<int>(a.ndim()) - 1;
  if (L == len) return a;
  if (L > len) {
    mx::Shape start(a.ndim(), 0), stop = a.shape();
    stop[last] = static_cast<int>(len);
    return mx::slice(a, start, stop, s);
  }
  return mx::pad(a, {last}, {0}, {static_cast<int>(len - L)}, mx::array(0, a.dtype()), "constant",
                 s);
}

// The N-point DFT (or inverse, scaled by 1/N) of x along its last axis, bins [0, K). x's last
// axis may be shorter or longer than N (zero padded / truncated). Returns (re, im).
std::pair<mx::array, mx::array> dft_last(const Signal& x, int64_t N, int64_t K, bool inverse,
                                         OpContext& c) {
  const auto s = c.s;
  const auto t = x.re.dtype();
  if (use_matmul_dft(x, N, c)) {
    const int64_t rows = std::min<int64_t>(x.re.shape(-1), N);
    auto [C, S] =
        twiddles(N, rows, K, inverse ? 1.0 / static_cast<double>(N) : 1.0, false, false, t);
    // forward e^{-i a}: re = xr C + xi S, im = xi C - xr S; inverse e^{+i a}: the signs of S flip
    auto xr = fit_last(x.re, rows, s);
    auto re = mx::matmul(xr, C, s);
    auto im = mx::matmul(xr, S, s);
    if (!inverse) im = mx::negative(im, s);
    if (x.im) {
      auto xi = fit_last(*x.im, rows, s);
      auto xiS = mx::matmul(xi, S, s);
      re = inverse ? mx::subtract(re, xiS, s) : mx::add(re, xiS, s);
      im = mx::add(im, mx::matmul(xi, C, s), s);
    }
    return {re, im};
  }
  const int n = static_cast<int>(N);
  mx::array z = to_complex64(x, s);
  // A real signal's one-sided spectrum is rfft's output; the full one needs the complex FFT.
  mx::array y =
      !inverse && !x.im && K <= N / 2 + 1
          ? mx::fft::rfft(mx::astype(x.re, mx::float32, s), n, -1, mx::fft::FFTNorm::Backward, s)
      : inverse ? mx::fft::ifft(z, n, -1, mx::fft::FFTNorm::Backward, s)
                : mx::fft::fft(z, n, -1, mx::fft::FFTNorm::Backward, s);
  y = fit_last(y, K, s);
  return {mx::real(y, s), mx::imag(y, s)};
}

// The real N-point inverse of the one-sided spectrum x (bins [0, N/2] used; the imaginary parts
// of bin 0 and of bin N/2 for even N drop out, as their conjugates would cancel them).
mx::array irfft_last(const Signal& x, int64_t N, OpContext& c) {
  const auto s = c.s;
  const auto t = x.re.dtype();
  const int64_t bins = std::min<int64_t>(x.re.shape(-1), N / 2 + 1);
  if (use_matmul_dft(x, N, c)) {
    auto [C, S] = twiddles(N, N, bins, 1.0 / static_cast<double>(N), true, true, t);
    auto y = mx::matmul(fit_last(x.re, bins, s), C, s);
    if (x.im) y = mx::subtract(y, mx::matmul(fit_last(*x.im, bins, s), S, s), s);
    return y;
  }
  return mx::fft::irfft(to_complex64(x, s), static_cast<int>(N), -1, mx::fft::FFTNorm::Backward, s);
}

// Splits (..., 1|2) into the parts, in the compute dtype, with axis `axis` moved last.
Signal split_signal(OpContext& c, const mx::array& x, int axis) {
  const int last = static_cast<int>(x.ndim()) - 1;
  const int parts = x.shape(last);
  if (parts != 1 && parts != 2) c.fail("the last dimension must be 1 (real) or 2 (complex)");
  const auto t = dft_compute_dtype(x.dtype(), c.s);
  auto part = [&](int i) {
    mx::Shape start(x.ndim(), 0), stop = x.shape();
    start[last] = i;
    stop[last] = i + 1;
    auto p = mx::squeeze(mx::slice(x, start, stop, c.s), last, c.s);
    return mx::moveaxis(mx::astype(p, t, c.s), axis, -1, c.s);
  };
  Signal sig{part(0), std::nullopt, x.dtype() == mx::float64};
  if (parts == 2) sig.im = part(1);
  return sig;
}

// (re, im) with the transformed axis last -> (..., 2) with it back at `axis`, in dtype t.
mx::array join_complex(const mx::array& re, const mx::array& im, int axis, mx::Dtype t,
                       mx::Stream s) {
  auto y = mx::stack({mx::moveaxis(re, -1, axis, s), mx::moveaxis(im, -1, axis, s)}, -1, s);
  return mx::astype(y, t, s);
}

Support check_dft(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  for (size_t i : {1, 2})
    if (auto r = input_dtype_in(q, i, {DType::Int32, DType::Int64}); !r) return r;
  if (auto r = flag_attr_0_or_1(q, "inverse"); !r) return r;
  if (auto r = flag_attr_0_or_1(q, "onesided"); !r) return r;
  const int rank = q.input_rank(0);
  if (rank >= 0 && rank < 2) return Support::no("the signal must have rank >= 2");
  return Support::yes();
}

// DFT-17: axis an attribute (default 1); DFT-20: an optional input (default -2). The axis
// counts the dims of the whole input, the last (real/complex) one excluded.
Outputs translate_dft(OpContext& c) {
  const auto& x = c.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 2) c.fail("the signal must have rank >= 2");
  int64_t axis =
      c.node.since_version >= 20 ? (c.has(2) ? c.host_int(2) : -2) : c.node.attr_int("axis", 1);
  if (axis < -rank || axis >= rank - 1 || axis == -1)
    c.fail("axis " + std::to_string(axis) + " is out of range for a signal of rank " +
           std::to_string(rank) + " (the last dimension holds the real and imaginary parts)");
  const int a = static_cast<int>(axis < 0 ? axis + rank : axis);
  const bool inverse = c.node.attr_int("inverse", 0) != 0;
  const bool onesided = c.node.attr_int("onesided", 0) != 0;
  const int64_t L = x.shape(a);
  int64_t N = inverse && onesided ? 2 * (L - 1) : L;
  if (c.has(1)) N = c.host_int(1);
  if (N < 1) c.fail("dft_length must be positive");
  if (N > INT32_MAX / 2) c.fail("dft_length is too large");
  auto sig = split_signal(c, x, a);
  if (inverse && onesided) {
    auto y = irfft_last(sig, N, c);
    return {mx::astype(mx::expand_dims(mx::moveaxis(y, -1, a, c.s), -1, c.s), x.dtype(), c.s)};
  }
  const int64_t K = onesided ? N / 2 + 1 : N;
  auto [re, im] = dft_last(sig, N, K, inverse, c);
  return {join_complex(re, im, a, x.dtype(), c.s)};
}

Support check_stft(const NodeQuery& q) {
  if (auto r = float_input(q, 0); !r) return r;
  if (auto r = float_input(q, 2); !r) return r;
  for (size_t i : {1, 3})
    if (auto r = input_dtype_in(q, i, {DType::Int32, DType::Int64}); !r) return r;
  if (auto r = flag_attr_0_or_1(q, "onesided"); !r) return r;
  const int rank = q.input_rank(0);
  if (rank >= 0 && rank != 3) return Support::no("the signal must be (batch, length, 1 or 2)");
  return Support::yes();
}

// Frames of frame_length samples every frame_step samples (as many as fit whole), each times the
// window, each DFT'd: (batch, frames, bins, 2) with bins = frame_length / 2 + 1 when onesided.
Outputs translate_stft(OpContext& c) {
  const auto s = c.s;
  const auto& x = c.in(0);
  if (x.ndim() != 3) c.fail("the signal must be (batch, length, 1 or 2)");
  const int64_t L = x.shape(1);
  const int64_t step = c.host_int(1);
  if (step < 1) c.fail("frame_step must be positive");
  std::optional<mx::array> window;
  if (c.has(2)) {
    window = c.in(2);
    if (window->ndim() != 1) c.fail("window must be 1-D");
  }
  int64_t W = c.has(3) ? c.host_int(3) : window ? window->shape(0) : L;
  if (W < 1) c.fail("frame_length must be positive");
  if (window && window->shape(0) != W) c.fail("window's length differs from frame_length");
  if (W > L) c.fail("frame_length is longer than the signal");
  const int64_t frames = 1 + (L - W) / step;
  if (frames * W > INT32_MAX) c.fail("the frames are too large");
  std::vector<int32_t> idx(static_cast<size_t>(frames * W));
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t j = 0; j < W; ++j) idx[f * W + j] = static_cast<int32_t>(f * step + j);
  auto at = mx::array(idx.begin(), {static_cast<int>(frames), static_cast<int>(W)}, mx::int32);
  auto framed = mx::take(x, at, 1, s);  // (batch, frames, W, parts)
  auto sig = split_signal(c, framed, 2);
  if (window) {
    auto w = mx::astype(*window, sig.re.dtype(), s);
    sig.re = mx::multiply(sig.re, w, s);
    if (sig.im) sig.im = mx::multiply(*sig.im, w, s);
  }
  const bool onesided = c.node.attr_int("onesided", 1) != 0;
  auto [re, im] = dft_last(sig, W, onesided ? W / 2 + 1 : W, false, c);
  return {join_complex(re, im, 2, x.dtype(), s)};
}

constexpr std::string_view kNotes =
    "computed on the host from the scalar inputs (they fix the output shape)";

const OpEntry kOps[] = {
    {"", "HannWindow", 17, kAnyOpset, check_window, translate_hann, kNotes},
    {"", "HammingWindow", 17, kAnyOpset, check_window, translate_hamming, kNotes},
    {"", "BlackmanWindow", 17, kAnyOpset, check_window, translate_blackman, kNotes},
    {"", "MelWeightMatrix", 17, kAnyOpset, check_mel_weight_matrix, translate_mel_weight_matrix,
     kNotes},
    {"", "DFT", 17, kAnyOpset, check_dft, translate_dft,
     "float64 on the CPU only; up to 1024 points a product with twiddles computed in double "
     "(accumulated in float64 on the CPU), longer ones mx::fft in complex64 (float64: at most 4096 "
     "points); test_dft_inverse's expected output holds float32 FFT noise (1.9e-7) where the "
     "exact result is 0"},
    {"", "STFT", 17, kAnyOpset, check_stft, translate_stft,
     "frame_step and frame_length read on the host; the DFT as in DFT"},
};

}  // namespace

std::span<const OpEntry> signal_ops() { return kOps; }

}  // namespace ortmlx::ops
