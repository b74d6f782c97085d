// The CPU device's float32 convolutions through oneDNN (kernels.h: cpu_dnnl_conv_plan and
// the two primitives below).
//
// oneDNN is loaded at run time (dnnl_library.h: dlopen of libdnnl.so.2, next to this library
// first): its headers give the types at build time, every call goes through a pointer looked up
// once. Without the headers at build time, or the library at run time, every entry point says
// "not available" and the translators keep MLX's convolution.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/task.h"

#ifdef ORTMLX_HAVE_DNNL

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include "kernels/cpu/dnnl_library.h"
#include "kernels/cpu/simd.h"

namespace ortmlx::ops {

namespace {

// The shared loader (dnnl_library.h), under the short name this file calls it by.
const DnnlLibrary& lib() { return dnnl_lib(); }

std::atomic<uint64_t> g_runs{0};
std::atomic<uint64_t> g_one_thread_runs{0};
std::atomic<uint64_t> g_gemm_refusals{0};
std::atomic<uint64_t> g_winograd_runs{0};
std::atomic<uint64_t> g_convs_concats{0};

dnnl_format_tag_t plain_tag(int ndims) {
  switch (ndims) {
    case 1: return dnnl_a;
    case 3: return dnnl_abc;
    case 4: return dnnl_abcd;
    case 5: return dnnl_abcde;
    case 6: return dnnl_abcdef;
    default: return dnnl_format_tag_undef;
  }
}

dnnl_memory_desc_t plain_md(const std::vector<int64_t>& dims, dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md{};
  dnnl_dims_t d{};
  for (size_t i = 0; i < dims.size(); ++i) d[i] = dims[i];
  if (lib().memory_desc_init_by_tag(&md, static_cast<int>(dims.size()), d, dnnl_f32, tag) != dnnl_success)
    throw std::runtime_error("oneDNN: memory_desc_init_by_tag failed");
  return md;
}

}  // namespace

// A primitive with the scratch memory it needs per execution.
struct Step {
  dnnl_primitive_t p = nullptr;
  dnnl_memory_desc_t scratch_md{};
  size_t scratch_bytes = 0;
};

// Under ThreadSanitizer a Winograd weight's transform (once per program) runs on the calling
// thread alone: oneDNN clears its scratch memory from OpenMP's workers with memset, and the
// hand-off back through libgomp's barrier (not instrumented) looks like a race to it. Elsewhere it
// splits as every step does (a one-thread limit would give each calling thread libgomp state).
#if defined(__SANITIZE_THREAD__)
constexpr bool kOneThreadWinogradWeights = true;
#else
constexpr bool kOneThreadWinogradWeights = false;
#endif

// One convolution geometry's oneDNN objects: the convolution in the layouts oneDNN picks for it
// (blocked, e.g. nChw8c), and the reorders between those and ONNX's plain layouts.
struct DnnlConvPlan {
  dnnl_memory_desc_t src_plain{}, w_plain{}, dst_plain{}, bias_md{};
  dnnl_memory_desc_t src_md{}, w_md{}, dst_md{};  // as the convolution takes them
  Step conv, src_in, w_in, dst_out;  // the reorders' p is null where the layouts agree
  size_t w_bytes = 0, src_bytes = 0, dst_bytes = 0;  // in the convolution's layouts
  bool bias = false;
  bool winograd = false;  // the convolution is one of oneDNN's Winograd kernels
  int threads = 0;  // DnnlConvShape::threads, for every step's creation and execution
  int w_threads() const { return winograd && kOneThreadWinogradWeights ? 1 : threads; }  // ... but w_in's

  DnnlConvPlan() = default;
  DnnlConvPlan(const DnnlConvPlan&) = delete;
  DnnlConvPlan& operator=(const DnnlConvPlan&) = delete;
  ~DnnlConvPlan() {
    for (const Step* st : {&conv, &src_in, &w_in, &dst_out})
      if (st->p) lib().primitive_destroy(st->p);
  }
};

namespace {

// The primitive of `pd` (which it releases) and its scratch memory.
Step make_step(dnnl_primitive_desc_t pd) {
  const auto& l = lib();
  Step st;
  st.scratch_md = *l.primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  st.scratch_bytes = l.memory_desc_get_size(&st.scratch_md);
  const auto status = l.primitive_create(&st.p, pd);
  l.primitive_desc_destroy(pd);
  if (status != dnnl_success) throw std::runtime_error("oneDNN: primitive creation failed");
  return st;
}

// A reorder between two layouts of the same tensor; no primitive when they are the same layout.
Step make_reorder(const dnnl_memory_desc_t& from, const dnnl_memory_desc_t& to) {
  const auto& l = lib();
  if (l.memory_desc_equal(&from, &to)) return {};
  dnnl_primitive_desc_t pd = nullptr;
  if (l.reorder_primitive_desc_create(&pd, &from, l.engine, &to, l.engine, l.user_scratchpad) != dnnl_success)
    throw std::runtime_error("oneDNN: no reorder between the plain and the blocked layout");
  return make_step(pd);
}

dnnl_alg_kind_t eltwise_alg(ConvPostOp::Kind k) {
  switch (k) {
    case ConvPostOp::Relu: return dnnl_eltwise_relu;
    case ConvPostOp::Clip: return dnnl_eltwise_clip;
    case ConvPostOp::Linear: return dnnl_eltwise_linear;
    case ConvPostOp::HardSwish: return dnnl_eltwise_hardswish;
    case ConvPostOp::Logistic: return dnnl_eltwise_logistic;
    case ConvPostOp::Tanh: return dnnl_eltwise_tanh;
    case ConvPostOp::Swish: return dnnl_eltwise_swish;
    case ConvPostOp::Sum: break;  // (not an eltwise post-op)
  }
  return dnnl_alg_kind_undef;
}

std::shared_ptr<DnnlConvPlan> build_plan(const DnnlConvShape& g) {
  const auto& l = lib();
  const int nd = static_cast<int>(g.x.size()) - 2;
  auto p = std::make_shared<DnnlConvPlan>();
  p->threads = g.threads;
  const ThreadLimit limit(g.threads);
  std::vector<int64_t> x(g.x.begin(), g.x.end()), w(g.w.begin(), g.w.end()), y(g.y.begin(), g.y.end());
  p->src_plain = plain_md(x, plain_tag(nd + 2));
  p->dst_plain = plain_md(y, plain_tag(nd + 2));
  // oneDNN's weight dims are (g,) out, in, K..; ONNX stores a convolution's that way and a
  // transposed one's as in, out, K.. (the tags below read that memory order).
  const int64_t M = g.y[1];
  if (g.transposed) std::swap(w[0], w[1]);  // [C, M/g, K..] -> dims [M/g, C, K..]
  if (g.groups > 1) {  // -> [g, M/g, C/g, K..]
    w.insert(w.begin(), g.groups);
    w[g.transposed ? 2 : 1] /= g.groups;
    if (g.transposed) w[1] = M / g.groups;
  }
  dnnl_format_tag_t w_tag = plain_tag(static_cast<int>(w.size()));
  if (g.transposed) {
    static const dnnl_format_tag_t io[] = {dnnl_bac, dnnl_bacd, dnnl_bacde};        // iow, iohw, iodhw
    static const dnnl_format_tag_t gio[] = {dnnl_acbd, dnnl_acbde, dnnl_acbdef};    // giow, giohw, giodhw
    w_tag = (g.groups > 1 ? gio : io)[nd - 1];
  }
  p->w_plain = plain_md(w, w_tag);
  p->bias = g.bias;
  if (g.bias) p->bias_md = plain_md({M}, dnnl_a);
  // blocked16: nChw16c where a side's channels are a multiple of 16 (a first layer's few input
  // channels: oneDNN's pick, plain), whatever layout oneDNN would pick for the geometry alone.
  auto side = [&](const std::vector<int64_t>& dims) {
    const bool b16 = g.blocked16 && nd == 2 && dims[1] % 16 == 0;
    return plain_md(dims, b16 ? dnnl_nChw16c : dnnl_format_tag_any);
  };
  dnnl_memory_desc_t any_src = side(x), any_w = plain_md(w, dnnl_format_tag_any), any_dst = side(y);
  dnnl_dims_t stride{}, dil{}, lo{}, hi{};
  for (int d = 0; d < nd; ++d) {
    stride[d] = g.stride[d];
    dil[d] = g.dilation[d] - 1;  // oneDNN counts the gaps between taps
    lo[d] = g.pad_lo[d];
    hi[d] = g.pad_hi[d];
  }
  const auto* bias_md = g.bias ? &p->bias_md : nullptr;
  auto describe = [&](dnnl_convolution_desc_t& cd, dnnl_alg_kind_t alg) {
    return g.transposed
               ? l.dilated_deconvolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_deconvolution_direct,
                                                          &any_src, &any_w, bias_md, &any_dst, stride, dil, lo, hi)
               : l.dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, alg, &any_src, &any_w, bias_md,
                                                        &any_dst, stride, dil, lo, hi);
  };
  // (the deconvolution descriptor has the same layout and type)
  dnnl_convolution_desc_t cd{}, wino_cd{};
  if (describe(cd, dnnl_convolution_direct) != dnnl_success)
    throw std::runtime_error("oneDNN: convolution descriptor rejected");
  const bool try_wino = g.winograd && g.blocked16 && !g.transposed && nd == 2 &&
                        describe(wino_cd, dnnl_convolution_winograd) == dnnl_success;
  // The post-ops, on top of the caller-provided scratch memory.
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t ops = nullptr;
  bool attr_ok = l.primitive_attr_create(&attr) == dnnl_success &&
                 l.primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (attr_ok && !g.post_ops.empty()) {
    attr_ok = l.post_ops_create(&ops) == dnnl_success;
    for (const auto& op : g.post_ops)
      attr_ok = attr_ok && (op.kind == ConvPostOp::Sum
                                ? l.post_ops_append_sum(ops, 1.f)
                                : l.post_ops_append_eltwise(ops, 1.f, eltwise_alg(op.kind), op.alpha, op.beta)) == dnnl_success;
    attr_ok = attr_ok && l.primitive_attr_set_post_ops(attr, ops) == dnnl_success;
  }
  dnnl_primitive_desc_t pd = nullptr;
  // Winograd where oneDNN has a kernel for the geometry and post-ops (it has none for most),
  // else the direct convolution.
  p->winograd = try_wino && attr_ok && l.primitive_desc_create(&pd, &wino_cd, attr, l.engine, nullptr) == dnnl_success;
  const bool made = attr_ok && (p->winograd || l.primitive_desc_create(&pd, &cd, attr, l.engine, nullptr) == dnnl_success);
  if (ops) l.post_ops_destroy(ops);
  if (attr) l.primitive_attr_destroy(attr);
  if (!made) throw std::runtime_error("oneDNN: no convolution implementation");
  // A GEMM-based implementation runs oneDNN's JIT GEMM kernels, which (in the oneDNN versions
  // distributions ship) point the stack register into heap memory while they run: a signal
  // delivered meanwhile (a profiler's, a host runtime's) writes its frame there and corrupts the
  // heap (oneDNN issue 4845). Only direct kernels run here; the rest stays MLX's.
  const char* impl = nullptr;
  if (l.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
      std::strstr(impl, "gemm")) {
    const std::string name = impl ? impl : "?";
    l.primitive_desc_destroy(pd);
    g_gemm_refusals.fetch_add(1, std::memory_order_relaxed);
    throw std::runtime_error("oneDNN: only a GEMM-based convolution (" + name + ")");
  }
  // Post-ops some kernels lack send oneDNN to its reference loops (the deconvolutions' do):
  // slower than the convolution without them and the steps as MLX ops (the caller's retry).
  // So do 16-channel blocks some geometry has no kernel for (the caller's retry: oneDNN's pick).
  if ((!g.post_ops.empty() || g.blocked16) && std::strncmp(impl, "ref", 3) == 0) {
    l.primitive_desc_destroy(pd);
    throw std::runtime_error("oneDNN: only a reference implementation with these post-ops");
  }
  p->src_md = *l.primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  p->w_md = *l.primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  p->dst_md = *l.primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
  p->w_bytes = l.memory_desc_get_size(&p->w_md);
  p->src_bytes = l.memory_desc_get_size(&p->src_md);
  p->dst_bytes = l.memory_desc_get_size(&p->dst_md);
  p->conv = make_step(pd);
  p->src_in = make_reorder(p->src_plain, p->src_md);
  {
    std::optional<ThreadLimit> one;  // (DnnlConvPlan::w_threads)
    if (p->winograd && kOneThreadWinogradWeights) one.emplace(1);
    p->w_in = make_reorder(p->w_plain, p->w_md);
  }
  p->dst_out = make_reorder(p->dst_md, p->dst_plain);
  return p;
}

