// oneDNN's Winograd convolutions against its direct ones, alone, outside the EP: for each 3 x 3
// stride-1 shape (`ic oc size` a line, or the CNNs' shapes below), the direct kernel as the EP
// runs it without 16-channel blocks (channels-last source and destination, oneDNN's pick of
// implementation) and the Winograd one in 16-channel blocks (nChw16c, the only layout oneDNN's
// Winograd kernels take), each with a bias and a Relu post-op: the median ms of `iters` runs, and
// each one's error against a float64 reference on random data (post-Relu activations, He-scaled
// weights) as the RMS of the error over the RMS of the reference.
//   g++ -O2 -std=c++17 tools/dnnl_winograd.cc -I.deps/libdnnl-dev/usr/include \
//       -L.deps/libdnnl2/usr/lib/x86_64-linux-gnu -l:libdnnl.so.2 \
//       -Wl,-rpath-link,.deps/ocl-icd-libopencl1/usr/lib/x86_64-linux-gnu -o /tmp/dnnl_winograd
//   LD_LIBRARY_PATH=build OMP_NUM_THREADS=2 /tmp/dnnl_winograd [SHAPES.txt] [iters]
// oneDNN 2.x only: 3.1 dropped the float32 Winograd kernels (the tool then says "none").
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using dnnl::memory;
using tag = memory::format_tag;

struct Shape {
  long ic, oc, h;
};

struct Result {
  std::string impl = "none";
  double ms = 0, rms_rel = 0;
};

Result run(const dnnl::engine& eng, dnnl::stream& s, const Shape& sh, bool winograd, const std::vector<float>& x,
           const std::vector<float>& w, const std::vector<float>& b, const std::vector<double>& ref, int iters) {
  Result r;
  const tag layout = winograd ? tag::nChw16c : tag::acdb;
  const memory::dims xd{1, sh.ic, sh.h, sh.h}, yd{1, sh.oc, sh.h, sh.h}, wd{sh.oc, sh.ic, 3, 3};
  try {
    dnnl::convolution_forward::desc cd(
        dnnl::prop_kind::forward_inference,
        winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct,
        memory::desc(xd, memory::data_type::f32, layout), memory::desc(wd, memory::data_type::f32, tag::any),
        memory::desc({sh.oc}, memory::data_type::f32, tag::x), memory::desc(yd, memory::data_type::f32, layout),
        {1, 1}, {1, 1}, {1, 1});
    dnnl::primitive_attr attr;
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
    dnnl::convolution_forward::primitive_desc pd(cd, attr, eng);
    r.impl = pd.impl_info_str();
    memory xs({xd, memory::data_type::f32, tag::nchw}, eng, const_cast<float*>(x.data()));
    memory ws({wd, memory::data_type::f32, tag::oihw}, eng, const_cast<float*>(w.data()));
    memory bm({{sh.oc}, memory::data_type::f32, tag::x}, eng, const_cast<float*>(b.data()));
    memory xm(pd.src_desc(), eng), wm(pd.weights_desc(), eng), ym(pd.dst_desc(), eng);
    dnnl::reorder(xs, xm).execute(s, xs, xm);
    dnnl::reorder(ws, wm).execute(s, ws, wm);
    dnnl::convolution_forward conv(pd);
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      conv.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, ym}});
      s.wait();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    r.ms = t[t.size() / 2];
    std::vector<float> y(static_cast<size_t>(sh.oc * sh.h * sh.h));
    memory yp({yd, memory::data_type::f32, tag::nchw}, eng, y.data());
    dnnl::reorder(ym, yp).execute(s, ym, yp);
    s.wait();
    double err = 0, norm = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err += (y[i] - ref[i]) * (y[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    r.rms_rel = std::sqrt(err / norm);
  } catch (const dnnl::error&) {
    r.impl = "none";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  if (argc > 1) {
    std::ifstream f(argv[1]);
    Shape sh{};
    while (f >> sh.ic >> sh.oc >> sh.h) shapes.push_back(sh);
  } else {  // squeezenet's expansions, resnet50's, vgg19's, inception's 3 x 3 layers
    shapes = {{16, 64, 55}, {32, 128, 27}, {64, 256, 13}, {64, 64, 56},   {128, 128, 28}, {256, 256, 14},
              {512, 512, 7}, {128, 128, 112}, {256, 256, 56}, {512, 512, 28}, {96, 128, 28}, {64, 96, 28}};
  }
  const int iters = argc > 2 ? std::atoi(argv[2]) : 100;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::printf("%-20s %-30s %9s %9s | %-32s %9s %9s %7s\n", "shape", "direct", "ms", "rms-rel", "winograd", "ms",
              "rms-rel", "speed");
  for (const auto& sh : shapes) {
    const long H = sh.h, IC = sh.ic, OC = sh.oc;
    std::vector<float> x(static_cast<size_t>(IC * H * H)), w(static_cast<size_t>(OC * IC * 9)), b(static_cast<size_t>(OC));
    for (auto& v : x) v = std::max(0.f, nd(rng));
    const float scale = std::sqrt(2.f / (9.f * static_cast<float>(IC)));
    for (auto& v : w) v = nd(rng) * scale;
    for (auto& v : b) v = nd(rng) * 0.1f;
    std::vector<double> ref(static_cast<size_t>(OC * H * H));
    for (long o = 0; o < OC; ++o)
      for (long yy = 0; yy < H; ++yy)
        for (long xx = 0; xx < H; ++xx) {
          double acc = b[o];
          for (long c = 0; c < IC; ++c)
            for (int ky = 0; ky < 3; ++ky)
              for (int kx = 0; kx < 3; ++kx) {
                const long iy = yy + ky - 1, ix = xx + kx - 1;
                if (iy >= 0 && ix >= 0 && iy < H && ix < H)
                  acc += static_cast<double>(x[(c * H + iy) * H + ix]) * w[((o * IC + c) * 3 + ky) * 3 + kx];
              }
          ref[(o * H + yy) * H + xx] = std::max(acc, 0.0);
        }
    const Result d = run(eng, s, sh, false, x, w, b, ref, iters), wg = run(eng, s, sh, true, x, w, b, ref, iters);
    char name[64];
    std::snprintf(name, sizeof name, "%ld -> %ld, %ldx%ld", IC, OC, H, H);
    std::printf("%-20s %-30s %9.3f %9.2e | %-32s %9.3f %9.2e %6.2fx\n", name, d.impl.c_str(), d.ms, d.rms_rel,
                wg.impl.c_str(), wg.ms, wg.rms_rel, wg.ms > 0 ? d.ms / wg.ms : 0.0);
  }
  return 0;
}
