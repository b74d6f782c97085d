// A chain of per-channel and elementwise steps over a convolution's channel-blocked buffer
// (kernels/cpu/kernels.h: cpu_blocked_steps), one pass split over the threads.
//
// Why: as MLX ops, a BatchNormalization and Relu between two convolutions (a DenseNet's
// pre-activations), or a residual Add and Relu (a ResNet's), become one generated kernel that
// MLX's stream thread runs alone over the whole activation while the other core waits.
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include <mlx/primitives.h>

#include "kernels/cpu/buffers.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/task.h"

namespace ortmlx::ops {

namespace {

std::atomic<uint64_t> g_runs{0};

using Kind = CpuBlockedStep::Kind;

// Positions a work item (a split's unit).
constexpr int64_t kTilePositions = 64;

// Element `e` of a position's `b` lanes through every step, one at a time (the scalar form).
inline float steps_at(const std::vector<CpuBlockedStep::Kind>& kinds, const std::vector<const float*>& operands,
                      float v, int64_t at, int64_t c) {
  for (size_t k = 0; k < kinds.size(); ++k) {
    switch (kinds[k]) {
      case Kind::MulChannel: v = v * operands[k][c]; break;
      case Kind::AddChannel: v = v + operands[k][c]; break;
      case Kind::AddBuffer: v = v + operands[k][at]; break;
      case Kind::Relu: v = v < 0.f ? 0.f : v; break;  // a NaN stays NaN, as MLX's maximum keeps it
    }
  }
  return v;
}

// `n` positions x `b` lanes from element `at` of the buffer, channels from `c0`.
void run_tile_plain(const std::vector<CpuBlockedStep::Kind>& kinds, const std::vector<const float*>& operands,
                    const float* x, float* y, int64_t at, int64_t n, int b, int64_t c0) {
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < b; ++j) {
      const int64_t e = at + i * b + j;
      y[e] = steps_at(kinds, operands, x[e], e, c0 + j);
    }
}

#ifdef ORTMLX_X86
// Every step on 16 lanes `v` at element `e`, channels from `c`: a channel's parameters from
// `param` (in registers) or, without it, from memory.
__attribute__((target("avx512f"), always_inline)) inline __m512 apply_avx512(const Kind* kind, size_t steps,
                                                                             const std::vector<const float*>& operands,
                                                                             __m512 v, __mmask16 m, int64_t e,
                                                                             const __m512* param, int64_t c) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t k = 0; k < steps; ++k) {
    switch (kind[k]) {
      case Kind::MulChannel: v = _mm512_mul_ps(v, param ? param[k] : _mm512_maskz_loadu_ps(m, operands[k] + c)); break;
      case Kind::AddChannel: v = _mm512_add_ps(v, param ? param[k] : _mm512_maskz_loadu_ps(m, operands[k] + c)); break;
      case Kind::AddBuffer: v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, operands[k] + e)); break;
      case Kind::Relu:  // lanes below zero to zero; NaN (unordered) kept
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
        break;
    }
  }
  return v;
}

