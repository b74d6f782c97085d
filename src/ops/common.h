// Helpers shared by the op families: dtype sets for support checks and small MLX idioms.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "ops/registry.h"

namespace ortmlx::ops {

// dtype sets (ONNX names) used by support checks
inline constexpr std::initializer_list<DType> kFloat = {DType::Float32, DType::Float16,
                                                        DType::BFloat16, DType::Float64};
inline constexpr std::initializer_list<DType> kSignedInt = {DType::Int8, DType::Int16,
                                                            DType::Int32, DType::Int64};
inline constexpr std::initializer_list<DType> kUnsignedInt = {DType::UInt8, DType::UInt16,
                                                              DType::UInt32, DType::UInt64};

bool in_set(DType t, std::initializer_list<DType> set);
bool is_numeric(DType t);  // float or integer (not bool)

// Declines unless input i's dtype is in one of the sets (Undefined passes: unknown here,
// checked again at run time by MLX).
Support input_dtype_in(const NodeQuery& q, size_t i, std::initializer_list<DType> a,
                       std::initializer_list<DType> b = {}, std::initializer_list<DType> c = {},
                       std::initializer_list<DType> d = {});
Support float_input(const NodeQuery& q, size_t i = 0);    // kFloat
Support numeric_input(const NodeQuery& q, size_t i = 0);  // kFloat + ints
// Declines when input i is absent or not a constant initializer.
Support constant_input(const NodeQuery& q, size_t i, const char* what);
// Declines a 0/1 flag attribute (keepdims, ceil_mode, training_mode, ...) present with another
// value: ONNX defines only 0 and 1, and ORT's CPU kernels read such flags as `== 1` where a
// `!= 0` reading would give another result (shape) for e.g. keepdims=-3.
Support flag_attr_0_or_1(const NodeQuery& q, const char* name);

// MLX idioms
mx::array cast_to(const mx::array& a, DType t, mx::StreamOrDevice s);
// Computes in float32 when the input is fp16/bf16 on the CPU backend, where MLX's half
// precision kernels are reference loops (setup.md measured 20-100x slower matmuls).
bool compute_half_in_f32(const mx::array& a, mx::Stream s);
mx::array scalar_like(double v, const mx::array& like);
// Concatenation along `axis` that leaves out the inputs empty along it while another input is
// not empty (the result is the same). Why: on MLX's CUDA backend a fused graph that touches a
// zero-size array runs on the CPU stream (engine/program.cc, touches_empty), and an LLM's first
// prompt appends its keys/values to an empty past: the whole prompt ran on the CPU (0.44B fp16
// Llama on the H200: ~27 s for 128 tokens). On the CPU stream through cpu_concat where it applies.
mx::array concat_nonempty(std::vector<mx::array> xs, int axis, mx::Stream s);
// Whether `a` is known to hold only zeros without evaluating anything: it is evaluated (a value
// folded on the host: engine/host_fold/host_fold.h) and zero, or it is built by value-preserving ops (views,
// broadcasts, casts, concatenations, zero padding) from such arrays. A lazy array whose values
// need arithmetic, a compile trace's placeholder, and data of more than kKnownZeroMaxElements
// elements answer false. For an additive attention bias: a decoder's all-zero bias (no padding,
// one query row) is dropped, so MLX's fused attention runs without a mask array (on its CUDA
// backend sdpa_vector takes none; with one MLX falls back to ~10 unfused ops a layer).
bool known_all_zero(const mx::array& a);
std::vector<int> to_axes(const std::vector<int64_t>& axes, int rank);
// `a` (rank >= 1, last axis K) as the 2-D [rows, K] array of the same row-major data: the array
// it was reshaped from, where unevaluated reshapes (Reshape, Flatten, Unflatten, ExpandDims,
// Squeeze) lead back to one of that shape (rows_source; nullopt if none, or with the option
// flat_products off), else a reshape of it (as_rows). Why: a view is an array MLX's evaluation
// walks and dispatches from the host like a kernel, and MLX wraps a product of a batch of rows by
// a matrix in Flatten/Unflatten views. Consumers that read rows take them flat and shape their
// results back last (rows_to), so the views between two such consumers are never evaluated.
std::optional<mx::array> rows_source(const mx::array& a);
mx::array as_rows(const mx::array& a, mx::Stream s);
// The inputs' flat rows when all have one shape of rank > 2 and their rows at hand (rows_source):
// an elementwise op over those, its result shaped back (rows_to), keeps a chain of row consumers
// (a product, its activation, the next product) free of views. std::nullopt otherwise.
std::optional<std::vector<mx::array>> same_rows(std::initializer_list<mx::array> xs);
// `y` ([rows, N]) reshaped to `like`'s leading dimensions and N (y itself when that is its shape).
mx::array rows_to(const mx::array& y, const mx::array& like, mx::Stream s);

// `steps` on x, a convolution's blocked output (kernels.h, cpu_dnnl_blocked_steps: one kernel a
// chain), split over the threads when the work is worth it; std::nullopt where they do not apply.
struct CpuBlockedStep;
std::optional<mx::array> blocked_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, mx::Stream s);
// The same over a large NCHW float32 activation (kernels.h, cpu_channel_steps), or, with
// `continuing`, only where x is such a chain's output (a Relu after it).
std::optional<mx::array> channel_steps(const mx::array& x, const std::vector<CpuBlockedStep>& steps, mx::Stream s,
                                       bool continuing = false);


// exp / logsumexp / softmax that stay accurate for float64: MLX's CPU exp evaluates float64 with
// a float32-accurate approximation (relative error ~3e-7, also inside logsumexp, softmax,
// sigmoid and logaddexp). For float64 these go through pow(e, x) (std::pow); other dtypes use
// MLX's kernels unchanged.
mx::array exp_precise(const mx::array& x, mx::Stream s);
mx::array logsumexp_precise(const mx::array& x, const std::vector<int>& axes, bool keepdims,
                            mx::Stream s);
mx::array softmax_precise(const mx::array& x, int axis, mx::Stream s);
mx::array sigmoid_precise(const mx::array& x, mx::Stream s);
mx::array tanh_precise(const mx::array& x, mx::Stream s);

// erf and the erf-based GELU 0.5 x (1 + erf(x / sqrt 2)) in x's dtype: float32 on a CPU stream
// through the EP's vectorized kernels (cpu_unary), otherwise MLX's ops. exp_precise,
// sigmoid_precise and tanh_precise above take those kernels the same way.
mx::array erf_of(const mx::array& x, mx::Stream s);
mx::array gelu_erf(const mx::array& x, mx::Stream s);

}  // namespace ortmlx::ops