// A memory object over `data` (owned by the caller) for one execution.
struct Memory {
  dnnl_memory_t m = nullptr;
  Memory(const dnnl_memory_desc_t& md, void* data) {
    if (lib().memory_create(&m, &md, lib().engine, data) != dnnl_success) m = nullptr;
  }
  ~Memory() {
    if (m) lib().memory_destroy(m);
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
};

// A buffer oneDNN's kernels may read with aligned vector loads.
struct Scratch {
  float* p = nullptr;
  explicit Scratch(size_t bytes) : p(static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// The calling thread's stream on the engine (a stream is not for two threads at once; MLX's
// CPU stream runs its tasks on one thread).
dnnl_stream_t thread_stream() {
  struct Stream {
    dnnl_stream_t s = nullptr;
    Stream() { lib().stream_create(&s, lib().engine, dnnl_stream_default_flags); }
    ~Stream() {
      if (s) lib().stream_destroy(s);
    }
  };
  thread_local Stream st;
  return st.s;
}

// The calling thread's buffer `slot` of at least `bytes`, grown as needed and kept for the next
// task (MLX's stream thread runs one at a time): oneDNN's scratch memory, and a convolution's
// source and destination in its blocked layout, which as fresh allocations would be new pages
// to fault in on every run. Null when an allocation fails.
enum BufferSlot { kScratchpad, kBlockedSrc, kBlockedDst, kBufferSlots };
float* thread_buffer(BufferSlot slot, size_t bytes) {
  thread_local std::unique_ptr<Scratch> buffers[kBufferSlots];
  thread_local size_t sizes[kBufferSlots] = {};
  if (sizes[slot] < bytes) {
    buffers[slot] = std::make_unique<Scratch>(bytes);
    sizes[slot] = buffers[slot]->p ? bytes : 0;
  }
  return sizes[slot] >= bytes ? buffers[slot]->p : nullptr;
}

// Runs a step with the calling thread's scratch buffer.
bool execute(const Step& st, std::initializer_list<dnnl_exec_arg_t> args) {
  std::vector<dnnl_exec_arg_t> all(args);
  std::unique_ptr<Memory> m;
  if (st.scratch_bytes) {
    float* scratch = thread_buffer(kScratchpad, st.scratch_bytes);
    if (!scratch) return false;
    m = std::make_unique<Memory>(st.scratch_md, scratch);
    if (!m->m) return false;
    all.push_back({DNNL_ARG_SCRATCHPAD, m->m});
  }
  return lib().primitive_execute(st.p, thread_stream(), static_cast<int>(all.size()), all.data()) == dnnl_success;
}

// y[0, n) = x[0, n): in AVX-512 registers where the CPU has them. Why: a channels-last
// concatenation copies each position's channels of each input (a few hundred bytes), and
// memcpy's call and size dispatch cost more than such a copy.
using CopyFloats = void (*)(float*, const float*, int64_t);
#ifdef ORTMLX_X86
__attribute__((target("avx512f"))) void copy_floats_avx512(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_loadu_ps(x + i));
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_maskz_loadu_ps(m, x + i));
  }
}
#endif
void copy_floats_memcpy(float* y, const float* x, int64_t n) { std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float)); }
CopyFloats copy_floats_fn() {
#ifdef ORTMLX_X86
  if (cpu_has_avx512f()) return copy_floats_avx512;
#endif
  return copy_floats_memcpy;
}

// Runs on MLX's stream thread, where nothing may throw: a failure leaves NaN in the output
// (never a plausible value) and is counted.
std::atomic<uint64_t> g_failures{0};
std::atomic<uint64_t> g_add_runs{0}, g_add_in_place{0};
constexpr size_t kResidualPiece = size_t{64} << 10;  // bytes of a residual's copy a work item
void fail_output(float* y, size_t n) {
  g_failures.fetch_add(1, std::memory_order_relaxed);
  std::fill(y, y + n, std::numeric_limits<float>::quiet_NaN());
}

// What the two primitives below share: the plan they run, on the CPU stream only; equal when
// their plans are.
class PlanPrimitive : public mx::UnaryPrimitive {
 public:
  PlanPrimitive(mx::Stream s, std::shared_ptr<const DnnlConvPlan> plan) : mx::UnaryPrimitive(s), plan_(std::move(plan)) {}
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::logic_error(std::string("[") + name() + "] runs on the CPU stream only");
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return typeid(other) == typeid(*this) && static_cast<const PlanPrimitive&>(other).plan_ == plan_;
  }
  const std::shared_ptr<const DnnlConvPlan>& plan_ptr() const { return plan_; }

 protected:
  std::shared_ptr<const DnnlConvPlan> plan_;
};

// A plan primitive with parameters of its own (a struct with ==): equivalent when both are.
template <typename Params>
class PlanPrimitiveWith : public PlanPrimitive {
 public:
  PlanPrimitiveWith(mx::Stream s, std::shared_ptr<const DnnlConvPlan> plan, Params p)
      : PlanPrimitive(s, std::move(plan)), p_(std::move(p)) {}
  bool is_equivalent(const mx::Primitive& other) const override {  // (the base compares the types)
    return PlanPrimitive::is_equivalent(other) && static_cast<const PlanPrimitiveWith&>(other).p_ == p_;
  }

 protected:
  Params p_;
};

// The weight in the convolution's own layout: computed once per program (OpContext::prepared).
class DnnlConvWeights : public PlanPrimitive {
 public:
  using PlanPrimitive::PlanPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& w = inputs[0];
    if (!w.flags().row_contiguous) throw std::runtime_error("[DnnlConvWeights] weight must be row-contiguous");
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [plan = plan_, wp = const_cast<float*>(w.data<float>()), yp = out.data<float>(), n = out.size(),
                  wn = w.nbytes()] {
      const ThreadLimit limit(plan->w_threads());
      if (!plan->w_in.p) {
        std::memcpy(yp, wp, wn);
        return;
      }
      Memory from(plan->w_plain, wp), to(plan->w_md, yp);
      if (!from.m || !to.m || !execute(plan->w_in, {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, to.m}})) fail_output(yp, n);
    });
  }
  const char* name() const override { return "DnnlConvWeights"; }
};