// The same 16 lanes at a time in one register through every step (masked at a position's last,
// partial block), the same operations in the same order: the same bits. A block of lanes takes
// its channels' parameters into registers once, then every position of the tile; channels last
// (one block of all the channels) go position by position.
__attribute__((target("avx512f"))) void run_tile_avx512(const std::vector<CpuBlockedStep::Kind>& kinds,
                                                         const std::vector<const float*>& operands, const float* x,
                                                         float* y, int64_t at, int64_t n, int b, int64_t c0) {
  constexpr size_t kMaxSteps = 8;
  const size_t steps = kinds.size();
  if (steps > kMaxSteps) return run_tile_plain(kinds, operands, x, y, at, n, b, c0);
  Kind kind[kMaxSteps];
  for (size_t k = 0; k < steps; ++k) kind[k] = kinds[k];
  __m512 param[kMaxSteps];
  if (b == 1) {  // planar (NCHW): a row of one channel, its parameters broadcast
    for (size_t k = 0; k < steps; ++k)
      if (kind[k] == Kind::MulChannel || kind[k] == Kind::AddChannel) param[k] = _mm512_set1_ps(operands[k][c0]);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = first_lanes(n - i);
      const int64_t e = at + i;
      const __m512 v = _mm512_maskz_loadu_ps(m, x + e);
      _mm512_mask_storeu_ps(y + e, m, apply_avx512(kind, steps, operands, v, m, e, param, c0));
    }
    return;
  }
  if (b > 64) {  // channels last: position by position, in order (the parameters stay in L1)
    for (int64_t i = 0; i < n; ++i)
      for (int j = 0; j < b; j += 16) {
        const __mmask16 m = first_lanes(b - j);
        const int64_t e = at + i * b + j;
        const __m512 v = _mm512_maskz_loadu_ps(m, x + e);
        _mm512_mask_storeu_ps(y + e, m, apply_avx512(kind, steps, operands, v, m, e, nullptr, c0 + j));
      }
    return;
  }
  for (int j = 0; j < b; j += 16) {
    const __mmask16 m = first_lanes(b - j);
    for (size_t k = 0; k < steps; ++k)
      if (kind[k] == Kind::MulChannel || kind[k] == Kind::AddChannel)
        param[k] = _mm512_maskz_loadu_ps(m, operands[k] + c0 + j);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = at + i * b + j;
      const __m512 v = _mm512_maskz_loadu_ps(m, x + e);
      _mm512_mask_storeu_ps(y + e, m, apply_avx512(kind, steps, operands, v, m, e, param, c0 + j));
    }
  }
}
#endif

using TileFn = void (*)(const std::vector<CpuBlockedStep::Kind>&, const std::vector<const float*>&, const float*,
                        float*, int64_t, int64_t, int, int64_t);
TileFn tile_fn() {
#ifdef ORTMLX_X86
  if (cpu_has_avx512f()) return run_tile_avx512;
#endif
  return run_tile_plain;
}

// Inputs: the blocked buffer [N, C / b, positions, b] (any shape of that size), then each
// step's operand ([C] for a channel's, the buffer's size for another buffer).
class BlockedSteps : public mx::UnaryPrimitive {
 public:
  BlockedSteps(mx::Stream s, std::vector<Kind> kinds, int channels, int block, int64_t positions, bool split)
      : mx::UnaryPrimitive(s), kinds_(std::move(kinds)), C_(channels), b_(block), hw_(positions), split_(split) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output_over(inputs[0], out);
    std::vector<RowMajorInput> ops;
    for (size_t i = 1; i < inputs.size(); ++i) ops.emplace_back(inputs[i]);
    std::vector<int> operand_of;  // each step's input index, -1 for none
    for (size_t k = 0, next = 1; k < kinds_.size(); ++k)
      operand_of.push_back(kinds_[k] == Kind::Relu ? -1 : static_cast<int>(next++));
    dispatch_task(stream(), [x = RowMajorInput(inputs[0]), ops = std::move(ops), operand_of, kinds = kinds_,
                             y = out.data<float>(), n = static_cast<int64_t>(out.size()), C = C_, b = b_, hw = hw_,
                             split = split_, run = tile_fn()] {
      g_runs.fetch_add(1, std::memory_order_relaxed);
      const float* xp = x.rows();
      std::vector<const float*> operands;
      for (int i : operand_of) operands.push_back(i < 0 ? nullptr : ops[static_cast<size_t>(i - 1)].rows());
      // A planar row's positions are single floats: tiles of as many floats as a blocked one's.
      const int64_t tile = b == 1 ? kTilePositions * 16 : kTilePositions;
      const int64_t blocks = C / b, rows = n / (hw * b), tiles = (hw + tile - 1) / tile;
      auto work = [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t r = item / tiles, p0 = item % tiles * tile;
          const int64_t count = std::min(tile, hw - p0);
          const int64_t at = (r * hw + p0) * b, c0 = r % blocks * b;
          run(kinds, operands, xp, y, at, count, b, c0);
        }
      };
      // Chunks of >= 32K elements (~10 us of work each, the price of a hand-off).
      const int parts = split ? static_cast<int>(std::min<int64_t>(cpu_threads(), n / (int64_t{1} << 15))) : 1;
      cpu_parallel_for(rows * tiles, parts, work);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error("[BlockedSteps] runs on the CPU stream only");
  }
  const char* name() const override { return "BlockedSteps"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const BlockedSteps*>(&other);
    return o && o->kinds_ == kinds_ && o->C_ == C_ && o->b_ == b_ && o->hw_ == hw_ && o->split_ == split_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }
  const std::vector<Kind>& kinds() const { return kinds_; }
  bool same_layout(int channels, int block, int64_t positions) const {
    return channels == C_ && block == b_ && positions == hw_;
  }

