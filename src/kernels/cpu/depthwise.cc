// Depthwise 2-D convolutions over NCHW as they lie: cpu_depthwise_conv of kernels/cpu/kernels.h.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

struct DepthwiseShape {
  int64_t planes, h, w, oh, ow;  // batch x channels, input and output sizes
  int kh, kw, sh, sw, ph, pw, dh, dw;  // kernel, strides, leading pads, dilations
  bool relu;
  bool operator==(const DepthwiseShape&) const = default;
};

// The plane zero-padded into `buf`: rows of `wp` floats, the top and left padding in place and
// room on the right for a vector step's loads past the last output (zeros, never stored).
void pad_plane(const float* x, const DepthwiseShape& s, int64_t hp, int64_t wp, std::vector<float>& buf) {
  buf.assign(static_cast<size_t>(hp * wp), 0.f);
  for (int64_t r = 0; r < s.h; ++r) std::copy(x + r * s.w, x + (r + 1) * s.w, buf.data() + (r + s.ph) * wp + s.pw);
}

// One output row from the padded plane, `cols` outputs from 0 (a multiple of 8 with AVX2: the
// row buffer has room), each a sum over the kernel's taps held in a register.
void row_scalar(const float* xp, int64_t wp, const float* w, float b, float* y, const DepthwiseShape& s, int64_t oy,
                int64_t cols) {
  for (int64_t ox = 0; ox < cols; ++ox) {
    float acc = b;
    for (int i = 0; i < s.kh; ++i) {
      const float* xr = xp + (oy * s.sh + static_cast<int64_t>(i) * s.dh) * wp + ox * s.sw;
      for (int j = 0; j < s.kw; ++j) acc += w[i * s.kw + j] * xr[static_cast<int64_t>(j) * s.dw];
    }
    y[ox] = acc;
  }
}

#ifdef ORTMLX_X86
// 8 outputs a step: stride 1 reads 8 neighbours a tap, stride 2 reads 16 and keeps the even ones.
__attribute__((target("avx2,fma"))) void row_avx2(const float* xp, int64_t wp, const float* w, float b, float* y,
                                                   const DepthwiseShape& s, int64_t oy, int64_t cols) {
  for (int64_t ox = 0; ox < cols; ox += 8) {
    __m256 acc = _mm256_set1_ps(b);
    for (int i = 0; i < s.kh; ++i) {
      const float* xr = xp + (oy * s.sh + static_cast<int64_t>(i) * s.dh) * wp + ox * s.sw;
      for (int j = 0; j < s.kw; ++j) {
        const float* q = xr + static_cast<int64_t>(j) * s.dw;
        __m256 v;
        if (s.sw == 1) {
          v = _mm256_loadu_ps(q);
        } else {  // [a0 a2 b0 b2 | a4 a6 b4 b6] -> [a0 a2 a4 a6 b0 b2 b4 b6]
          const __m256 a = _mm256_loadu_ps(q), c = _mm256_loadu_ps(q + 8);
          v = _mm256_castpd_ps(
              _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, c, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(w[i * s.kw + j]), v, acc);
      }
    }
    _mm256_storeu_ps(y + ox, acc);
  }
}
#endif

// Each tap's offset in the padded plane (rows of wp floats) from its output's position; returns
// the taps (at most 64).
int tap_offsets(const DepthwiseShape& s, int64_t wp, int64_t* off) {
  for (int i = 0; i < s.kh; ++i)
    for (int j = 0; j < s.kw; ++j) off[i * s.kw + j] = static_cast<int64_t>(i) * s.dh * wp + static_cast<int64_t>(j) * s.dw;
  return s.kh * s.kw;
}

#ifdef ORTMLX_X86
// Stride 1: the outputs over the padded plane's full width, as one flat run of 8-wide steps
// (output (r, c) reads padded (r + i*dh, c + j*dw), which is flat index r*wp + c plus a constant
// per tap): no per-row work, for planes of a few dozen columns. The columns past the output's
// are computed and dropped.
__attribute__((target("avx2,fma"))) void flat_avx2(const float* xp, int64_t wp, const float* w, float b, float* out,
                                                    const DepthwiseShape& s, int64_t n) {
  int64_t off[64];
  const int taps = tap_offsets(s, wp, off);
  for (int64_t k = 0; k < n; k += 8) {
    __m256 acc = _mm256_set1_ps(b);
    for (int t = 0; t < taps; ++t) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), _mm256_loadu_ps(xp + k + off[t]), acc);
    _mm256_storeu_ps(out + k, acc);
  }
}
#endif