// y = conv(x, w) (+ bias), w as DnnlConvWeights left it; x in ONNX's plain layout, or
// (blocked_in) already in the layout the convolution reads, as a previous convolution left it;
// y in the plain layout, or (blocked_out) left flat in the layout the convolution writes, for
// DnnlUnblock or the next convolution. Skipping a reorder where the neighbours agree: each one
// is a pass over the activations (a fifth to a quarter of the CNNs' oneDNN time).
// One execution of `plan`'s convolution (on the task's thread, under the caller's ThreadLimit):
// x in ONNX's layout (reordered into the plan's first, `reorder_in`) or the plan's, the prepared
// weight, the bias or null, into y in the plan's layout (or ONNX's, `reorder_out`); counted.
// False where oneDNN failed.
static bool run_plan(const DnnlConvPlan& plan, float* xp, float* wp, float* bp, float* yp, bool reorder_in, bool reorder_out) {
  float* s = reorder_in ? thread_buffer(kBlockedSrc, plan.src_bytes) : xp;
  float* d = reorder_out ? thread_buffer(kBlockedDst, plan.dst_bytes) : yp;
  if (!s || !d) return false;
  if (reorder_in) {
    Memory from(plan.src_plain, xp), to(plan.src_md, s);
    if (!from.m || !to.m || !execute(plan.src_in, {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, to.m}})) return false;
  }
  Memory ms(plan.src_md, s), mw(plan.w_md, wp), md(plan.dst_md, d);
  std::unique_ptr<Memory> mb;
  if (bp) mb = std::make_unique<Memory>(plan.bias_md, bp);
  if (!ms.m || !mw.m || !md.m || (mb && !mb->m)) return false;
  const bool ok = mb ? execute(plan.conv, {{DNNL_ARG_SRC, ms.m}, {DNNL_ARG_WEIGHTS, mw.m},
                                           {DNNL_ARG_BIAS, mb->m}, {DNNL_ARG_DST, md.m}})
                     : execute(plan.conv, {{DNNL_ARG_SRC, ms.m}, {DNNL_ARG_WEIGHTS, mw.m}, {DNNL_ARG_DST, md.m}});
  if (!ok) return false;
  if (reorder_out) {
    Memory from(plan.dst_md, d), to(plan.dst_plain, yp);
    if (!from.m || !to.m || !execute(plan.dst_out, {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, to.m}})) return false;
  }
  g_runs.fetch_add(1, std::memory_order_relaxed);
  if (plan.winograd) g_winograd_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

class DnnlConv : public PlanPrimitive {
 public:
  // `add_dst`: the plan's first post-op is Sum, and the last input is the residual, in the
  // layout the convolution writes (cpu_dnnl_conv_add).
  // `over_residual`: nothing reads the residual after this convolution (cpu_dnnl_conv_add).
  DnnlConv(mx::Stream s, std::shared_ptr<const DnnlConvPlan> plan, bool blocked_in, bool blocked_out,
           bool add_dst = false, bool over_residual = false)
      : PlanPrimitive(s, std::move(plan)),
        blocked_in_(blocked_in),
        blocked_out_(blocked_out),
        add_dst_(add_dst),
        over_residual_(over_residual) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (!inputs[1].flags().row_contiguous) throw std::runtime_error("[DnnlConv] the prepared weights must be row-contiguous");
    // The residual's buffer when nothing reads it later (or nothing else holds it).
    if (add_dst_ && over_residual_) begin_output_over_last_read(inputs.back(), out);
    else if (add_dst_) begin_output_over(inputs.back(), out);
    else begin_output(inputs, out, stream());
    auto ptr = [](const mx::array& a) { return const_cast<float*>(a.data<float>()); };
    // x, the bias and the residual may be any view: gathered in the task when not row-contiguous
    std::optional<RowMajorInput> b, r;
    if (inputs.size() > (add_dst_ ? 3u : 2u)) b.emplace(inputs[2]);
    if (add_dst_) r.emplace(inputs.back());
    dispatch_task(stream(), [plan = plan_, x = RowMajorInput(inputs[0]), wp = ptr(inputs[1]), b = std::move(b),
                  r = std::move(r), yp = out.data<float>(), n = out.size(),
                  reorder_in = plan_->src_in.p && !blocked_in_, reorder_out = plan_->dst_out.p && !blocked_out_] {
      float* xp = const_cast<float*>(x.rows());
      float* bp = b ? const_cast<float*>(b->rows()) : nullptr;
      const ThreadLimit limit(plan->threads);
      if (r) {  // the destination starts as the residual (the Sum post-op adds what it holds)
        g_add_runs.fetch_add(1, std::memory_order_relaxed);
        if (r->rows() == yp) g_add_in_place.fetch_add(1, std::memory_order_relaxed);
        else {
          const size_t bytes = n * sizeof(float), pieces = (bytes + kResidualPiece - 1) / kResidualPiece;
          cpu_copy_parallel(yp, r->rows(), bytes, kResidualPiece,
                            static_cast<int>(std::min<size_t>(cpu_threads(), pieces / 4 + 1)));
        }
      }
      if (!run_plan(*plan, xp, wp, bp, yp, reorder_in, reorder_out)) return fail_output(yp, n);
      if (limit.active()) g_one_thread_runs.fetch_add(1, std::memory_order_relaxed);
    });
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const DnnlConv*>(&other);
    return o && PlanPrimitive::is_equivalent(other) && o->blocked_in_ == blocked_in_ &&
           o->blocked_out_ == blocked_out_ && o->add_dst_ == add_dst_ && o->over_residual_ == over_residual_;
  }
  const char* name() const override {
    return add_dst_ ? "DnnlConvAdd" : blocked_out_ ? "DnnlConvBlocked" : "DnnlConv";
  }
  bool blocked_in() const { return blocked_in_; }
  bool blocked_out() const { return blocked_out_; }
  bool adds() const { return add_dst_; }

 private:
  bool blocked_in_, blocked_out_, add_dst_, over_residual_;
};

// A convolution's output from the layout it wrote (DnnlConv with blocked_out) into ONNX's plain
// layout. Only evaluated where something other than a convolution reading that layout uses it.
class DnnlUnblock : public PlanPrimitive {
 public:
  using PlanPrimitive::PlanPrimitive;
  const DnnlConvPlan& plan() const { return *plan_; }

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (!inputs[0].flags().row_contiguous) throw std::runtime_error("[DnnlUnblock] input must be row-contiguous");
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [plan = plan_, xp = const_cast<float*>(inputs[0].data<float>()), yp = out.data<float>(), n = out.size()] {
      // No reorder where the two layouts lie alike (one position a channel: [N, C, 1, 1] after
      // a pooling to one position): the bytes as they are.
      if (!plan->dst_out.p) {
        std::memcpy(yp, xp, n * sizeof(float));
        return;
      }
      const ThreadLimit limit(plan->threads);
      Memory from(plan->dst_md, xp), to(plan->dst_plain, yp);
      if (!from.m || !to.m || !execute(plan->dst_out, {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, to.m}}))
        fail_output(yp, n);
    });
  }
  const char* name() const override { return "DnnlUnblock"; }
};

// Convolutions' blocked outputs of one image layout (nChw8c or nChw16c, channels a multiple of
// the block: no padding) concatenated along the channels in that layout: per image each
// input's block is contiguous ([C / b][H][W][b]), so the concatenation is one copy per input
// and image. The plan is the output's (its layout and the unblocking of it).
// The output is `images` runs, each the inputs' next `sizes` floats in turn: a channel-blocked
// layout's run is an image (its blocks of each input), channels-last's a position of an image
// (its channels of each input).
struct BlockedConcatParams {
  int64_t images;
  std::vector<int64_t> sizes;  // floats of one run of each input
  bool operator==(const BlockedConcatParams&) const = default;
};
class DnnlBlockedConcat : public PlanPrimitiveWith<BlockedConcatParams> {
 public:
  using PlanPrimitiveWith::PlanPrimitiveWith;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    for (const auto& x : inputs)
      if (!x.flags().row_contiguous) throw std::runtime_error("[DnnlBlockedConcat] inputs must be row-contiguous");
    begin_output(inputs, out, stream());
    std::vector<const float*> from;
    for (const auto& x : inputs) from.push_back(x.data<float>());
    dispatch_task(stream(), [from = std::move(from), yp = out.data<float>(), images = p_.images, sizes = p_.sizes] {
      int64_t per_image = 0;
      for (auto n : sizes) per_image += n;
      // The output's floats [f0, f1), copied from whichever inputs hold them: split over the
      // threads for a large concatenation (a single thread's copy takes a squeezenet fire
      // module's 1.5 MB at a fraction of the cores' bandwidth).
      const auto copy_floats = copy_floats_fn();
      auto copy = [&](int64_t f0, int64_t f1) {
        for (int64_t i = f0 / per_image; i < images && i * per_image < f1; ++i) {
          int64_t at = i * per_image;
          for (size_t k = 0; k < from.size(); at += sizes[k], ++k) {
            const int64_t lo = std::max(f0, at), hi = std::min(f1, at + sizes[k]);
            if (lo < hi) copy_floats(yp + lo, from[k] + i * sizes[k] + (lo - at), hi - lo);
          }
        }
      };
      const int64_t total = images * per_image;
      constexpr int64_t kChunk = int64_t{1} << 14;  // floats a work item
      const int64_t chunks = (total + kChunk - 1) / kChunk;
      cpu_parallel_for(chunks, static_cast<int>(std::min<int64_t>(cpu_threads(), chunks / 4 + 1)),
                       [&](int64_t c0, int64_t c1) { copy(c0 * kChunk, std::min(total, c1 * kChunk)); });
    });
  }
  const char* name() const override { return "DnnlBlockedConcat"; }
};

