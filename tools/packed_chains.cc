// One-row products of the EP's packed kernel (kernels/cpu/packed_gemm.cc, cpu_packed_matmul) as
// a decode step meets them: for each shape, a chain of products of one row by 8 distinct
// weights (a model's layers; 1 for the LM head's shape), evaluated by MLX on its CPU stream with
// the OpenMP workers pinned as the EP pins them; prints the median chain's time, the weights'
// bytes a second, and the time a product. Against tools/cpu_ceilings.cc's read rate it shows
// what each product costs beyond reading its weight.
//   cmake --build build --target ortmlx_core
//   g++ -O2 -std=gnu++20 -Isrc -isystem .venv/lib/python3.11/site-packages/mlx/include \
//     tools/packed_chains.cc -o /tmp/packed_chains build/libortmlx_core.a \
//     .venv/lib/python3.11/site-packages/mlx/lib/libmlx.so \
//     -Wl,-rpath,$PWD/.venv/lib/python3.11/site-packages/mlx/lib -ldl -lpthread
//   LD_LIBRARY_PATH=build /tmp/packed_chains [ahead_bytes] [one]
// (LD_LIBRARY_PATH: the kernels' OpenMP threads come from the oneDNN beside the EP; `one`: the
// products on the stream thread alone.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/kernels.h"

namespace mx = mlx::core;
using namespace ortmlx::ops;

int main(int argc, char** argv) {
  mx::set_default_device(mx::Device::cpu);
  const auto s = mx::default_stream(mx::Device::cpu);
  cpu_pin_openmp_workers(s);
  PackedWalk walk;
  if (argc > 1) walk.ahead = std::atol(argv[1]);
  const bool parallel = !(argc > 2 && std::strcmp(argv[2], "one") == 0);
  struct Shape {
    int k, n, count;
  };
  // The 60M Llama's step: QKV, O, gate and up together, down; the LM head; a wide product.
  for (const Shape sh : {Shape{512, 1024, 8}, Shape{512, 512, 8}, Shape{512, 3072, 8}, Shape{1536, 512, 8},
                         Shape{512, 32000, 1}, Shape{512, 12288, 8}}) {
    std::vector<mx::array> weights;
    for (int l = 0; l < sh.count; ++l) weights.push_back(mx::random::normal({sh.k, sh.n}));
    mx::eval(weights);
    mx::array x = mx::random::normal({1, sh.k});
    mx::eval(x);
    // The primitives of the last chains are held: they hold the weights' panels (laid out on a
    // primitive's first run; a new primitive finds them while another holds them).
    std::vector<std::shared_ptr<mx::Primitive>> held;
    std::vector<double> ms;
    for (int rep = 0; rep < 60; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<mx::array> outs;
      for (const auto& w : weights) {
        auto y = cpu_packed_matmul(x, w, parallel, walk, s);
        if (!y) {
          std::puts("the packed kernel declined (needs x86-64 with AVX2)");
          return 1;
        }
        held.push_back(y->primitive_ptr());
        outs.push_back(*y);
      }
      mx::eval(outs);
      if (held.size() > 3 * weights.size()) held.erase(held.begin(), held.begin() + static_cast<long>(weights.size()));
      if (rep >= 10)
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double m = ms[ms.size() / 2];
    std::printf("%5d x %5d x %d: %.3f ms a chain, %5.1f GB/s, %6.1f us a product\n", sh.k, sh.n, sh.count, m,
                4.0 * sh.k * sh.n * sh.count / m / 1e6, m * 1e3 / sh.count);
  }
  return 0;
}