#ifdef ORTMLX_X86
// flat_avx2 with 16 outputs a step.
__attribute__((target("avx512f"))) void flat_avx512(const float* xp, int64_t wp, const float* w, float b, float* out,
                                                     const DepthwiseShape& s, int64_t n) {
  int64_t off[64];
  const int taps = tap_offsets(s, wp, off);
  for (int64_t k = 0; k < n; k += 16) {
    __m512 acc = _mm512_set1_ps(b);
    for (int t = 0; t < taps; ++t) acc = _mm512_fmadd_ps(_mm512_set1_ps(w[t]), _mm512_loadu_ps(xp + k + off[t]), acc);
    _mm512_storeu_ps(out + k, acc);
  }
}
#endif

// One channel's plane: y[oy, ox] = b + sum_ij w[i, j] x[oy*sh - ph + i*dh, ox*sw - pw + j*dw]
// (zero outside the input), then max(y, 0) with relu.
void plane(const float* x, const float* w, float b, float* y, const DepthwiseShape& s, bool avx2, bool avx512) {
#ifdef ORTMLX_X86
  if (avx2 && s.sh == 1 && s.sw == 1 && s.kh * s.kw <= 64) {
    const int64_t wp = s.ow + (s.kw - 1) * s.dw, hp = s.oh + (s.kh - 1) * s.dh;
    const int64_t step = avx512 ? 16 : 8;
    const int64_t n = (s.oh * wp + step - 1) / step * step;
    thread_local std::vector<float> buf, out;
    // the padded plane, then rows of zeros for the last steps' loads past it
    pad_plane(x, s, hp + (n - s.oh * wp + s.kw * s.dw) / wp + 1, wp, buf);
    out.resize(static_cast<size_t>(n));
    if (avx512)
      flat_avx512(buf.data(), wp, w, b, out.data(), s, n);
    else
      flat_avx2(buf.data(), wp, w, b, out.data(), s, n);
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      const float* o = out.data() + oy * wp;
      float* yr = y + oy * s.ow;
      if (s.relu)
        for (int64_t ox = 0; ox < s.ow; ++ox) yr[ox] = std::max(o[ox], 0.f);
      else
        std::copy(o, o + s.ow, yr);
    }
    return;
  }
#endif
  const bool vec = avx2 && (s.sw == 1 || s.sw == 2);
  const int64_t cols = vec ? (s.ow + 7) / 8 * 8 : s.ow;
  const int64_t hp = (s.oh - 1) * s.sh + (s.kh - 1) * s.dh + 1;
  const int64_t wp = std::max<int64_t>((cols - 1) * s.sw + (s.kw - 1) * s.dw + (vec ? 2 * s.sw * 8 : 1), s.pw + s.w);
  thread_local std::vector<float> buf, row;
  pad_plane(x, s, std::max<int64_t>(hp, s.ph + s.h), wp, buf);
  row.resize(static_cast<size_t>(cols));
  for (int64_t oy = 0; oy < s.oh; ++oy) {
#ifdef ORTMLX_X86
    if (vec)
      row_avx2(buf.data(), wp, w, b, row.data(), s, oy, cols);
    else
#endif
      row_scalar(buf.data(), wp, w, b, row.data(), s, oy, cols);
    float* yr = y + oy * s.ow;
    if (s.relu)
      for (int64_t ox = 0; ox < s.ow; ++ox) yr[ox] = std::max(row[static_cast<size_t>(ox)], 0.f);
    else
      std::copy(row.begin(), row.begin() + s.ow, yr);
  }
}

