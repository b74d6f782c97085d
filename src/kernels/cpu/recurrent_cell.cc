// An LSTM step's cell on MLX's CPU stream (kernels/cpu/kernels.h: cpu_lstm_cell).
//
// Why: as MLX ops a step's gate arithmetic is a dozen primitives (column slices, sigmoids and
// tanhs, products, sums) over a few hundred floats each, every one a task of the stream thread.
#include <atomic>
#include <stdexcept>
#include <vector>

#include <mlx/primitives.h>

#include "kernels/cpu/buffers.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

std::atomic<uint64_t> g_cells{0};

// One row: gates g = xw + hr in ONNX's order (i, o, f, c); c' = f c + i tanh(g_c),
// h' = o tanh(c'), with i, o, f the sigmoids of theirs.
void cell_row(const float* xw, const float* hr, const float* c, float* h_out, float* c_out, float* g, int H) {
  for (int j = 0; j < 4 * H; ++j) g[j] = xw[j] + hr[j];
  cpu_unary_rows(CpuUnary::Sigmoid, g, g, 3 * H);
  cpu_unary_rows(CpuUnary::Tanh, g + 3 * H, g + 3 * H, H);
  const float *i = g, *o = g + H, *f = g + 2 * H, *cc = g + 3 * H;
  for (int k = 0; k < H; ++k) c_out[k] = f[k] * c[k] + i[k] * cc[k];
  cpu_unary_rows(CpuUnary::Tanh, c_out, h_out, H);
  for (int k = 0; k < H; ++k) h_out[k] *= o[k];
}

// Inputs xw, hr [..., 4H] and c [..., H] (rows taken flat); outputs h' and c' of c's shape.
class LstmCell : public mx::Primitive {
 public:
  LstmCell(mx::Stream s, int rows, int H) : mx::Primitive(s), rows_(rows), H_(H) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) begin_output(inputs, o, stream());
    dispatch_task(stream(), [xw = RowMajorInput(inputs[0]), hr = RowMajorInput(inputs[1]), c = RowMajorInput(inputs[2]),
                             h_out = outputs[0].data<float>(), c_out = outputs[1].data<float>(), rows = rows_, H = H_] {
      g_cells.fetch_add(1, std::memory_order_relaxed);
      std::vector<float> g(static_cast<size_t>(4) * H);
      for (int r = 0; r < rows; ++r) {
        const size_t at = static_cast<size_t>(r) * H;
        cell_row(xw.rows() + 4 * at, hr.rows() + 4 * at, c.rows() + at, h_out + at, c_out + at, g.data(), H);
      }
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::logic_error("[LstmCell] runs on the CPU stream only");
  }
  const char* name() const override { return "LstmCell"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const LstmCell*>(&other);
    return o && o->rows_ == rows_ && o->H_ == H_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[2].shape(), inputs[2].shape()};
  }

 private:
  int rows_, H_;
};

}  // namespace

uint64_t cpu_lstm_cell_runs() { return g_cells.load(std::memory_order_relaxed); }

std::optional<std::vector<mx::array>> cpu_lstm_cell(const mx::array& xw, const mx::array& hr, const mx::array& c,
                                                    mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || xw.dtype() != mx::float32 ||
      hr.dtype() != mx::float32 || c.dtype() != mx::float32 || c.ndim() < 1 || xw.shape() != hr.shape() ||
      xw.ndim() != c.ndim())
    return std::nullopt;
  const int H = c.shape(-1);
  for (int d = 0; d + 1 < static_cast<int>(c.ndim()); ++d)
    if (xw.shape(d) != c.shape(d)) return std::nullopt;
  if (H <= 0 || xw.shape(-1) != 4 * H) return std::nullopt;
  const int rows = static_cast<int>(c.size() / static_cast<size_t>(H));
  return mx::array::make_arrays({c.shape(), c.shape()}, {mx::float32, mx::float32},
                                std::make_shared<LstmCell>(s, rows, H), {xw, hr, c});
}

}  // namespace ortmlx::ops
