// oneDNN's convolutions timed alone, outside the EP: the shapes oneDNN's verbose output names
// (DNNL_VERBOSE=1 around tools/run_loop.py prints `mb1_ic64oc16_ih55oh55kh1sh1dh0ph0_iw55...`), one
// a line, each run as the EP runs it on AVX-512 machines (channels-last source and destination,
// the weight in oneDNN's own layout, a Relu post-op), `iters` times; prints each one's median
// ms and the sum. Compares oneDNN's own speed, or an OpenMP setting, with its time inside the EP.
//   g++ -O2 -std=c++17 tools/dnnl_conv_loop.cc -I.deps/libdnnl-dev/usr/include \
//       -L.deps/libdnnl2/usr/lib/x86_64-linux-gnu -l:libdnnl.so.2 \
//       -Wl,-rpath-link,.deps/ocl-icd-libopencl1/usr/lib/x86_64-linux-gnu -o /tmp/dnnl_conv_loop
//   LD_LIBRARY_PATH=build OMP_NUM_THREADS=2 [OMP_WAIT_POLICY=PASSIVE] /tmp/dnnl_conv_loop SHAPES.txt [iters]
// Builds against oneDNN 3.x headers too (the primitive descriptor's constructor differs).
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Shape {
  long mb, ic, oc, ih, oh, kh, sh, dh, ph, iw, ow, kw, sw, dw, pw;
};

dnnl::convolution_forward::primitive_desc describe(const dnnl::engine& eng, const Shape& p) {
  using dnnl::memory;
  const memory::desc src({p.mb, p.ic, p.ih, p.iw}, memory::data_type::f32, memory::format_tag::acdb);
  const memory::desc dst({p.mb, p.oc, p.oh, p.ow}, memory::data_type::f32, memory::format_tag::acdb);
  const memory::desc wei({p.oc, p.ic, p.kh, p.kw}, memory::data_type::f32, memory::format_tag::any);
  const memory::desc bia({p.oc}, memory::data_type::f32, memory::format_tag::a);
  const long pad_b = (p.oh - 1) * p.sh + (p.kh - 1) * (p.dh + 1) + 1 - p.ih - p.ph;
  const long pad_r = (p.ow - 1) * p.sw + (p.kw - 1) * (p.dw + 1) + 1 - p.iw - p.pw;
  dnnl::post_ops ops;
  dnnl::primitive_attr attr;
#if DNNL_VERSION_MAJOR >= 3
  ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(ops);
  return {eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei, bia, dst,
          {p.sh, p.sw}, {p.dh, p.dw}, {p.ph, p.pw}, {pad_b, pad_r}, attr};
#else
  ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(ops);
  const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                          src, wei, bia, dst, {p.sh, p.sw}, {p.dh, p.dw}, {p.ph, p.pw},
                                          {pad_b, pad_r});
  return {d, attr, eng};
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SHAPES.txt [iters]\n", argv[0]);
    return 2;
  }
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  std::ifstream in(argv[1]);
  std::vector<Shape> shapes;
  for (std::string line; std::getline(in, line);) {
    Shape p{};
    if (std::sscanf(line.c_str(), "mb%ld_ic%ldoc%ld_ih%ldoh%ldkh%ldsh%lddh%ldph%ld_iw%ldow%ldkw%ldsw%lddw%ldpw%ld", &p.mb,
                    &p.ic, &p.oc, &p.ih, &p.oh, &p.kh, &p.sh, &p.dh, &p.ph, &p.iw, &p.ow, &p.kw, &p.sw, &p.dw, &p.pw) == 15)
      shapes.push_back(p);
  }
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  double total = 0;
  for (const auto& p : shapes) {
    const auto pd = describe(eng, p);
    dnnl::memory src(pd.src_desc(), eng), wei(pd.weights_desc(), eng), dst(pd.dst_desc(), eng);
    dnnl::memory bia(dnnl::memory::desc({p.oc}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a), eng);
    std::fill_n(static_cast<float*>(src.get_data_handle()), pd.src_desc().get_size() / sizeof(float), 0.5f);
    std::fill_n(static_cast<float*>(wei.get_data_handle()), pd.weights_desc().get_size() / sizeof(float), 0.01f);
    std::fill_n(static_cast<float*>(bia.get_data_handle()), p.oc, 0.f);
    const dnnl::convolution_forward conv(pd);
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      conv.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bia}, {DNNL_ARG_DST, dst}});
      st.wait();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    total += med;
    std::printf("ic %ld oc %ld %ldx%ld k%ld s%ld  %-28s %.4f ms  %.0f GFLOP/s\n", p.ic, p.oc, p.ih, p.iw, p.kh, p.sh,
                pd.impl_info_str(), med, 2.0 * p.mb * p.ic * p.oc * p.kh * p.kw * p.oh * p.ow / med / 1e6);
  }
  std::printf("total %.3f ms over %zu convolutions\n", total, shapes.size());
  return 0;
}