class DepthwiseConv : public mx::UnaryPrimitive {
 public:
  DepthwiseConv(mx::Stream st, const DepthwiseShape& s, int64_t channels, bool parallel, bool avx512)
      : mx::UnaryPrimitive(st), s_(s), channels_(channels), parallel_(parallel), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    std::optional<RowMajorInput> bias;
    if (inputs.size() > 2) bias.emplace(inputs[2]);
    // Planes read where they lie when each is contiguous (a channel shuffle's transposed view):
    // plane p at offsets[p]; otherwise the input gathered in row-major order.
    const auto& xin = inputs[0];
    std::vector<int64_t> offsets;
    const int nd = static_cast<int>(xin.ndim());
    if (!xin.flags().row_contiguous && xin.strides()[nd - 1] == 1 && xin.strides()[nd - 2] == s_.w) {
      offsets.resize(static_cast<size_t>(s_.planes));
      std::vector<int64_t> idx(static_cast<size_t>(nd - 2), 0);
      for (int64_t p = 0; p < s_.planes; ++p) {
        int64_t off = 0;
        for (int d = 0; d < nd - 2; ++d) off += idx[d] * xin.strides()[d];
        offsets[static_cast<size_t>(p)] = off;
        for (int d = nd - 3; d >= 0; --d) {
          if (++idx[d] < xin.shape(d)) break;
          idx[d] = 0;
        }
      }
    }
    std::optional<RowMajorInput> gathered;
    if (offsets.empty()) gathered.emplace(xin);
    dispatch_task(stream(), [x = std::move(gathered), raw = xin.data<float>(), offsets = std::move(offsets),
                  w = RowMajorInput(inputs[1]), bias = std::move(bias), yp = out.data<float>(), s = s_, c = channels_,
                  parallel = parallel_, avx512 = avx512_] {
      const float* xp = x ? x->rows() : raw;
      const float* wp = w.rows();
      const float* bp = bias ? bias->rows() : nullptr;
      bool avx2 = false;
#ifdef ORTMLX_X86
      avx2 = cpu_has_avx2_fma();
#endif
      const int64_t taps = static_cast<int64_t>(s.kh) * s.kw;
      auto run = [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t ch = p % c;
          plane(xp + (offsets.empty() ? p * s.h * s.w : offsets[static_cast<size_t>(p)]), wp + ch * taps,
                bp ? bp[ch] : 0.f, yp + p * s.oh * s.ow, s, avx2, avx2 && avx512);
        }
      };
      cpu_parallel_for(s.planes, parallel ? std::min<int64_t>(cpu_threads(), s.planes) : 1, run);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[DepthwiseConv] runs on the CPU stream only");
  }
  const char* name() const override { return "DepthwiseConv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const DepthwiseConv*>(&other);
    return o && o->s_ == s_ && o->channels_ == channels_ && o->parallel_ == parallel_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    return {{static_cast<int>(s_.planes / channels_), static_cast<int>(channels_), static_cast<int>(s_.oh),
             static_cast<int>(s_.ow)}};
  }

 private:
  DepthwiseShape s_;
  int64_t channels_;
  bool parallel_;
  bool avx512_;  // stride-1 planes 16 outputs a step (cpu_avx512_kernels() at translation)
};

}  // namespace

std::optional<mx::array> cpu_depthwise_conv(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                                            const std::vector<int>& stride, const std::vector<int>& pad_lo,
                                            const std::vector<int>& pad_hi, const std::vector<int>& dilation,
                                            bool relu, bool parallel, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 ||
      w.dtype() != mx::float32 || x.ndim() != 4 || w.ndim() != 4 || x.size() == 0 || stride.size() != 2 ||
      pad_lo.size() != 2 || pad_hi.size() != 2 || dilation.size() != 2)
    return std::nullopt;
  const int64_t C = x.shape(1);
  if (w.shape(0) != C || w.shape(1) != 1 || (bias && (bias->dtype() != mx::float32 || bias->size() != static_cast<size_t>(C))))
    return std::nullopt;
  for (int d = 0; d < 2; ++d)
    if (stride[d] < 1 || dilation[d] < 1 || pad_lo[d] < 0 || pad_hi[d] < 0) return std::nullopt;
  DepthwiseShape sh{};
  sh.planes = x.shape(0) * C;
  sh.h = x.shape(2);
  sh.w = x.shape(3);
  sh.kh = w.shape(2);
  sh.kw = w.shape(3);
  sh.sh = stride[0];
  sh.sw = stride[1];
  sh.ph = pad_lo[0];
  sh.pw = pad_lo[1];
  sh.dh = dilation[0];
  sh.dw = dilation[1];
  sh.relu = relu;
  const int64_t ekh = (sh.kh - 1) * sh.dh + 1, ekw = (sh.kw - 1) * sh.dw + 1;
  const int64_t ph = sh.h + pad_lo[0] + pad_hi[0], pw = sh.w + pad_lo[1] + pad_hi[1];
  if (ph < ekh || pw < ekw) return std::nullopt;
  sh.oh = (ph - ekh) / sh.sh + 1;
  sh.ow = (pw - ekw) / sh.sw + 1;
  // A reshape of a view whose planes lie whole (a channel shuffle: [N, C/g, g, H, W] transposed
  // from [N, g, C/g, H, W]) is read through: the kernel takes the view, not the reshape's copy.
  mx::array src = x;
  if (x.has_primitive() && std::string_view(x.primitive().name()) == "Reshape" && x.inputs().size() == 1) {
    const auto& t = x.inputs()[0];
    if (t.ndim() >= 3 && t.size() == x.size() && t.dtype() == mx::float32 && t.shape(-1) == x.shape(3) &&
        t.shape(-2) == x.shape(2))
      src = t;
  }
  std::vector<mx::array> in{src, w};
  if (bias) in.push_back(*bias);
  return mx::array({x.shape(0), static_cast<int>(C), static_cast<int>(sh.oh), static_cast<int>(sh.ow)}, mx::float32,
                   std::make_shared<DepthwiseConv>(s, sh, C, parallel, cpu_avx512_kernels()), std::move(in));
}

}  // namespace ortmlx::ops