 private:
  std::vector<Kind> kinds_;
  int C_, b_;
  int64_t hw_;
  bool split_;
};

}  // namespace

uint64_t cpu_blocked_steps_runs() { return g_runs.load(std::memory_order_relaxed); }

mx::array cpu_blocked_steps(const mx::array& buffer, const std::vector<CpuBlockedStep>& steps, int channels, int block,
                            int64_t positions, bool split, mx::Stream s) {
  mx::array src = buffer;
  std::vector<Kind> kinds;
  std::vector<mx::array> inputs;
  // A chain continued (a Relu after a BatchNormalization): one kernel for both, from the first's
  // input (the first stays for any other reader of its output).
  const auto* prev = buffer.has_primitive() && !buffer.is_available() &&
                            buffer.primitive().name() == std::string_view("BlockedSteps")
                        ? static_cast<const BlockedSteps*>(&buffer.primitive())
                        : nullptr;
  if (prev && prev->same_layout(channels, block, positions)) {
    kinds = prev->kinds();
    inputs = buffer.inputs();
    src = inputs[0];
  } else {
    inputs.push_back(src);
  }
  for (const auto& step : steps) {
    kinds.push_back(step.kind);
    if (step.kind != Kind::Relu) inputs.push_back(*step.operand);
  }
  return mx::array(src.shape(), mx::float32,
                   std::make_shared<BlockedSteps>(s, std::move(kinds), channels, block, positions, split),
                   std::move(inputs));
}

std::optional<mx::array> cpu_channel_vector(const mx::array& p, int channels, mx::Stream s) {
  if (p.dtype() != mx::float32) return std::nullopt;
  if (p.size() == 1) return mx::broadcast_to(mx::reshape(p, {1}, s), {channels}, s);
  if (p.size() != static_cast<size_t>(channels) || p.ndim() > 4) return std::nullopt;
  for (int d = 0; d < static_cast<int>(p.ndim()); ++d)  // the channel is axis 1 of 4 (ndim - 3)
    if (p.shape(d) != (d == static_cast<int>(p.ndim()) - 3 ? channels : 1)) return std::nullopt;
  auto flat = mx::reshape(p, {channels}, s);
  if (p.is_available() && !p.is_tracer()) mx::eval(flat);  // a constant's view, made once
  return flat;
}

std::optional<mx::array> cpu_channel_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, bool split,
                                           mx::Stream s) {
  if (s.device != mx::Device::cpu || x.ndim() != 4 || x.dtype() != mx::float32 || steps.empty() || x.size() == 0)
    return std::nullopt;
  const int C = x.shape(1);
  std::vector<CpuBlockedStep> laid;
  for (const auto& step : steps) {
    if (step.kind == Kind::Relu) {
      laid.push_back(step);
      continue;
    }
    if (step.kind == Kind::AddBuffer) {
      if (step.operand->shape() != x.shape() || step.operand->dtype() != mx::float32) return std::nullopt;
      laid.push_back(step);
      continue;
    }
    auto v = cpu_channel_vector(*step.operand, C, s);
    if (!v) return std::nullopt;
    laid.push_back({step.kind, *v});
  }
  return cpu_blocked_steps(x, laid, C, 1, static_cast<int64_t>(x.shape(2)) * x.shape(3), split, s);
}

bool cpu_is_channel_steps(const mx::array& x) {
  return x.has_primitive() && !x.is_available() && x.primitive().name() == std::string_view("BlockedSteps");
}

}  // namespace ortmlx::ops