// Convolutions of one image, each writing 16-channel blocks (nChw16c, channels a multiple of 16),
// computed straight into their channel concatenation: in that layout an image's blocks of one
// input are contiguous, so each convolution's output is a run of the concatenation's buffer
// (squeezenet's fire modules, inception's branches) and no copy is left to make. The plan is the
// output's (its unblocking); each convolution's own plan, inputs (x, weight, bias) and where its
// run starts are the parameters.
struct ConvsConcatParams {
  std::vector<std::shared_ptr<const DnnlConvPlan>> plans;
  std::vector<int> inputs;        // each convolution's count of inputs (2, or 3 with a bias)
  std::vector<bool> blocked_in;   // ... whether its x is in its plan's layout already
  std::vector<int64_t> offsets;   // ... the float its run starts at
  bool operator==(const ConvsConcatParams&) const = default;
};
class DnnlConvsConcat : public PlanPrimitiveWith<ConvsConcatParams> {
 public:
  using PlanPrimitiveWith::PlanPrimitiveWith;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    struct One {
      std::shared_ptr<const DnnlConvPlan> plan;
      RowMajorInput x;
      float* w;
      std::optional<RowMajorInput> b;
      bool reorder_in;
      int64_t offset;
    };
    std::vector<One> convs;
    size_t at = 0;
    for (size_t k = 0; k < p_.plans.size(); ++k) {
      const auto& w = inputs[at + 1];
      if (!w.flags().row_contiguous) throw std::runtime_error("[DnnlConvsConcat] the prepared weights must be row-contiguous");
      std::optional<RowMajorInput> b;
      if (p_.inputs[k] == 3) b.emplace(inputs[at + 2]);
      convs.push_back({p_.plans[k], RowMajorInput(inputs[at]), const_cast<float*>(w.data<float>()), std::move(b),
                       p_.plans[k]->src_in.p && !p_.blocked_in[k], p_.offsets[k]});
      at += static_cast<size_t>(p_.inputs[k]);
    }
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [convs = std::move(convs), yp = out.data<float>(), n = out.size()] {
      for (const auto& c : convs) {
        const ThreadLimit limit(c.plan->threads);
        float* bp = c.b ? const_cast<float*>(c.b->rows()) : nullptr;
        if (!run_plan(*c.plan, const_cast<float*>(c.x.rows()), c.w, bp, yp + c.offset, c.reorder_in, false))
          return fail_output(yp, n);
        if (limit.active()) g_one_thread_runs.fetch_add(1, std::memory_order_relaxed);
      }
      g_convs_concats.fetch_add(1, std::memory_order_relaxed);
    });
  }
  const char* name() const override { return "DnnlConvsConcat"; }
};

// A plain NCHW tensor reordered into a layout plan's blocked layout (flat), for a channel
// concatenation whose other inputs are blocked.
class DnnlBlock : public PlanPrimitive {
 public:
  using PlanPrimitive::PlanPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [plan = plan_, x = RowMajorInput(inputs[0]), yp = out.data<float>(), n = out.size()] {
      const ThreadLimit limit(plan->threads);
      Memory from(plan->dst_plain, const_cast<float*>(x.rows())), to(plan->dst_md, yp);
      if (!from.m || !to.m || !execute(plan->src_in, {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, to.m}}))
        fail_output(yp, n);
    });
  }
  const char* name() const override { return "DnnlBlock"; }
};

// Max or average pooling of a channel-blocked buffer ([N][C / b][H][W][b], no channel padding;
// channels-last is b = C) into the same layout ([N][C / b][OH][OW][b]), the same arithmetic as
// cpu_pool_2d's: positions outside the input take no part (an all-outside max window gives -inf)
// and a NaN propagates through a max; an average sums each window row's taps, then the rows, in
// cpu_pool_2d's order, and divides by count_h[oh] * count_w[ow].
struct BlockedPoolParams {
  CpuPool2d g;
  std::array<int64_t, 4> dims;  // planes (N * C / b), H, W, b
  bool avx512 = false;          // in AVX-512 registers (cpu_avx512_kernels())
  bool operator==(const BlockedPoolParams&) const = default;
};
class DnnlBlockedPool : public PlanPrimitiveWith<BlockedPoolParams> {
  // fn(position) for each window position of output (oh, ow) inside the H x W input, position
  // counted in the plane's row-major order.
  template <typename Fn>
  static void for_each_tap(const CpuPool2d& g, int64_t H, int64_t W, int64_t oh, int64_t ow, Fn fn) {
    for (int i = 0; i < g.kernel_h; ++i) {
      const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
      if (ih < 0 || ih >= H) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int64_t iw = ow * g.stride_w - g.pad_left + static_cast<int64_t>(j) * g.dil_w;
        if (iw >= 0 && iw < W) fn(ih * W + iw);
      }
    }
  }
  // acc[c] = max(acc[c], v[c]) for c < n, a NaN in v kept (and one in acc stays).
  template <typename N>
  static void max_into(float* acc, const float* v, N n) {
    for (N c = 0; c < n; ++c) {
      const float m = v[c] > acc[c] ? v[c] : acc[c];
      acc[c] = v[c] != v[c] ? v[c] : m;
    }
  }

  // Planes [p0, p1) of B channels each; the block's lanes in a fixed-size accumulator (vectorized).
  template <int B>
  static void pool(const float* xp, float* yp, const CpuPool2d& g, const std::array<int64_t, 4>& d, int64_t p0,
                   int64_t p1) {
    const int64_t H = d[1], W = d[2], OH = g.out_h, OW = g.out_w;
    for (int64_t p = p0; p < p1; ++p) {
      const float* x = xp + p * H * W * B;
      float* y = yp + p * OH * OW * B;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float acc[B];
          for (int c = 0; c < B; ++c) acc[c] = -std::numeric_limits<float>::infinity();
          for_each_tap(g, H, W, oh, ow, [&](int64_t pos) { max_into(acc, x + pos * B, B); });
          float* o = y + (oh * OW + ow) * B;
          for (int c = 0; c < B; ++c) o[c] = acc[c];
        }
    }
  }

