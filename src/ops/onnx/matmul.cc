// MatMul, Gemm, MatMulInteger and QLinearMatMul.
//
// MLX's matmul takes floating types only. Floats go straight to it (fp16/bf16 through float32 on
// the CPU backend, whose half-precision matmul is a reference loop). Integer products must be
// exact, so they run in a float type whose mantissa holds every partial sum (`exact_matmul`):
// float64 on the CPU (53 bits), float32 elsewhere (24 bits; MLX has no float64 on GPUs, and TF32
// tensor cores still represent 8-bit operands exactly). Wide integers (int32/int64 MatMul) are
// split into limbs small enough for that, and recombined modulo 2^width, which is what ORT's
// wrap-around integer accumulation gives.
#include <algorithm>
#include <cmath>

#include "graph/fuse_attention.h"
#include "graph/fuse_matmul_bias.h"
#include "kernels/cpu/kernels.h"
#include "ops/common.h"
#include "ops/int_matmul.h"
#include "ops/switches.h"

namespace ortmlx::ops {

namespace {

// Gemm's one row takes the packed kernel for weights of at most this many elements (4 MiB).
constexpr int64_t kPackedOneRowMaxWeights = int64_t{1} << 20;

// ---- numpy matmul shape rules --------------------------------------------------------------

// numpy treats a 1-D left operand as a row [1, K] and a 1-D right operand as a column [K, 1],
// then drops the added axis. The helpers below work on the promoted (rank >= 2) operands.
struct Promoted {
  mx::array a, b;
  bool row = false, col = false;
};

Promoted promote(mx::array a, mx::array b, mx::Stream s) {
  if (a.ndim() == 0 || b.ndim() == 0) throw TranslateError("[MatMul] operands must not be scalars");
  bool row = a.ndim() == 1, col = b.ndim() == 1;
  if (row) a = mx::expand_dims(a, 0, s);
  if (col) b = mx::expand_dims(b, 1, s);
  return {a, b, row, col};
}

mx::array unpromote(mx::array y, const Promoted& p, mx::Stream s) {
  if (p.col) y = mx::squeeze(y, -1, s);
  if (p.row) y = mx::squeeze(y, p.col ? -1 : -2, s);
  return y;
}

// Several float32 rows times a matrix (or, batched, each batch element's) on MLX's CPU device
// through oneDNN's sgemm (kernels/cpu/dnnl_matmul.cc); std::nullopt when that path is off,
// unavailable or the product too small: under cpu_dnnl_min_flops, waking oneDNN's threads costs
// more than it saves.
std::optional<mx::array> product_through_library(const mx::array& a, const mx::array& b, mx::Stream s) {
  if (s.device != mx::Device::cpu || !translation_switches().cpu_matmul_library || b.ndim() < 2 ||
      a.ndim() < 2 || a.dtype() != mx::float32 || b.dtype() != mx::float32)
    return std::nullopt;
  auto batch_of = [](const mx::array& x) {
    double n = 1;
    for (int d = 0; d + 2 < static_cast<int>(x.ndim()); ++d) n *= x.shape(d);
    return n;
  };
  // 2 x batch x M x K x N (the batch as broadcast; a's rows taken flat by a 2-D b)
  const double flops = 2.0 * std::max(batch_of(a), batch_of(b)) * a.shape(-2) * a.shape(-1) * b.shape(-1);
  if (flops < static_cast<double>(translation_switches().cpu_conv_library_min_flops)) return std::nullopt;
  return cpu_dnnl_matmul(a, b, s);
}

mx::array float_matmul(const mx::array& a, const mx::array& b, mx::Stream s) {
  if (b.ndim() == 2)  // one row times a weight matrix (a decode step): BLAS gemv on the CPU
    if (auto y = cpu_row_gemv(a, b, s)) return *y;
  if (compute_half_in_f32(a, s)) {
    auto a32 = mx::astype(a, mx::float32, s), b32 = mx::astype(b, mx::float32, s);
    auto y = product_through_library(a32, b32, s);
    return mx::astype(y ? *y : mx::matmul(a32, b32, s), a.dtype(), s);
  }
  if (auto y = product_through_library(a, b, s)) return *y;
  return mx::matmul(a, b, s);
}

// ---- exact integer matmul ------------------------------------------------------------------

// The float type used for exact integer products on this stream, and its mantissa bits.
mx::Dtype exact_float(mx::Stream s) { return s.device == mx::Device::cpu ? mx::float64 : mx::float32; }
int mantissa_bits(mx::Dtype t) { return t == mx::float64 ? 53 : 24; }

}  // namespace

namespace {

// b (the node's constant input 1, or a view of it such as Gemm's transposed B) laid out as the
// packed kernel's panels once for the program (OpContext::prepared): every run's product reads
// them. std::nullopt in a compile trace no earlier run prepared for (its constants are
// placeholders), or where the kernel declines.
std::optional<mx::array> prepared_panels(const OpContext& c, const mx::array& b) {
  // (keyed by the tiles' width: the kernels' AVX-512 forms are a program's option)
  auto panels = c.prepared(cpu_avx512_kernels() ? "packed_panels/avx512" : "packed_panels/avx2", {1}, [&] {
    if (!c.in(1).is_available()) return mx::array(0.0f);  // a scalar: none
    mx::array w = b;
    w.eval();
    auto p = cpu_packed_panels(w);
    return p ? *p : mx::array(0.0f);
  });
  if (panels.ndim() != 1) return std::nullopt;
  return panels;
}

}  // namespace

// Declared in ops/int_matmul.h (also used by MatMulNBits' prompts): several float32 rows by a
// constant matrix on the CPU as the EP's packed-panel kernel, split over the threads from
// cpu_dnnl_parallel_min_flops.
std::optional<mx::array> packed_product(const mx::array& a, const mx::array& b, mx::Stream s,
                                        const std::optional<mx::array>& bias, bool gelu, const OpContext* weight_of) {
  const auto& sw = translation_switches();
  if (!sw.cpu_packed_matmul || b.ndim() != 2 || a.ndim() < 2) return std::nullopt;
  const double flops = 2.0 * static_cast<double>(a.size()) * b.shape(1);
  // The kernel applies the GELU where cpu_unary would compute it (the same bits); under its
  // size, MLX's ops after the product, as gelu_erf computes it there.
  const size_t outputs = a.size() / std::max(a.shape(-1), 1) * static_cast<size_t>(b.shape(1));
  const bool in_kernel = gelu && outputs >= kCpuUnaryMinElements;
  auto product = [&](const std::optional<mx::array>& panels) {
    return cpu_packed_matmul(a, b, parallel_work(flops),
                             {sw.cpu_packed_blocks, sw.cpu_packed_rows, sw.cpu_packed_stream, sw.cpu_packed_ahead,
                              sw.cpu_packed_depth}, s,
                             bias, in_kernel ? std::optional<CpuUnary>(CpuUnary::Gelu) : std::nullopt, panels);
  };
  auto y = product(std::nullopt);
  // Once the kernel takes the product: with the program's panels of b.
  if (y && weight_of && sw.cpu_packed_prepared)
    if (auto panels = prepared_panels(*weight_of, b)) y = product(panels);
  if (y && gelu && !in_kernel) y = gelu_erf(*y, s);
  return y;
}

// Declared in ops/int_matmul.h (also used by ConvInteger/QLinearConv).
// a @ b (rank >= 2, numpy batch broadcasting) for integer-valued arrays with |a|, |b| < 2^bits,
// returned exactly as int64. Every product is below 2^(2 bits); K is cut into chunks whose sums
// stay below 2^mantissa, each chunk is one float matmul (exact), and the chunks are added in
// int64.
mx::array exact_matmul(mx::array a, mx::array b, int bits, mx::Stream s) {
  const auto ft = exact_float(s);
  a = mx::astype(a, ft, s);
  b = mx::astype(b, ft, s);
  const int64_t chunk = int64_t{1} << (mantissa_bits(ft) - 2 * bits);
  const int64_t k = a.shape(-1);
  if (k <= chunk) return mx::astype(mx::matmul(a, b, s), mx::int64, s);

  const int c = static_cast<int>(chunk);
  const int n = static_cast<int>((k + chunk - 1) / chunk);
  const int pad = n * c - static_cast<int>(k);
  if (pad) {
    std::vector<std::pair<int, int>> pa(a.ndim(), {0, 0}), pb(b.ndim(), {0, 0});
    pa.back().second = pad;
    pb[b.ndim() - 2].second = pad;
    a = mx::pad(a, pa, mx::array(0, ft), "constant", s);
    b = mx::pad(b, pb, mx::array(0, ft), "constant", s);
  }
  // a [..., M, n*c] -> [..., n, M, c];  b [..., n*c, N] -> [..., n, c, N]
  auto sa = a.shape();
  sa.back() = n;
  sa.push_back(c);
  a = mx::swapaxes(mx::reshape(a, sa, s), -3, -2, s);
  auto sb = b.shape();
  sb[sb.size() - 2] = c;
  sb.insert(sb.end() - 2, n);
  b = mx::reshape(b, sb, s);
  return mx::sum(mx::astype(mx::matmul(a, b, s), mx::int64, s), -3, false, s);
}

namespace {

mx::Dtype unsigned_of(mx::Dtype t) {
  switch (t.size()) {
    case 1: return mx::uint8;
    case 2: return mx::uint16;
    case 4: return mx::uint32;
    default: return mx::uint64;
  }
}

// a @ b for integer arrays of one dtype, modulo 2^width (C++ wrap-around, as ORT's Eigen
// kernels give). Operands are viewed as unsigned and split into `lb`-bit limbs; only limb pairs
// that land below bit `width` matter: a*b = sum_{i+j < width/lb} a_i*b_j << lb*(i+j) mod 2^width.
mx::array integer_matmul(const mx::array& a, const mx::array& b, mx::Stream s) {
  const int width = static_cast<int>(a.itemsize()) * 8;
  // Limb products (< 2^(2 lb)) must leave room in the mantissa for long sums.
  const int lb = std::min(width, exact_float(s) == mx::float64 ? 16 : 8);
  const int limbs = width / lb;
  const auto ut = unsigned_of(a.dtype());
  auto ua = mx::view(a, ut, s), ub = mx::view(b, ut, s);
  auto limb = [&](const mx::array& u, int i) {
    auto x = i ? mx::right_shift(u, mx::array(i * lb, ut), s) : u;
    return limbs > 1 ? mx::bitwise_and(x, mx::array((uint64_t{1} << lb) - 1, ut), s) : x;
  };
  std::vector<mx::array> al, bl;
  for (int i = 0; i < limbs; ++i) {
    al.push_back(limb(ua, i));
    bl.push_back(limb(ub, i));
  }
  std::optional<mx::array> acc;
  for (int i = 0; i < limbs; ++i)
    for (int j = 0; i + j < limbs; ++j) {
      // exact_matmul's operands must be below 2^bits in magnitude: limbs are in [0, 2^lb).
      auto p = mx::astype(exact_matmul(al[i], bl[j], lb, s), mx::uint64, s);
      if (i + j) p = mx::left_shift(p, mx::array(uint64_t((i + j) * lb), mx::uint64), s);
      acc = acc ? mx::add(*acc, p, s) : p;
    }
  return mx::astype(*acc, a.dtype(), s);  // truncation = reduction mod 2^width
}

bool is_int(const mx::array& a) { return mx::issubdtype(a.dtype(), mx::integer); }

// ---- MatMul --------------------------------------------------------------------------------

Support check_matmul(const NodeQuery& q) {
  for (size_t i = 0; i < 2; ++i) {
    if (auto r = input_dtype_in(q, i, kFloat, {DType::Int32, DType::Int64, DType::UInt32,
                                               DType::UInt64});
        !r)
      return r;
    if (q.input_rank(i) == 0) return Support::no("MatMul operands must have rank >= 1");
  }
  return Support::yes();
}

// On MLX's CPU backend half-precision products run in float32 (compute_half_in_f32). A
// constant weight's float32 copy is made once per program, not at every run: converting every
// weight matrix of a decode step allocated and filled ~2.5 GB a step for a 0.44B fp16 Llama.
// The trade is memory: the float32 copy lives beside the half one while the session does.
static std::optional<mx::array> f32_constant(OpContext& c, size_t i) {
  if (!compute_half_in_f32(c.in(i), c.s) || !c.is_constant(i)) return std::nullopt;
  return c.prepared("f32", {i}, [&] { return mx::astype(c.in(i), mx::float32, c.s); });
}

// An attention fused into the node (graph/fuse_attention.h): inputs Q, K^T, V and the bias.
// The EP's CPU kernel where it fits, else the same ops the nodes were.
static Outputs translate_fused_attention(OpContext& c) {
  const auto* a = c.node.attr(graph::kMatMulAttention);
  if (!a || a->floats.size() < 2 || !c.has(2)) c.fail("fused attention's attribute or V missing");
  const bool divide = a->floats[0] != 0.f;
  const float scale = a->floats[1];
  const bool heads_inner = a->floats.size() > 2 && a->floats[2] != 0.f;  // a Transpose 0, 2, 1, 3 fused
  std::optional<mx::array> bias;
  if (c.has(3)) bias = c.in(3);
  const mx::array &q = c.in(0), &kt = c.in(1), &v = c.in(2);
  if (auto y = cpu_attention(q, kt, v, scale, divide, bias, c.s, false, heads_inner)) return {*y};
  auto scores = mx::matmul(q, kt, c.s);
  if (divide || scale != 1.f) {
    const mx::array k(scale, scores.dtype());
    scores = divide ? mx::divide(scores, k, c.s) : mx::multiply(scores, k, c.s);
  }
  if (bias) scores = mx::add(scores, *bias, c.s);
  const bool up = compute_half_in_f32(scores, c.s);
  mx::array x = up ? mx::astype(scores, mx::float32, c.s) : scores;
  mx::array p = softmax_precise(x, static_cast<int>(x.ndim()) - 1, c.s);
  if (up) p = mx::astype(p, scores.dtype(), c.s);
  auto y = mx::matmul(p, v, c.s);
  if (heads_inner) y = mx::transpose(y, {0, 2, 1, 3}, c.s);
  return {y};
}

Outputs translate_matmul(OpContext& c) {
  if (c.node.has_attr(graph::kMatMulAttention)) return translate_fused_attention(c);
  mx::array a = c.in(0), b = c.in(1);
  // A bias Add fused into the node (graph/fuse_matmul_bias.h): the kernel starts from it, any
  // other product adds it after, as the Add did.
  std::optional<mx::array> bias;
  if (c.node.has_attr(graph::kMatMulBias)) {
    if (!c.has(2)) c.fail("fused bias missing");
    bias = c.in(2);
  }
  // A Gelu fused into the node (graph/fuse_matmul_bias.h): the packed kernel applies it (see
  // packed_product), any other product gets it after its bias, as the Gelu did.
  const bool gelu = c.node.has_attr(graph::kMatMulGelu);
  auto bias_and_gelu = [&](const mx::array& y) {
    auto z = bias ? mx::add(y, *bias, c.s) : y;
    return gelu ? gelu_erf(z, c.s) : z;
  };
  const auto dt = a.dtype();
  // The EP's CPU kernel takes the batch of rows as it is (no views around it: each primitive,
  // a view too, costs MLX's stream thread a task).
  if (a.dtype() == mx::float32 && c.is_constant(1) && (!bias || bias->dtype() == mx::float32))
    if (auto y = packed_product(a, b, c.s, bias, gelu, &c)) return {*y};
  // A batch of rows by a matrix: the product of the rows taken flat (as_rows), its result
  // reshaped back last, so that a consumer reading rows flat looks through that view too. MLX's
  // matmul would flatten the batch itself; the CPU row kernel takes a batch of one row as it is,
  // so there only a flat source already at hand pays.
  const mx::array batched = a;
  std::optional<mx::array> rows;
  if (!is_int(a) && a.ndim() > 2 && b.ndim() == 2 && translation_switches().flat_products)
    rows = c.s.device == mx::Device::cpu && a.size() == static_cast<size_t>(a.shape(-1)) ? rows_source(a)
                                                                                          : as_rows(a, c.s);
  const bool flat = rows.has_value();
  if (flat) a = *rows;
  const auto b32 = is_int(a) ? std::nullopt : f32_constant(c, 1);
  if (b32) {  // the same arithmetic as float_matmul's, with the conversion of B hoisted
    a = mx::astype(a, mx::float32, c.s);
    b = *b32;
  }
  auto p = promote(a, b, c.s);
  auto y = is_int(p.a) ? integer_matmul(p.a, p.b, c.s) : float_matmul(p.a, p.b, c.s);
  y = unpromote(y, p, c.s);
  if (b32) y = mx::astype(y, dt, c.s);
  return {bias_and_gelu(flat ? rows_to(y, batched, c.s) : y)};
}

// ---- Gemm ----------------------------------------------------------------------------------

bool integral(double v, double limit) { return std::nearbyint(v) == v && std::fabs(v) < limit; }

Support check_gemm(const NodeQuery& q) {
  if (auto r = input_dtype_in(q, 0, kFloat, {DType::Int32, DType::Int64, DType::UInt32,
                                             DType::UInt64});
      !r)
    return r;
  for (size_t i = 0; i < 2; ++i)
    if (int r = q.input_rank(i); r >= 0 && r != 2) return Support::no("Gemm needs 2-D A and B");
  if (graph::is_integer(q.input_dtype(0))) {
    // ONNX gives float alpha/beta no meaning on integers beyond plain scaling; accept the
    // unambiguous case (whole numbers, applied in wrap-around integer arithmetic).
    double alpha = q.node.attr_float("alpha", 1.f), beta = q.node.attr_float("beta", 1.f);
    if (!integral(alpha, 2147483648.0) || !integral(beta, 2147483648.0))
      return Support::no("integer Gemm with non-integral alpha/beta");
  }
  return Support::yes();
}

Outputs translate_gemm(OpContext& c) {
  auto a = c.in(0), b = c.in(1);
  const auto b32 = is_int(a) || !compute_half_in_f32(a, c.s) ? std::nullopt : f32_constant(c, 1);
  if (b32) b = *b32;  // converted below with A (the float32 product of compute_half_in_f32)
  if (a.ndim() != 2 || b.ndim() != 2) c.fail("A and B must be 2-D");
  if (c.node.attr_int("transA", 0)) a = mx::transpose(a, c.s);
  if (c.node.attr_int("transB", 0)) b = mx::transpose(b, c.s);
  const float alpha = c.node.attr_float("alpha", 1.f), beta = c.node.attr_float("beta", 1.f);
  // beta == 0 ignores C entirely (ORT does the same: no 0 * inf = NaN from C).
  std::optional<mx::array> cc;
  if (c.has(2) && beta != 0.f) cc = c.in(2);
  // Opsets < 7 have a `broadcast` attribute; with broadcast=0 a valid C already has shape
  // [M, N], so unidirectional broadcasting covers both settings.

  if (is_int(a)) {
    auto y = integer_matmul(a, b, c.s);
    const auto dt = a.dtype();
    if (alpha != 1.f) y = mx::multiply(y, mx::astype(mx::array(int64_t(alpha)), dt, c.s), c.s);
    if (cc) {
      auto bc = mx::astype(*cc, dt, c.s);
      if (beta != 1.f) bc = mx::multiply(bc, mx::astype(mx::array(int64_t(beta)), dt, c.s), c.s);
      y = mx::add(y, bc, c.s);
    }
    return {y};
  }

  const auto dt = a.dtype();
  const bool f32 = compute_half_in_f32(a, c.s);
  if (f32) {
    a = mx::astype(a, mx::float32, c.s);
    b = mx::astype(b, mx::float32, c.s);
  }
  // A C of [N] with alpha and beta 1 (ORT's MatMul+Add fusion writes a bias so) can be the
  // packed kernel's start.
  const bool bias_first = cc && alpha == 1.f && beta == 1.f && cc->ndim() == 1 && cc->dtype() == mx::float32;
  // A Gelu fused into the node (graph/fuse_matmul_bias.h): given to the packed kernel where
  // nothing comes after its sums (see packed_product), else applied last, as the Gelu did.
  const bool gelu = c.node.has_attr(graph::kMatMulGelu);
  bool gelu_done = false;
  mx::array y = [&] {
    // One row by a small constant matrix (a wake-word head's layers, a small CNN's classifier):
    // the packed kernel with the bias, one primitive on the EP's threads where BLAS's gemv, with
    // its own worker beside them, and the Add were two. Larger ones keep gemv: the kernel's copy
    // of the weight would double their memory.
    if (a.shape(0) == 1 && bias_first && c.is_constant(1) && !b32 && !f32 &&
        static_cast<int64_t>(b.size()) <= kPackedOneRowMaxWeights)
      if (auto m = packed_product(a, b, c.s, cc, gelu, &c)) {
        gelu_done = gelu;
        return *m;
      }
    if (auto row = cpu_row_gemv(a, b, c.s)) {  // M == 1 on the CPU: gemv, then alpha and C
      auto m = alpha == 1.f ? *row : mx::multiply(*row, mx::array(alpha, row->dtype()), c.s);
      if (!cc) return m;
      auto bias = mx::astype(*cc, m.dtype(), c.s);
      return mx::add(m, beta == 1.f ? bias : mx::multiply(bias, mx::array(beta, m.dtype()), c.s), c.s);
    }
    // Several rows: the EP's kernel (a C of [N] with alpha and beta 1 its start) or oneDNN.
    // (b32, f32: a half-precision B converted per program, no graph constant whose buffer the
    // kernel's cached layout may be tied to)
    const bool sums_final = bias_first || (!cc && alpha == 1.f);  // nothing after the kernel's sums
    auto m = c.is_constant(1) && !b32 && !f32
                 ? packed_product(a, b, c.s, bias_first ? cc : std::nullopt, sums_final && gelu, &c)
                 : std::nullopt;
    if (m && sums_final) {
      gelu_done = gelu;
      return *m;
    }
    if (!m) m = product_through_library(a, b, c.s);
    if (m) {  // then alpha and C
      if (alpha != 1.f) m = mx::multiply(*m, mx::array(alpha, m->dtype()), c.s);
      if (!cc) return *m;
      auto bias = mx::astype(*cc, m->dtype(), c.s);
      return mx::add(*m, beta == 1.f ? bias : mx::multiply(bias, mx::array(beta, m->dtype()), c.s), c.s);
    }
    if (!cc) {
      auto m = mx::matmul(a, b, c.s);
      return alpha == 1.f ? m : mx::multiply(m, mx::array(alpha, m.dtype()), c.s);
    }
    auto bias = mx::astype(*cc, a.dtype(), c.s);
    // addmm wants C broadcast to the output; BLAS then folds beta*C into the product.
    bias = mx::broadcast_to(bias, {a.shape(0), b.shape(1)}, c.s);
    return mx::addmm(bias, a, b, alpha, beta, c.s);
  }();
  if (f32) y = mx::astype(y, dt, c.s);
  return {gelu && !gelu_done ? gelu_erf(y, c.s) : y};
}

// ---- MatMulInteger / QLinearMatMul ---------------------------------------------------------

// Zero points / scales of A are scalar or per row: 1-D [M] or N-D [..., M, 1]. Returns a shape
// that broadcasts against A (before 1-D promotion).
mx::array per_row(const mx::array& v, const mx::array& a, mx::Stream s) {
  if (v.size() == 1) return mx::reshape(v, {}, s);
  if (v.ndim() == 1 && a.ndim() >= 2) return mx::expand_dims(v, -1, s);
  return v;
}
// ... of B: scalar or per column: 1-D [N] or N-D [..., 1, N] (both broadcast as they are).
mx::array per_col(const mx::array& v, mx::Stream s) {
  return v.size() == 1 ? mx::reshape(v, {}, s) : v;
}

// (x - zero_point) in int32: both 8-bit, so the difference lies in [-255, 255].
mx::array centered(const mx::array& x, const std::optional<mx::array>& zp, mx::Stream s) {
  auto xi = mx::astype(x, mx::int32, s);
  return zp ? mx::subtract(xi, mx::astype(*zp, mx::int32, s), s) : xi;
}

// The int32 accumulator of (a - za) @ (b - zb) on the promoted operands: exact, wrapping only
// in 32 bits as the ONNX spec allows.
mx::array int8_accumulate(const Promoted& p, mx::Stream s) {
  return mx::astype(exact_matmul(p.a, p.b, 8, s), mx::int32, s);
}

Support check_8bit(const NodeQuery& q, std::initializer_list<size_t> idx) {
  for (auto i : idx)
    if (auto r = input_dtype_in(q, i, {DType::Int8, DType::UInt8}); !r) return r;
  return Support::yes();
}

Support check_matmul_integer(const NodeQuery& q) {
  for (size_t i = 0; i < 2; ++i)
    if (q.input_rank(i) == 0) return Support::no("MatMulInteger operands must have rank >= 1");
  return check_8bit(q, {0, 1, 2, 3});
}

Outputs translate_matmul_integer(OpContext& c) {
  const auto& a = c.in(0);
  const auto& b = c.in(1);
  std::optional<mx::array> za, zb;
  if (c.has(2)) za = per_row(c.in(2), a, c.s);
  if (c.has(3)) zb = per_col(c.in(3), c.s);
  auto p = promote(centered(a, za, c.s), centered(b, zb, c.s), c.s);
  return {unpromote(int8_accumulate(p, c.s), p, c.s)};
}

Support check_qlinear_matmul(const NodeQuery& q) {
  for (size_t i : {0, 3})
    if (q.input_rank(i) == 0) return Support::no("QLinearMatMul operands must have rank >= 1");
  if (auto r = check_8bit(q, {0, 2, 3, 5, 7}); !r) return r;
  if (auto r = input_dtype_in(q, 1, {DType::Float32, DType::Float16, DType::BFloat16}); !r) return r;
  DType st = q.input_dtype(1);
  for (size_t i : {4, 6})
    if (q.input_dtype(i) != st) return Support::no("scales of different dtypes");
  // Half-precision scales (opset 21): ONNX's reference rounds the combined scale in that type
  // and multiplies in double, which is exact; GPUs have no float64 to do the same.
  if (q.gpu && st != DType::Float32) return Support::no("fp16/bf16 scales need float64 (CPU only)");
  return Support::yes();
}

Outputs translate_qlinear_matmul(OpContext& c) {
  const auto& a = c.in(0);
  const auto& b = c.in(3);
  auto za = per_row(c.in(2), a, c.s), zb = per_col(c.in(5), c.s);
  auto p = promote(centered(a, za, c.s), centered(b, zb, c.s), c.s);
  auto acc = int8_accumulate(p, c.s);

  // Requantize like ORT/MLAS: float(acc) * (a_scale * b_scale / y_scale) in float32, rounded
  // half to even, plus the output zero point, saturated. For fp16/bf16 scales (no ORT kernel)
  // follow ONNX's reference: the combined scale is rounded in the scale type and the product is
  // taken in float64, where it is exact.
  const auto st = c.in(1).dtype();
  const auto pt = st == mx::float32 ? mx::float32 : mx::float64;
  auto sa = per_row(c.in(1), a, c.s);
  if (p.row) sa = mx::reshape(sa, {}, c.s);  // a 1-D A has one row: its scale is a scalar
  auto scale = mx::divide(mx::multiply(sa, per_col(c.in(4), c.s), c.s),
                          mx::reshape(c.in(6), {}, c.s), c.s);
  scale = mx::astype(scale, pt, c.s);
  const auto& yzp = c.in(7);
  const auto out = yzp.dtype();
  const float lo = out == mx::int8 ? -128.f : 0.f, hi = out == mx::int8 ? 127.f : 255.f;
  auto v = mx::round(mx::multiply(mx::astype(acc, pt, c.s), scale, c.s), 0, c.s);
  v = mx::add(v, mx::reshape(mx::astype(yzp, pt, c.s), {}, c.s), c.s);
  v = mx::clip(v, mx::array(lo, pt), mx::array(hi, pt), c.s);
  return {unpromote(mx::astype(v, out, c.s), p, c.s)};
}

const OpEntry kOps[] = {
    {"", "MatMul", 1, kAnyOpset, check_matmul, translate_matmul,
     "integer types exact (limb-split float matmul, wrap-around mod 2^width)"},
    {"", "Gemm", 1, kAnyOpset, check_gemm, translate_gemm,
     "integer Gemm only with whole-number alpha/beta"},
    {"", "MatMulInteger", 10, kAnyOpset, check_matmul_integer, translate_matmul_integer},
    {"", "QLinearMatMul", 10, kAnyOpset, check_qlinear_matmul, translate_qlinear_matmul,
     "int8/uint8 only (no float8); fp16/bf16 scales on the CPU only; results saturate as the spec "
     "says and ORT's CPU EP does (the int8 node tests' expected outputs wrap around instead)"},
};

}  // namespace

std::span<const OpEntry> matmul_ops() { return kOps; }

}  // namespace ortmlx::ops
