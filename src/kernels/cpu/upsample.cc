// Nearest-neighbour upsampling by whole factors over NCHW: cpu_nearest_upsample of
// kernels/cpu/kernels.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

struct UpsampleShape {
  int64_t planes, h, w;  // batch x channels, input rows and columns
  int kh, kw;            // the factors
  bool operator==(const UpsampleShape&) const = default;
};

#ifdef ORTMLX_X86
// kw = 2 with AVX-512: 16 inputs a step into 32 outputs, each twice; returns the inputs done.
__attribute__((target("avx512f"))) int64_t widen2_avx512(const float* x, float* y, int64_t w) {
  const __m512i lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i hi = _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  int64_t j = 0;
  for (; j + 16 <= w; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    _mm512_storeu_ps(y + 2 * j, _mm512_permutexvar_ps(lo, v));
    _mm512_storeu_ps(y + 2 * j + 16, _mm512_permutexvar_ps(hi, v));
  }
  return j;
}
#endif

// One input row, each element kw times.
void widen_row(const float* x, float* y, int64_t w, int kw, bool avx512) {
  int64_t j = 0;
#ifdef ORTMLX_X86
  if (avx512 && kw == 2) j = widen2_avx512(x, y, w);
#else
  (void)avx512;
#endif
  for (; j < w; ++j)
    for (int b = 0; b < kw; ++b) y[j * kw + b] = x[j];
}

class NearestUpsample : public mx::UnaryPrimitive {
 public:
  NearestUpsample(mx::Stream st, const UpsampleShape& s, bool avx512)
      : mx::UnaryPrimitive(st), s_(s), avx512_(avx512) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [x = RowMajorInput(inputs[0]), yp = out.data<float>(), s = s_, avx512 = avx512_] {
      const float* xp = x.rows();
      const int64_t ow = s.w * s.kw;
      // One task per input row of a plane: its kh output rows.
      auto run = [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* y = yp + r * s.kh * ow;  // (plane p, row i) -> output row p * H * kh + i * kh
          widen_row(xp + r * s.w, y, s.w, s.kw, avx512);
          for (int a = 1; a < s.kh; ++a) std::memcpy(y + a * ow, y, static_cast<size_t>(ow) * sizeof(float));
        }
      };
      const int64_t rows = s.planes * s.h;
      // (a split costs a wake-up: only outputs of some size take one)
      const bool parallel = rows * ow * s.kh >= (int64_t{1} << 16);
      cpu_parallel_for(rows, parallel ? std::min<int64_t>(cpu_threads(), rows) : 1, run);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[NearestUpsample] runs on the CPU stream only");
  }
  const char* name() const override { return "NearestUpsample"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const NearestUpsample*>(&other);
    return o && o->s_ == s_ && o->avx512_ == avx512_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape y = inputs[0].shape();
    y[2] *= s_.kh;
    y[3] *= s_.kw;
    return {y};
  }

 private:
  UpsampleShape s_;
  bool avx512_;
};

}  // namespace

std::optional<mx::array> cpu_nearest_upsample(const mx::array& x, int kh, int kw, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || x.dtype() != mx::float32 || x.ndim() != 4 ||
      x.size() == 0 || kh < 1 || kw < 1)
    return std::nullopt;
  const UpsampleShape sh{static_cast<int64_t>(x.shape(0)) * x.shape(1), x.shape(2), x.shape(3), kh, kw};
  mx::Shape out = x.shape();
  out[2] *= kh;
  out[3] *= kw;
  return mx::array(std::move(out), mx::float32, std::make_shared<NearestUpsample>(s, sh, cpu_avx512_kernels()), {x});
}

}  // namespace ortmlx::ops