#ifdef ORTMLX_X86
  // One output position's 16 channels from c0 (row `x` of the plane, B floats a position), held
  // in two registers over the window: max(v, acc) keeps acc where either is NaN, then a NaN in v
  // replaces it (so a NaN anywhere in the window propagates, as in the scalar form).
  __attribute__((target("avx2,fma"))) static void pool16_avx2(const float* x, float* y, const CpuPool2d& g, int64_t H,
                                                              int64_t W, int64_t B, int64_t oh, int64_t ow) {
    __m256 a0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), a1 = a0;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
      if (ih < 0 || ih >= H) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int64_t iw = ow * g.stride_w - g.pad_left + static_cast<int64_t>(j) * g.dil_w;
        if (iw < 0 || iw >= W) continue;
        const float* v = x + (ih * W + iw) * B;
        const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        a0 = _mm256_blendv_ps(_mm256_max_ps(v0, a0), v0, _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q));
        a1 = _mm256_blendv_ps(_mm256_max_ps(v1, a1), v1, _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q));
      }
    }
    _mm256_storeu_ps(y, a0);
    _mm256_storeu_ps(y + 8, a1);
  }

  // The max over the window's taps (offsets `off` from x, in floats) of 16 R channels (R = 1 or
  // 4, each register named so that the compiler keeps them all in registers), the taps' NaN lanes
  // gathered in masks and set at the end (a NaN anywhere in the window propagates, as in the
  // scalar form; -inf for a window with no taps inside).
  __attribute__((target("avx512f"))) static inline void take(__m512& acc, __mmask16& nan, const float* v,
                                                            __mmask16 lanes = 0xffff) {
    const __m512 a = _mm512_maskz_loadu_ps(lanes, v);
    acc = _mm512_max_ps(acc, a);
    nan = static_cast<__mmask16>(nan | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q));
  }
  template <int R>
  __attribute__((target("avx512f"))) static void window_max_avx512(const float* x, const int64_t* off, int n,
                                                                   float* y, __mmask16 lanes = 0xffff) {
    static_assert(R == 1 || R == 4);
    const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 a0 = lowest, a1 = lowest, a2 = lowest, a3 = lowest;
    __mmask16 n0 = 0, n1 = 0, n2 = 0, n3 = 0;
    for (int t = 0; t < n; ++t) {
      const float* v = x + off[t];
      take(a0, n0, v, lanes);
      if constexpr (R == 4) {
        take(a1, n1, v + 16);
        take(a2, n2, v + 32);
        take(a3, n3, v + 48);
      }
    }
    const __m512 qnan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
    _mm512_mask_storeu_ps(y, lanes, _mm512_mask_mov_ps(a0, n0, qnan));
    if constexpr (R == 4) {
      _mm512_storeu_ps(y + 16, _mm512_mask_mov_ps(a1, n1, qnan));
      _mm512_storeu_ps(y + 32, _mm512_mask_mov_ps(a2, n2, qnan));
      _mm512_storeu_ps(y + 48, _mm512_mask_mov_ps(a3, n3, qnan));
    }
  }

  // Max pooling of output rows [r0, r1) (any block): a position's window taps found once, then
  // all of its channels, 64 at a time, held in registers over them (the last ones masked). A
  // window inside the plane takes its taps from one table made per call (the offsets from its
  // corner, in for_each_tap's order); only windows over an edge test each tap's bounds.
  // Why: per 16 lanes, each tap's bounds tested again for every chunk of a position's channels,
  // the pooling was bound by those tests rather than by its loads; with 16-channel blocks a
  // position is one chunk, and finding its taps cost more than taking their maximum.
  __attribute__((target("avx512f"))) static void max_rows_avx512(const float* xp, float* yp, const CpuPool2d& g,
                                                                 const std::array<int64_t, 4>& d, int64_t r0,
                                                                 int64_t r1) {
    const int64_t H = d[1], W = d[2], B = d[3], OH = g.out_h, OW = g.out_w;
    const int64_t span_h = static_cast<int64_t>(g.kernel_h - 1) * g.dil_h, span_w = static_cast<int64_t>(g.kernel_w - 1) * g.dil_w;
    int64_t inner[kMaxWindowTaps];
    int taps = 0;
    for (int i = 0; i < g.kernel_h; ++i)
      for (int j = 0; j < g.kernel_w; ++j) inner[taps++] = (static_cast<int64_t>(i) * g.dil_h * W + static_cast<int64_t>(j) * g.dil_w) * B;
    int64_t off[kMaxWindowTaps];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = r / OH, oh = r % OH;
      const float* x = xp + p * H * W * B;
      float* y = yp + (p * OH + oh) * OW * B;
      const int64_t ih0 = oh * g.stride_h - g.pad_top;
      const bool rows_inside = ih0 >= 0 && ih0 + span_h < H;
      for (int64_t ow = 0; ow < OW; ++ow, y += B) {
        const int64_t iw0 = ow * g.stride_w - g.pad_left;
        const float* base = x;
        const int64_t* at = off;
        int n = taps;
        if (rows_inside && iw0 >= 0 && iw0 + span_w < W) {
          base = x + (ih0 * W + iw0) * B;
          at = inner;
        } else {
          n = 0;
          for_each_tap(g, H, W, oh, ow, [&](int64_t pos) { off[n++] = pos * B; });
        }
        int64_t c0 = 0;
        for (; c0 + 64 <= B; c0 += 64) window_max_avx512<4>(base + c0, at, n, y + c0);
        for (; c0 < B; c0 += 16) window_max_avx512<1>(base + c0, at, n, y + c0, first_lanes(B - c0));
      }
    }
  }

  // Average pooling of output rows [r0, r1) (any block), 16 channels a register: each window
  // row's taps summed in order, then the rows, then divided by count_h[oh] * count_w[ow] (the
  // scalar form's arithmetic, so the bits do not depend on the form).
  __attribute__((target("avx512f"))) static void average_rows_avx512(const float* xp, float* yp, const CpuPool2d& g,
                                                                     const std::array<int64_t, 4>& d, int64_t r0,
                                                                     int64_t r1) {
    const int64_t H = d[1], W = d[2], B = d[3], OH = g.out_h, OW = g.out_w;
    int64_t rows[kMaxWindowTaps], cols[kMaxWindowTaps];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = r / OH, oh = r % OH;
      const float* x = xp + p * H * W * B;
      float* y = yp + (p * OH + oh) * OW * B;
      int nr = 0;
      for (int i = 0; i < g.kernel_h; ++i) {
        const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
        if (ih >= 0 && ih < H) rows[nr++] = ih * W * B;
      }
      for (int64_t ow = 0; ow < OW; ++ow, y += B) {
        int nc = 0;
        for (int j = 0; j < g.kernel_w; ++j) {
          const int64_t iw = ow * g.stride_w - g.pad_left + static_cast<int64_t>(j) * g.dil_w;
          if (iw >= 0 && iw < W) cols[nc++] = iw * B;
        }
        const __m512 div = _mm512_set1_ps(g.count_h[static_cast<size_t>(oh)] * g.count_w[static_cast<size_t>(ow)]);
        for (int64_t c0 = 0; c0 < B; c0 += 16) {
          const __mmask16 lanes = first_lanes(B - c0);
          __m512 acc = _mm512_setzero_ps();
          for (int i = 0; i < nr; ++i) {
            __m512 row = _mm512_setzero_ps();
            for (int j = 0; j < nc; ++j) row = _mm512_add_ps(row, _mm512_maskz_loadu_ps(lanes, x + rows[i] + cols[j] + c0));
            acc = _mm512_add_ps(acc, row);
          }
          _mm512_mask_storeu_ps(y + c0, lanes, _mm512_div_ps(acc, div));
        }
      }
    }
  }
#endif

  // The most taps a window may have for the AVX-512 form (their offsets on the stack).
  static constexpr int kMaxWindowTaps = 64;
  static constexpr int64_t kLanes = 16;
  // fn(x, y, oh, ow, n) for output rows [r0, r1) of all planes (so one image still splits over the
  // threads), each position's channels kLanes at a time (any block; channels-last: all C): x the
  // plane's input at the lanes' first channel, y the output there, n the lanes in use.
  template <typename Fn>
  static void for_each_lanes(const float* xp, float* yp, const CpuPool2d& g, const std::array<int64_t, 4>& d,
                             int64_t r0, int64_t r1, Fn fn) {
    const int64_t H = d[1], W = d[2], B = d[3], OH = g.out_h, OW = g.out_w;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = r / OH, oh = r % OH;
      const float* x = xp + p * H * W * B;
      float* y = yp + (p * OH + oh) * OW * B;
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c0 = 0; c0 < B; c0 += kLanes) fn(x + c0, y + ow * B + c0, oh, ow, std::min(kLanes, B - c0));
    }
  }

  static void pool_rows(const float* xp, float* yp, const CpuPool2d& g, const std::array<int64_t, 4>& d, int64_t r0,
                        int64_t r1) {
#ifdef ORTMLX_X86
    const bool avx2 = cpu_has_avx2_fma();
#endif
    const int64_t H = d[1], W = d[2], B = d[3];
    for_each_lanes(xp, yp, g, d, r0, r1, [&](const float* x, float* y, int64_t oh, int64_t ow, int64_t n) {
#ifdef ORTMLX_X86
      if (avx2 && n == kLanes) {
        pool16_avx2(x, y, g, H, W, B, oh, ow);
        return;
      }
#endif
      float acc[kLanes];
      for (int c = 0; c < kLanes; ++c) acc[c] = -std::numeric_limits<float>::infinity();
      for_each_tap(g, H, W, oh, ow, [&](int64_t pos) { max_into(acc, x + pos * B, n); });
      std::copy(acc, acc + n, y);
    });
  }

  // The average: each window row's taps summed, then the rows, as cpu_pool_2d does.
  static void average_rows(const float* xp, float* yp, const CpuPool2d& g, const std::array<int64_t, 4>& d, int64_t r0,
                           int64_t r1) {
    const int64_t H = d[1], W = d[2], B = d[3];
    for_each_lanes(xp, yp, g, d, r0, r1, [&](const float* x, float* y, int64_t oh, int64_t ow, int64_t n) {
      float acc[kLanes] = {};
      for (int i = 0; i < g.kernel_h; ++i) {
        const int64_t ih = oh * g.stride_h - g.pad_top + static_cast<int64_t>(i) * g.dil_h;
        if (ih < 0 || ih >= H) continue;
        float row[kLanes] = {};
        for (int j = 0; j < g.kernel_w; ++j) {
          const int64_t iw = ow * g.stride_w - g.pad_left + static_cast<int64_t>(j) * g.dil_w;
          if (iw < 0 || iw >= W) continue;
          const float* v = x + (ih * W + iw) * B;
          if (n == kLanes)
            for (int64_t c = 0; c < kLanes; ++c) row[c] += v[c];
          else
            for (int64_t c = 0; c < n; ++c) row[c] += v[c];
        }
        for (int64_t c = 0; c < kLanes; ++c) acc[c] += row[c];
      }
      const float div = g.count_h[static_cast<size_t>(oh)] * g.count_w[static_cast<size_t>(ow)];
      for (int64_t c = 0; c < n; ++c) y[c] = acc[c] / div;
    });
  }

 public:
  using PlanPrimitiveWith::PlanPrimitiveWith;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (!inputs[0].flags().row_contiguous) throw std::runtime_error("[DnnlBlockedPool] input must be row-contiguous");
    begin_output(inputs, out, stream());
    dispatch_task(stream(), [xp = inputs[0].data<float>(), yp = out.data<float>(), g = p_.g, d = p_.dims,
                             avx512 = p_.avx512] {
      const int64_t planes = d[0];
#ifdef ORTMLX_X86
      if (avx512 && g.kernel_h * g.kernel_w <= kMaxWindowTaps) {
        const int64_t rows = planes * g.out_h;
        cpu_parallel_for(rows, std::min<int64_t>(cpu_threads(), rows), [&](int64_t r0, int64_t r1) {
          if (g.max)
            max_rows_avx512(xp, yp, g, d, r0, r1);
          else
            average_rows_avx512(xp, yp, g, d, r0, r1);
        });
        return;
      }
#else
      (void)avx512;
#endif
      if (!g.max) {
        const int64_t rows = planes * g.out_h;
        cpu_parallel_for(rows, std::min<int64_t>(cpu_threads(), rows),
                         [&](int64_t r0, int64_t r1) { average_rows(xp, yp, g, d, r0, r1); });
        return;
      }
      if (d[3] != 8 && d[3] != 16) {
        const int64_t rows = planes * g.out_h;
        cpu_parallel_for(rows, std::min<int64_t>(cpu_threads(), rows),
                         [&](int64_t r0, int64_t r1) { pool_rows(xp, yp, g, d, r0, r1); });
        return;
      }
      cpu_parallel_for(planes, std::min<int64_t>(cpu_threads(), planes), [&](int64_t p0, int64_t p1) {
        if (d[3] == 8)
          pool<8>(xp, yp, g, d, p0, p1);
        else
          pool<16>(xp, yp, g, d, p0, p1);
      });
    });
  }
  const char* name() const override { return "DnnlBlockedPool"; }
};

