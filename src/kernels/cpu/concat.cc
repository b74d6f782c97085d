// Concatenation on MLX's CPU stream as whole-chunk copies (kernels/cpu/kernels.h, cpu_concat).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

// Inputs read row-major (RowMajorInput), so the output is, for each index of the axes before
// `axis`, one contiguous chunk of each input in turn: one memcpy per chunk.
class ChunkConcat : public mx::UnaryPrimitive {
 public:
  ChunkConcat(mx::Stream s, int axis) : mx::UnaryPrimitive(s), axis_(axis) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    std::vector<RowMajorInput> src;  // views gathered in the task (no Contiguous primitives)
    std::vector<size_t> chunk;
    for (const auto& x : inputs) {
      size_t inner = x.itemsize();
      for (int d = axis_; d < static_cast<int>(x.ndim()); ++d) inner *= static_cast<size_t>(x.shape(d));
      src.emplace_back(x);
      chunk.push_back(inner);
    }
    size_t outer = 1;
    for (int d = 0; d < axis_; ++d) outer *= static_cast<size_t>(out.shape(d));
    dispatch_task(stream(), [dst = out.data<char>(), src = std::move(src), chunk = std::move(chunk), outer] {
      char* o = dst;
      for (size_t i = 0; i < outer; ++i)
        for (size_t k = 0; k < src.size(); ++k) {
          if (chunk[k]) std::memcpy(o, src[k].rows<char>() + i * chunk[k], chunk[k]);
          o += chunk[k];
        }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[ChunkConcat] runs on the CPU stream only");
  }
  const char* name() const override { return "ChunkConcat"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(ChunkConcat) && static_cast<const ChunkConcat&>(other).axis_ == axis_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape out = inputs[0].shape();
    for (size_t i = 1; i < inputs.size(); ++i) out[axis_] += inputs[i].shape(axis_);
    return {out};
  }

 private:
  int axis_;
};

}  // namespace

std::optional<mx::array> cpu_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_row_kernels_enabled() || xs.size() < 2) return std::nullopt;
  const auto& first = xs[0];
  const int nd = static_cast<int>(first.ndim());
  if (axis < 0) axis += nd;
  if (axis < 0 || axis >= nd) return std::nullopt;
  mx::Shape out = first.shape();
  out[axis] = 0;
  std::vector<mx::array> inputs;
  for (const auto& x : xs) {
    if (x.dtype() != first.dtype() || static_cast<int>(x.ndim()) != nd) return std::nullopt;
    for (int d = 0; d < nd; ++d)
      if (d != axis && x.shape(d) != first.shape(d)) return std::nullopt;
    out[axis] += x.shape(axis);
    inputs.push_back(x);
  }
  return mx::array(std::move(out), first.dtype(), std::make_shared<ChunkConcat>(s, axis), std::move(inputs));
}

}  // namespace ortmlx::ops