// A plan that only describes a layout: `tag` for `dims` as dst_md, the plain layout, and the
// reorders between them (dst_out, what DnnlUnblock runs; src_in, what DnnlBlock runs). Shared by
// every program of the process.
std::shared_ptr<const DnnlConvPlan> layout_plan(const std::vector<int64_t>& dims, dnnl_format_tag_t tag, int threads) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<DnnlConvPlan>> plans;
  std::ostringstream k;
  for (auto d : dims) k << d << ',';
  k << '/' << static_cast<int>(tag) << '/' << threads;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = plans.find(k.str()); it != plans.end()) return it->second;
  std::shared_ptr<DnnlConvPlan> p;
  try {
    p = std::make_shared<DnnlConvPlan>();
    p->dst_md = plain_md(dims, tag);
    p->dst_plain = plain_md(dims, plain_tag(static_cast<int>(dims.size())));
    p->threads = threads;
    {
      const ThreadLimit limit(threads);
      p->dst_out = make_reorder(p->dst_md, p->dst_plain);
      p->src_in = make_reorder(p->dst_plain, p->dst_md);  // the other way (DnnlBlock)
    }
    p->dst_bytes = lib().memory_desc_get_size(&p->dst_md);
  } catch (const std::exception&) {
    p = nullptr;
  }
  if (plans.size() >= 4096) plans.clear();
  plans.emplace(k.str(), p);
  return p;
}

}  // namespace

uint64_t cpu_dnnl_conv_runs() { return g_runs.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_conv_one_thread_runs() { return g_one_thread_runs.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_conv_failures() { return g_failures.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_conv_gemm_refusals() { return g_gemm_refusals.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_conv_winograd_runs() { return g_winograd_runs.load(std::memory_order_relaxed); }

std::string DnnlConvShape::key() const {
  std::ostringstream k;
  auto put = [&k](const auto& v) {
    for (auto e : v) k << e << ',';
    k << '/';
  };
  put(x), put(w), put(y), put(stride), put(pad_lo), put(pad_hi), put(dilation);
  k << groups << '/' << bias << '/' << transposed << '/' << threads << '/' << blocked16 << winograd << '/';
  for (const auto& op : post_ops) k << op.kind << ':' << std::hexfloat << op.alpha << ':' << op.beta << std::defaultfloat << ';';
  return k.str();
}

std::shared_ptr<const DnnlConvPlan> cpu_dnnl_conv_plan(const DnnlConvShape& g, mx::Stream s) {
  if (s.device != mx::Device::cpu || !cpu_dnnl_available()) return nullptr;
  const size_t nd = g.x.size() < 3 ? 0 : g.x.size() - 2;
  if (nd < 1 || nd > 3 || g.w.size() != g.x.size() || g.y.size() != g.x.size() || g.stride.size() != nd ||
      g.pad_lo.size() != nd || g.pad_hi.size() != nd || g.dilation.size() != nd || g.groups < 1)
    return nullptr;
  for (auto v : g.x) if (v <= 0) return nullptr;
  for (auto v : g.y) if (v <= 0) return nullptr;
  // Plans are shared by every program of the process: a geometry is planned once.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<DnnlConvPlan>> plans;
  const std::string key = g.key();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  std::shared_ptr<DnnlConvPlan> p;
  try {
    p = build_plan(g);
  } catch (const std::exception&) {
    p = nullptr;  // this geometry stays MLX's (remembered, so it is not planned again)
  }
  if (plans.size() >= 4096) plans.clear();  // a stream of new shapes: plans in use stay alive
  plans.emplace(key, p);
  return p;
}

mx::array cpu_dnnl_conv_weights(const std::shared_ptr<const DnnlConvPlan>& plan, const mx::array& w, mx::Stream s) {
  auto wc = mx::contiguous(mx::astype(w, mx::float32, s), false, s);
  const int n = static_cast<int>(plan->w_bytes / sizeof(float));
  return mx::array({n}, mx::float32, std::make_shared<DnnlConvWeights>(s, plan), {wc});
}

namespace {
// The convolution `a` is an unblocking of (DnnlUnblock, not evaluated yet), or null.
const DnnlUnblock* unblocking(const mx::array& a) {
  if (!a.has_primitive() || a.is_available() || a.dtype() != mx::float32) return nullptr;
  return dynamic_cast<const DnnlUnblock*>(&a.primitive());
}
}  // namespace

std::optional<mx::array> cpu_dnnl_blocked_map(const std::vector<mx::array>& xs,
                                              const std::function<mx::array(const std::vector<mx::array>&)>& f,
                                              mx::Stream s) {
  if (xs.empty() || s.device != mx::Device::cpu) return std::nullopt;
  const DnnlUnblock* first = unblocking(xs[0]);
  if (!first) return std::nullopt;
  std::vector<mx::array> blocked;
  for (const auto& x : xs) {
    const DnnlUnblock* u = unblocking(x);
    if (!u || x.shape() != xs[0].shape() || !lib().memory_desc_equal(&u->plan().dst_md, &first->plan().dst_md))
      return std::nullopt;
    blocked.push_back(x.inputs()[0]);
  }
  // One layout, so one buffer size; but a convolution's buffer is flat and a per-channel map's or
  // a concatenation's [N, C / b, H * W, b]: then all flat (views).
  for (const auto& b : blocked)
    if (b.shape() != blocked[0].shape()) {
      for (auto& c : blocked)
        if (c.ndim() != 1) c = mx::reshape(c, {static_cast<int>(c.size())}, s);
      break;
    }
  auto y = f(blocked);
  if (y.dtype() != mx::float32 || y.shape() != blocked[0].shape()) return std::nullopt;
  return mx::array(xs[0].shape(), mx::float32, std::make_shared<DnnlUnblock>(s, first->plan_ptr()), {y});
}

namespace {
std::vector<int64_t> dims_of(const mx::array& x) { return std::vector<int64_t>(x.shape().begin(), x.shape().end()); }

// The layout of `x`, an unblocking `u`: one of the two 4-D channel-blocked image layouts
// (nChw8c, nChw16c), or channels-last (acdb: what oneDNN picks on AVX-512 machines), as one
// block of all the channels; found by comparison (a plan's dst_md is whatever oneDNN picked for
// its convolution), with its channel block; {undef, 0} otherwise.
std::pair<dnnl_format_tag_t, int64_t> channel_blocked(const mx::array& x, const DnnlUnblock& u) {
  if (x.ndim() != 4) return {dnnl_format_tag_undef, 0};
  for (auto [t, b] : {std::pair{dnnl_nChw8c, int64_t{8}}, std::pair{dnnl_nChw16c, int64_t{16}},
                      std::pair{dnnl_acdb, static_cast<int64_t>(x.shape(1))}}) {
    const auto md = plain_md(dims_of(x), t);
    if (lib().memory_desc_equal(&md, &u.plan().dst_md)) return {t, b};
  }
  return {dnnl_format_tag_undef, 0};
}
}  // namespace

namespace {
// A convolution's blocked output `x` (4-D float32 on the CPU device, channels a multiple of its
// layout's block b, so no padding) as its buffer viewed [N, C / b, H * W, b], with its unblocking.
struct BlockedBuffer {
  mx::array view;
  const DnnlUnblock* unblock;
  int block;
};
std::optional<BlockedBuffer> blocked_buffer(const mx::array& x, mx::Stream s) {
  if (s.device != mx::Device::cpu || x.ndim() != 4 || x.dtype() != mx::float32) return std::nullopt;
  const DnnlUnblock* u = unblocking(x);
  if (!u) return std::nullopt;
  const auto [tag, block] = channel_blocked(x, *u);
  const int C = x.shape(1);
  if (!block || C % block) return std::nullopt;
  const int b = static_cast<int>(block);
  const mx::Shape view{x.shape(0), C / b, x.shape(2) * x.shape(3), b};
  const auto& buffer = x.inputs()[0];
  return BlockedBuffer{buffer.shape() == view ? buffer : mx::reshape(buffer, view, s), u, b};
}
}  // namespace

std::optional<mx::array> cpu_dnnl_blocked_channel_map(const mx::array& x, const std::vector<mx::array>& params,
                                                      const std::function<mx::array(const std::vector<mx::array>&)>& f,
                                                      mx::Stream s) {
  auto bb = blocked_buffer(x, s);
  if (!bb) return std::nullopt;
  // Each parameter, [C, 1, 1] or [1, C, 1, 1] (or one value), as [1, C / b, 1, b].
  const int C = x.shape(1), b = bb->block;
  const DnnlUnblock* u = bb->unblock;
  const mx::Shape param{1, C / b, 1, b};
  std::vector<mx::array> args{bb->view};
  for (const auto& p : params) {
    if (p.dtype() != mx::float32) return std::nullopt;
    if (p.size() == 1) {
      args.push_back(p);  // broadcasts as it is
      continue;
    }
    if (p.size() != static_cast<size_t>(C) || p.ndim() > 4) return std::nullopt;
    for (int d = 0; d < static_cast<int>(p.ndim()); ++d)  // the channel is axis 1 of 4 (ndim - 3)
      if (p.shape(d) != (d == static_cast<int>(p.ndim()) - 3 ? C : 1)) return std::nullopt;
    auto laid = mx::reshape(p, param, s);
    // A constant parameter's view is made now, once, not as a primitive of every run.
    if (p.is_available() && !p.is_tracer()) mx::eval(laid);
    args.push_back(laid);
  }
  auto y = f(args);
  if (y.dtype() != mx::float32 || y.shape() != args[0].shape()) return std::nullopt;
  return mx::array(x.shape(), mx::float32, std::make_shared<DnnlUnblock>(s, u->plan_ptr()), {y});
}

std::optional<mx::array> cpu_dnnl_blocked_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps,
                                                bool split, mx::Stream s) {
  auto bb = blocked_buffer(x, s);
  if (!bb || steps.empty()) return std::nullopt;
  const int C = x.shape(1), b = bb->block;
  const DnnlUnblock* u = bb->unblock;
  const mx::array& buffer = x.inputs()[0];
  std::vector<CpuBlockedStep> laid;
  for (const auto& step : steps) {
    if (step.kind == CpuBlockedStep::Kind::Relu) {
      laid.push_back(step);
      continue;
    }
    const mx::array& p = *step.operand;
    if (p.dtype() != mx::float32) return std::nullopt;
    if (step.kind == CpuBlockedStep::Kind::AddBuffer) {  // another blocked output of this layout
      const DnnlUnblock* v = unblocking(p);
      if (!v || p.shape() != x.shape() || !lib().memory_desc_equal(&v->plan().dst_md, &u->plan().dst_md) ||
          p.inputs()[0].size() != buffer.size())
        return std::nullopt;
      laid.push_back({step.kind, p.inputs()[0]});
      continue;
    }
    auto v = cpu_channel_vector(p, C, s);
    if (!v) return std::nullopt;
    laid.push_back({step.kind, *v});
  }
  const int64_t positions = static_cast<int64_t>(x.shape(2)) * x.shape(3);
  auto y = cpu_blocked_steps(buffer, laid, C, b, positions, split, s);
  return mx::array(x.shape(), mx::float32, std::make_shared<DnnlUnblock>(s, u->plan_ptr()), {y});
}

std::optional<mx::array> cpu_dnnl_blocked_global_mean(const mx::array& x, mx::Stream s) {
  auto bb = blocked_buffer(x, s);
  if (!bb) {
    // A classifier's output in 16-channel blocks (cpu_dnnl_blocked16), its last block padded
    // (oneDNN writes zeros there): the means of the padded view, the real channels sliced out.
    const DnnlUnblock* u = unblocking(x);
    if (!u || x.ndim() != 4 || channel_blocked(x, *u).first != dnnl_nChw16c) return std::nullopt;
    const int N = x.shape(0), C = x.shape(1), blocks = (C + 15) / 16, positions = x.shape(2) * x.shape(3);
    const auto& buffer = x.inputs()[0];
    if (buffer.size() != static_cast<size_t>(N) * blocks * positions * 16) return std::nullopt;
    auto means = mx::mean(mx::reshape(buffer, {N, blocks, positions, 16}, s), 2, false, s);  // [N, blocks, 16]
    auto real = mx::slice(mx::reshape(means, {N, blocks * 16}, s), {0, 0}, {N, C}, s);
    return mx::reshape(real, {N, C, 1, 1}, s);
  }
  // The mean over the view's axis 2 is [N, C / b, 1, b]: channel k * b + lane, in order.
  return mx::reshape(mx::mean(bb->view, 2, true, s), {x.shape(0), x.shape(1), 1, 1}, s);
}

std::optional<mx::array> cpu_dnnl_blocked_pool(const mx::array& x, const CpuPool2d& g, mx::Stream s) {
  if (s.device != mx::Device::cpu || x.ndim() != 4 || x.dtype() != mx::float32 || g.out_h <= 0 || g.out_w <= 0 ||
      (!g.max && (g.count_h.size() != static_cast<size_t>(g.out_h) || g.count_w.size() != static_cast<size_t>(g.out_w))))
    return std::nullopt;
  const DnnlUnblock* u = unblocking(x);
  if (!u) return std::nullopt;
  const auto [tag, block] = channel_blocked(x, *u);
  const int64_t C = x.shape(1);
  if (!block || C % block) return std::nullopt;
  std::vector<int64_t> out_dims{x.shape(0), C, g.out_h, g.out_w};
  auto plan = layout_plan(out_dims, tag, u->plan().threads);
  if (!plan || plan->dst_bytes != static_cast<size_t>(x.shape(0) * C * g.out_h * g.out_w) * sizeof(float))
    return std::nullopt;
  const int64_t planes = x.shape(0) * (C / block);
  const mx::Shape view{static_cast<int>(x.shape(0)), static_cast<int>(C / block), g.out_h * g.out_w,
                       static_cast<int>(block)};
  auto pooled = mx::array(view, mx::float32,
                          std::make_shared<DnnlBlockedPool>(
                              s, plan, BlockedPoolParams{g, {planes, x.shape(2), x.shape(3), block}, cpu_avx512_kernels()}),
                          {x.inputs()[0]});
  return mx::array(mx::Shape{x.shape(0), static_cast<int>(C), g.out_h, g.out_w}, mx::float32,
                   std::make_shared<DnnlUnblock>(s, plan), {pooled});
}

std::optional<mx::array> cpu_dnnl_blocked_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s) {
  if (xs.size() < 2 || s.device != mx::Device::cpu || xs[0].ndim() != 4 || (axis != 1 && axis != -3))
    return std::nullopt;
  // The layout: that of the first input that is a convolution's blocked output.
  const DnnlUnblock* first = nullptr;
  std::pair<dnnl_format_tag_t, int64_t> layout{dnnl_format_tag_undef, 0};
  for (const auto& x : xs)
    if (const DnnlUnblock* u = unblocking(x); u && !first) {
      layout = channel_blocked(x, *u);
      if (layout.second) first = u;
    }
  if (!first) return std::nullopt;
  const auto [tag, block_of_first] = layout;
  // Channels-last: an image's inputs interleave position by position (any channel counts).
  const bool last = tag == dnnl_acdb;
  const int64_t block = last ? 1 : block_of_first;
  std::vector<mx::array> blocked;
  std::vector<int64_t> sizes;
  int64_t channels = 0;
  int plain = 0;
  for (const auto& x : xs) {
    if (x.ndim() != 4 || x.dtype() != mx::float32 || x.shape(0) != xs[0].shape(0) || x.shape(2) != xs[0].shape(2) ||
        x.shape(3) != xs[0].shape(3) || x.shape(1) % block)
      return std::nullopt;
    const DnnlUnblock* u = unblocking(x);
    const auto md = plain_md(dims_of(x), tag);
    if (u && lib().memory_desc_equal(&md, &u->plan().dst_md)) {
      blocked.push_back(x.inputs()[0]);
    } else {
      // One input not blocked (densenet's first concatenation of a block: a pooling's output)
      // is reordered into the layout, so the chain of concatenations after it stays blocked.
      auto in_plan = ++plain > 1 ? nullptr : layout_plan(dims_of(x), tag, first->plan().threads);
      if (!in_plan || !in_plan->src_in.p) return std::nullopt;
      blocked.push_back(mx::array({static_cast<int>(x.size())}, mx::float32, std::make_shared<DnnlBlock>(s, in_plan),
                                  {x}));
    }
    sizes.push_back(static_cast<int64_t>(x.shape(1)) * (last ? 1 : x.shape(2) * x.shape(3)));
    channels += x.shape(1);
  }
  auto dims = dims_of(xs[0]);
  dims[1] = channels;
  auto plan = layout_plan(dims, tag, first->plan().threads);
  const int64_t floats = dims[0] * channels * dims[2] * dims[3];
  if (!plan || plan->dst_bytes != static_cast<size_t>(floats) * sizeof(float)) return std::nullopt;
  // Shaped as a per-channel map views it ([N, C / b, H * W, b]; channels-last: b = C): the
  // buffer is the same.
  const int64_t b = last ? channels : block;
  const mx::Shape view{static_cast<int>(dims[0]), static_cast<int>(channels / b), static_cast<int>(dims[2] * dims[3]),
                       static_cast<int>(b)};
  const int64_t positions = last ? dims[2] * dims[3] : 1;
  auto flat = mx::array(view, mx::float32,
                        std::make_shared<DnnlBlockedConcat>(s, plan, BlockedConcatParams{dims[0] * positions, std::move(sizes)}),
                        std::move(blocked));
  mx::Shape shape(dims.begin(), dims.end());
  return mx::array(std::move(shape), mx::float32, std::make_shared<DnnlUnblock>(s, plan), {flat});
}

uint64_t cpu_dnnl_convs_concats() { return g_convs_concats.load(std::memory_order_relaxed); }

std::optional<mx::array> cpu_dnnl_convs_concat(const std::vector<mx::array>& xs, int axis, mx::Stream s) {
  if (xs.size() < 2 || s.device != mx::Device::cpu || xs[0].ndim() != 4 || (axis != 1 && axis != -3) ||
      xs[0].shape(0) != 1)
    return std::nullopt;
  ConvsConcatParams p;
  std::vector<mx::array> inputs;
  std::shared_ptr<const DnnlConvPlan> first;
  int64_t channels = 0, floats = 0;
  for (const auto& x : xs) {
    const DnnlUnblock* u = unblocking(x);
    if (!u || x.shape(0) != 1 || x.shape(2) != xs[0].shape(2) || x.shape(3) != xs[0].shape(3) || x.shape(1) % 16 ||
        channel_blocked(x, *u).first != dnnl_nChw16c)
      return std::nullopt;
    const mx::array& flat = x.inputs()[0];
    const auto* conv = flat.has_primitive() && !flat.is_available() ? dynamic_cast<const DnnlConv*>(&flat.primitive()) : nullptr;
    if (!conv || conv->adds() || !conv->blocked_out() || flat.size() != x.size()) return std::nullopt;
    p.plans.push_back(conv->plan_ptr());
    p.inputs.push_back(static_cast<int>(flat.inputs().size()));
    p.blocked_in.push_back(conv->blocked_in());
    p.offsets.push_back(floats);
    inputs.insert(inputs.end(), flat.inputs().begin(), flat.inputs().end());
    channels += x.shape(1);
    floats += static_cast<int64_t>(x.size());
    if (!first) first = u->plan_ptr();
  }
  std::vector<int64_t> dims{1, channels, xs[0].shape(2), xs[0].shape(3)};
  auto plan = layout_plan(dims, dnnl_nChw16c, first->threads);
  if (!plan || plan->dst_bytes != static_cast<size_t>(floats) * sizeof(float)) return std::nullopt;
  // Shaped as a per-channel map views a blocked buffer ([N, C / b, H * W, b]).
  const mx::Shape view{1, static_cast<int>(channels / 16), static_cast<int>(dims[2] * dims[3]), 16};
  auto flat = mx::array(view, mx::float32, std::make_shared<DnnlConvsConcat>(s, plan, std::move(p)), std::move(inputs));
  return mx::array(mx::Shape{1, static_cast<int>(channels), xs[0].shape(2), xs[0].shape(3)}, mx::float32,
                   std::make_shared<DnnlUnblock>(s, plan), {flat});
}

namespace {
// The convolution's inputs: x as a previous convolution wrote it, where that is the layout this
// one reads (its blocked output: the DnnlUnblock in between is never evaluated unless something
// else reads it), the weight, the bias; `blocked_in` says which x it is.
std::vector<mx::array> conv_inputs(const DnnlConvPlan& plan, const mx::array& x, const mx::array& w_prepared,
                                   const std::optional<mx::array>& bias, mx::Stream s, bool& blocked_in) {
  mx::array src = mx::astype(x, mx::float32, s);
  blocked_in = false;
  if (plan.src_in.p && x.has_primitive() && !x.is_available())
    if (const auto* u = dynamic_cast<const DnnlUnblock*>(&x.primitive());
        u && lib().memory_desc_equal(&u->plan().dst_md, &plan.src_md)) {
      src = x.inputs()[0];
      blocked_in = true;
    }
  std::vector<mx::array> in{src, w_prepared};
  if (bias) in.push_back(mx::astype(*bias, mx::float32, s));
  return in;
}
}  // namespace

mx::array cpu_dnnl_conv(const std::shared_ptr<const DnnlConvPlan>& plan, const DnnlConvShape& g, const mx::array& x,
                        const mx::array& w_prepared, const std::optional<mx::array>& bias, mx::Stream s,
                        bool blocked_out) {
  bool blocked_in = false;
  auto in = conv_inputs(*plan, x, w_prepared, bias, s, blocked_in);
  if (!blocked_out || !plan->dst_out.p)
    return mx::array(g.y, mx::float32, std::make_shared<DnnlConv>(s, plan, blocked_in, false), std::move(in));
  const int n = static_cast<int>(plan->dst_bytes / sizeof(float));
  auto flat = mx::array({n}, mx::float32, std::make_shared<DnnlConv>(s, plan, blocked_in, true), std::move(in));
  return mx::array(g.y, mx::float32, std::make_shared<DnnlUnblock>(s, plan), {flat});
}

uint64_t cpu_dnnl_conv_add_runs() { return g_add_runs.load(std::memory_order_relaxed); }
uint64_t cpu_dnnl_conv_add_in_place() { return g_add_in_place.load(std::memory_order_relaxed); }

std::optional<mx::array> cpu_dnnl_conv_add(const std::shared_ptr<const DnnlConvPlan>& plan, const DnnlConvShape& g,
                                           const mx::array& x, const std::function<mx::array()>& weights,
                                           const std::optional<mx::array>& bias, const mx::array& residual,
                                           bool over_residual, mx::Stream s) {
  if (g.post_ops.empty() || g.post_ops[0].kind != ConvPostOp::Sum || residual.dtype() != mx::float32) return std::nullopt;
  // The residual in the layout the convolution writes: another convolution's blocked output of
  // that layout, or, where that layout is ONNX's own, the residual as it is.
  std::optional<mx::array> r;
  if (!plan->dst_out.p) {
    if (residual.shape() == g.y) r = residual;
  } else if (const DnnlUnblock* u = unblocking(residual);
             u && residual.shape() == g.y && lib().memory_desc_equal(&u->plan().dst_md, &plan->dst_md) &&
             residual.inputs()[0].size() * sizeof(float) == plan->dst_bytes) {
    r = residual.inputs()[0];
  }
  if (!r) return std::nullopt;
  bool blocked_in = false;
  auto in = conv_inputs(*plan, x, weights(), bias, s, blocked_in);
  const bool blocked = plan->dst_out.p != nullptr;
  in.push_back(*r);  // (as it is, of any shape: a view would keep its buffer from being taken over)
  auto conv = std::make_shared<DnnlConv>(s, plan, blocked_in, blocked, /*add_dst=*/true, over_residual);
  if (!blocked) return mx::array(g.y, mx::float32, conv, std::move(in));
  const int n = static_cast<int>(plan->dst_bytes / sizeof(float));
  auto flat = mx::array({n}, mx::float32, conv, std::move(in));
  return mx::array(g.y, mx::float32, std::make_shared<DnnlUnblock>(s, plan), {flat});
}

}  // namespace ortmlx::ops

#else  // no oneDNN headers at build time

#include <stdexcept>

namespace ortmlx::ops {

struct DnnlConvPlan {};

uint64_t cpu_dnnl_conv_runs() { return 0; }
uint64_t cpu_dnnl_conv_one_thread_runs() { return 0; }
uint64_t cpu_dnnl_conv_failures() { return 0; }
uint64_t cpu_dnnl_conv_gemm_refusals() { return 0; }
uint64_t cpu_dnnl_conv_winograd_runs() { return 0; }
std::string DnnlConvShape::key() const { return {}; }
std::shared_ptr<const DnnlConvPlan> cpu_dnnl_conv_plan(const DnnlConvShape&, mx::Stream) { return nullptr; }
mx::array cpu_dnnl_conv_weights(const std::shared_ptr<const DnnlConvPlan>&, const mx::array&, mx::Stream) {
  throw std::logic_error("oneDNN is not in this build");
}
std::optional<mx::array> cpu_dnnl_blocked_map(const std::vector<mx::array>&,
                                              const std::function<mx::array(const std::vector<mx::array>&)>&, mx::Stream) {
  return std::nullopt;
}
std::optional<mx::array> cpu_dnnl_blocked_concat(const std::vector<mx::array>&, int, mx::Stream) { return std::nullopt; }
uint64_t cpu_dnnl_convs_concats() { return 0; }
std::optional<mx::array> cpu_dnnl_convs_concat(const std::vector<mx::array>&, int, mx::Stream) { return std::nullopt; }
std::optional<mx::array> cpu_dnnl_blocked_pool(const mx::array&, const CpuPool2d&, mx::Stream) { return std::nullopt; }
std::optional<mx::array> cpu_dnnl_blocked_global_mean(const mx::array&, mx::Stream) { return std::nullopt; }
std::optional<mx::array> cpu_dnnl_blocked_channel_map(const mx::array&, const std::vector<mx::array>&,
                                                      const std::function<mx::array(const std::vector<mx::array>&)>&,
                                                      mx::Stream) {
  return std::nullopt;
}
std::optional<mx::array> cpu_dnnl_blocked_steps(const mx::array&, const std::vector<CpuBlockedStep>&, bool,
                                                mx::Stream) {
  return std::nullopt;
}
mx::array cpu_dnnl_conv(const std::shared_ptr<const DnnlConvPlan>&, const DnnlConvShape&, const mx::array&,
                        const mx::array&, const std::optional<mx::array>&, mx::Stream, bool) {
  throw std::logic_error("oneDNN is not in this build");
}
uint64_t cpu_dnnl_conv_add_runs() { return 0; }
uint64_t cpu_dnnl_conv_add_in_place() { return 0; }
std::optional<mx::array> cpu_dnnl_conv_add(const std::shared_ptr<const DnnlConvPlan>&, const DnnlConvShape&,
                                           const mx::array&, const std::function<mx::array()>&,
                                           const std::optional<mx::array>&, const mx::array&, bool, mx::Stream) {
  return std::nullopt;
}

}  // namespace ortmlx::ops

#endif
