// MatMulNBits and GatherBlockQuantized (com.microsoft): block-quantized weights.
//
// ORT's layout: B is uint8 [N, k_blocks, blob], each row of K values packed along K with the
// low-order bits first (4-bit: element 2j in the low nibble of byte j). MLX's affine quantized
// weights are uint32 [N, K * bits / 32] packed the same way within each little-endian word, so
// ORT's bytes *are* MLX's words: a reinterpreting view, no repacking. The dequantization differs
// only in form: ORT computes (q - zp) * scale, MLX q * scale + bias, so bias = -zp * scale.
//
// mx::quantized_matmul supports group sizes 32, 64 and 128 (it silently computes garbage for 16,
// so that is never passed). block_size 256+ is exact with group 128 and each scale repeated; block
// size 16, and act-order g_idx, dequantize with MLX ops and run a dense matmul.
#include <cmath>

#include "ops/contrib/contrib_internal.h"
#include "ops/int_matmul.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/dequantize.h"
#include "ops/switches.h"

namespace ortmlx::ops::contrib {

namespace {

bool pow2_at_least_16(int64_t v) { return v >= 16 && (v & (v - 1)) == 0; }

// uint8 bytes [..., n] holding `bits`-wide values low-order first -> uint8 [..., n * 8 / bits].
mx::array unpack_bits(const mx::array& bytes, int bits, mx::Stream s) {
  if (bits == 8) return bytes;
  const int per = 8 / bits;
  std::vector<uint8_t> sh(per);
  for (int i = 0; i < per; ++i) sh[i] = static_cast<uint8_t>(i * bits);
  auto shifts = mx::array(sh.begin(), {per}, mx::uint8);
  auto v = mx::bitwise_and(mx::right_shift(mx::expand_dims(bytes, -1, s), shifts, s),
                           mx::array(static_cast<uint8_t>((1 << bits) - 1), mx::uint8), s);
  auto shape = bytes.shape();
  shape.back() *= per;
  return mx::reshape(v, shape, s);
}

struct NBits {
  int64_t K, N, bits, block, n_blocks, blob;
};

NBits nbits_attrs(const graph::Node& n) {
  NBits p{};
  p.K = n.attr_int("K", 0);
  p.N = n.attr_int("N", 0);
  p.bits = n.attr_int("bits", 4);
  p.block = n.attr_int("block_size", 0);
  p.n_blocks = p.block > 0 ? (p.K + p.block - 1) / p.block : 0;
  p.blob = p.block * p.bits / 8;
  return p;
}

// Zero points as [N, n_blocks] in dtype `t`: unpacked from uint8, reshaped from float, or the
// default 2^(bits-1).
mx::array zero_points(OpContext& c, const NBits& p, mx::Dtype t) {
  const int N = static_cast<int>(p.N), nb = static_cast<int>(p.n_blocks);
  if (!c.has(3)) return mx::array(static_cast<float>(1 << (p.bits - 1)), t);
  const auto& zp = c.in(3);
  if (zp.dtype() == mx::uint8) {
    const int64_t row_bytes = (p.n_blocks * p.bits + 7) / 8;
    if (static_cast<int64_t>(zp.size()) != p.N * row_bytes)
      c.fail("packed zero_points has " + std::to_string(zp.size()) + " bytes, expected N * " +
             std::to_string(row_bytes));
    auto v = unpack_bits(mx::reshape(zp, {N, static_cast<int>(row_bytes)}, c.s),
                         static_cast<int>(p.bits), c.s);
    return mx::astype(mx::slice(v, {0, 0}, {N, nb}, c.s), t, c.s);
  }
  if (static_cast<int64_t>(zp.size()) != p.N * p.n_blocks)
    c.fail("zero_points must have N * k_blocks elements");
  return mx::astype(mx::reshape(zp, {N, nb}, c.s), t, c.s);
}

// accuracy_level 4 lets the kernel quantize A to int8 per block of K. ORT's CPU EP does exactly
// that (MLAS CompInt8: symmetric, scale = max|a| / 127, round half to even) whenever its int8
// kernels apply: packed or absent zero points, no g_idx. Integer dot products scaled afterwards
// equal a float matmul of the fake-quantized A (the products are exact), so we quantize-dequantize
// A and keep the float path: results then match the reference EP to float rounding, where plain
// float A differs by ~1% of a dot product (enough to flip greedy tokens).
mx::array fake_quant_int8_blocks(const mx::array& x, int K, int Kp, int block, mx::Stream s) {
  auto xf = mx::astype(x, mx::float32, s);
  const int r = static_cast<int>(xf.ndim());
  if (Kp != K) xf = mx::pad(xf, {r - 1}, {0}, {Kp - K}, mx::array(0.f), "constant", s);
  auto shape = xf.shape();
  shape.back() = Kp / block;
  shape.push_back(block);
  auto blk = mx::reshape(xf, shape, s);
  // MLAS's arithmetic: scale = max / 127 and codes round(x * (127 / max)) (not x / scale).
  auto amax = mx::max(mx::abs(blk, s), -1, true, s);
  auto scale = mx::divide(amax, mx::array(127.f), s);
  auto nz = mx::not_equal(amax, mx::array(0.f), s);
  auto inv = mx::where(nz, mx::divide(mx::array(127.f), mx::where(nz, amax, mx::array(1.f), s), s),
                       mx::array(0.f), s);
  auto q = mx::clip(mx::round(mx::multiply(blk, inv, s), 0, s), mx::array(-128.f), mx::array(127.f), s);
  auto out = mx::reshape(mx::multiply(q, scale, s), xf.shape(), s);
  if (Kp != K) {
    mx::Shape start(r, 0), stop = out.shape();
    stop.back() = K;
    out = mx::slice(out, start, stop, s);
  }
  return mx::astype(out, x.dtype(), s);
}

}  // namespace

Support check_matmul_nbits(const NodeQuery& q) {
  const auto& n = q.node;
  auto p = nbits_attrs(n);
  if (p.K <= 0 || p.N <= 0) return Support::no("MatMulNBits needs positive K and N attributes");
  if (p.bits != 2 && p.bits != 4 && p.bits != 8)
    return Support::no("MatMulNBits bits=" + std::to_string(p.bits) + " (2, 4 and 8 are supported)");
  if (!pow2_at_least_16(p.block))
    return Support::no("MatMulNBits block_size must be a power of 2 >= 16");
  if (n.attr_int("weight_prepacked", 0) != 0)
    return Support::no("MatMulNBits with EP-prepacked weights (weight_prepacked != 0)");
  if (auto s = input_dtype_in(q, 0, {DType::Float32, DType::Float16, DType::BFloat16}); !s) return s;
  if (auto s = input_dtype_in(q, 1, {DType::UInt8}); !s) return s;
  if (auto s = input_dtype_in(q, 2, {DType::Float32, DType::Float16, DType::BFloat16}); !s) return s;
  if (auto s = input_dtype_in(q, 3, {DType::UInt8, DType::Float32, DType::Float16, DType::BFloat16}); !s)
    return s;
  // ORT's CPU kernel ignores packed uint8 zero points whenever g_idx is given (it dequantizes with
  // the default 2^(bits-1)); the two readings disagree, so leave that combination to ORT.
  if (q.has_input(4) && q.has_input(3) && q.input_dtype(3) == DType::UInt8)
    return Support::no("MatMulNBits with g_idx and packed uint8 zero_points (ORT ignores them)");
  return Support::yes();
}

Outputs translate_matmul_nbits(OpContext& c) {
  const auto p = nbits_attrs(c.node);
  const int N = static_cast<int>(p.N), K = static_cast<int>(p.K), nb = static_cast<int>(p.n_blocks);
  const int Kp = nb * static_cast<int>(p.block), bits = static_cast<int>(p.bits);
  mx::array x = c.in(0);
  const auto out_t = x.dtype();
  if (x.ndim() == 0 || x.shape(-1) != K) c.fail("A's last dimension must be K=" + std::to_string(K));
  if (static_cast<int64_t>(c.in(1).size()) != p.N * p.n_blocks * p.blob)
    c.fail("B must hold N * k_blocks * blob_size bytes");
  if (static_cast<int64_t>(c.in(2).size()) != p.N * p.n_blocks)
    c.fail("scales must have N * k_blocks elements");

  const mx::Dtype ct = contrib::compute_dtype(x, c.s);
  // A batch of rows already at hand flat (rows_source): the product of those, the result
  // reshaped back last (as translate_matmul does). MLX's quantized matmul takes a batch as it is,
  // so a reshape made here would only add a view.
  const mx::array batched = x;
  const auto flat_rows = x.ndim() > 2 ? rows_source(x) : std::nullopt;
  const bool flat = flat_rows.has_value();
  if (flat) x = *flat_rows;
  x = mx::astype(x, ct, c.s);
  // Weight views (free, but each is an MLX primitive every eager run evaluates: ~1/3 of a GPU
  // decode step's primitives) are prepared once when the weights are initializers.
  const std::string ct_tag = std::to_string(static_cast<int>(ct.val()));
  auto scales = c.prepared("scales2d/" + ct_tag, {2}, [&] {
    return mx::astype(mx::reshape(c.in(2), {N, nb}, c.s), ct, c.s);
  });
  auto zp = zero_points(c, p, ct);
  auto packed = c.prepared("packed2d", {1}, [&] {
    return mx::reshape(c.in(1), {N, nb * static_cast<int>(p.blob)}, c.s);
  });

  // The inputs the weight layout derives from (B, scales, zero points, g_idx, where given).
  std::vector<size_t> weight_inputs{1, 2};
  for (size_t i : {3, 4})
    if (c.has(i)) weight_inputs.push_back(i);

  // g_idx maps each column k to its block. The identity map (k / block_size) is the plain layout.
  std::optional<mx::array> g_idx;
  if (c.has(4)) {
    auto g = c.host_ints(4);
    if (static_cast<int64_t>(g.size()) < p.K) c.fail("g_idx must have K entries");
    for (int64_t k = 0; k < p.K; ++k)
      if (g[k] < 0 || g[k] >= p.n_blocks) c.fail("g_idx value out of range");
    bool identity = true;
    for (int64_t k = 0; k < p.K && identity; ++k) identity = g[k] == k / p.block;
    if (!identity)
      g_idx = mx::astype(mx::slice(mx::reshape(c.in(4), {-1}, c.s), {0}, {K}, c.s), mx::int32, c.s);
  }

  const bool float_zp = c.has(3) && c.in(3).dtype() != mx::uint8;
  // MLAS has int8 kernels for 4- and 8-bit weights at every block size, for 2-bit at 32..128.
  const bool int8_kernel = p.bits != 2 || (p.block >= 32 && p.block <= 128);
  const bool int8_activations = c.node.attr_int("accuracy_level", 0) == 4 && int8_kernel &&
                                !float_zp && !c.has(4) && c.emulate_int8_activations();

  // MLX's CPU quantized matmul is a scalar loop whose cost grows with the rows of A (measured at
  // K = N = 4096: ~60 ms per row, vs. a fixed ~0.5 s to dequantize and one sgemm), so on the CPU
  // backend prompts (many rows) take the dequantize path (or, int8 blocks, the integer kernel);
  // decode steps (few rows) stay quantized, in the EP's row kernels.
  // (Tried: decode through the prepared fp32 copy as well: 13.6 -> 14.9 tok/s on a 60M-parameter
  // Llama, within noise, for 8x the weight memory; not worth it.)
  const int64_t rows = K ? static_cast<int64_t>(x.size()) / K : 0;
  const bool cpu_many_rows = c.s.device == mx::Device::cpu && rows >= 8;
  mx::array y = x;
  std::optional<mx::array> row_kernel;
  // The CPU kernels' weight inputs besides ORT's bytes: float32 scales and -scale * zero_point
  // per block, prepared once (contiguous: the kernels read them flat, also when they are not
  // initializers).
  auto kernel_scales = [&] {
    return c.prepared("row_scales", weight_inputs, [&] {
      return mx::contiguous(mx::astype(scales, mx::float32, c.s), false, c.s);
    });
  };
  // -scale * zero_point per block, [N, nb].
  auto zbias = [&] { return mx::broadcast_to(mx::negative(mx::multiply(zp, scales, c.s), c.s), {N, nb}, c.s); };
  auto kernel_zbias = [&] {
    return c.prepared("row_zbias", weight_inputs, [&] { return mx::contiguous(zbias(), false, c.s); });
  };
  const bool cpu_int4 = c.s.device == mx::Device::cpu && p.bits == 4 && !g_idx && ct == mx::float32;
  bool constant_weights = true;
  for (size_t i : weight_inputs) constant_weights = constant_weights && c.is_constant(i);
  if (cpu_int4 && int8_activations && constant_weights && translation_switches().cpu_int4_gemm &&
      cpu_int4_panels_apply(static_cast<int>(p.block))) {
    // Decode rows and prompts (int8 blocks, AVX-512 VNNI): integer products per block, as ORT's
    // CPU EP computes them, from one panel copy of the weight laid out once.
    const auto codes = c.prepared("int4_panel_codes", {1}, [&] { return cpu_int4_panel_codes(packed, c.s); });
    const auto panel_scales = c.prepared("int4_panel_scales", weight_inputs, [&] {
      return cpu_int4_panel_floats(scales, c.s);
    });
    std::optional<mx::array> panel_zbias;
    if (c.has(3))
      panel_zbias = c.prepared("int4_panel_zbias", weight_inputs, [&] { return cpu_int4_panel_floats(zbias(), c.s); });
    row_kernel = cpu_int4_panel_product(x, codes, panel_scales, panel_zbias, K, N, static_cast<int>(p.block), c.s);
  }
  if (!row_kernel && cpu_int4 && rows == 1)  // a decode step: the 4-bit row kernel on ORT's bytes
    row_kernel = cpu_int4_gemv(x, packed, kernel_scales(), kernel_zbias(), K, static_cast<int>(p.block), c.s,
                               int8_activations, !c.has(3));
  if (!row_kernel && cpu_int4 && rows >= 2 && !cpu_many_rows) {
    // A few rows otherwise (a batch of decode rows): the row kernel a row at a time. MLX's
    // quantized matmul on the CPU is a scalar loop (~100x the time at 4 x 2048 x 2048).
    const auto flat = mx::reshape(x, {static_cast<int>(rows), K}, c.s);
    std::vector<mx::array> parts;
    for (int r = 0; r < static_cast<int>(rows); ++r) {
      auto yr = cpu_int4_gemv(mx::slice(flat, {r, 0}, {r + 1, K}, c.s), packed, kernel_scales(), kernel_zbias(), K,
                              static_cast<int>(p.block), c.s, int8_activations, !c.has(3));
      if (!yr) {
        parts.clear();
        break;
      }
      parts.push_back(*yr);
    }
    if (!parts.empty()) {
      mx::Shape out = x.shape();
      out.back() = N;
      row_kernel = mx::reshape(mx::concatenate(parts, 0, c.s), out, c.s);
    }
  }
  if (!row_kernel && int8_activations) x = fake_quant_int8_blocks(x, K, Kp, static_cast<int>(p.block), c.s);
  if (row_kernel) {
    y = *row_kernel;
  } else if (p.block >= 32 && !g_idx && !cpu_many_rows) {
    // MLX affine quantized matmul on ORT's bytes viewed as uint32 words.
    const int group = static_cast<int>(std::min<int64_t>(p.block, 128));
    const int rep = static_cast<int>(p.block) / group;
    // Scales and biases in MLX's layout depend on the weights only: prepared once per program
    // (not per run) when they are initializers.
    const std::string tag = std::to_string(static_cast<int>(ct.val())) + "/" + std::to_string(rep);
    auto biases = c.prepared("q_biases/" + tag, weight_inputs, [&] {
      auto b = mx::negative(mx::multiply(zp, scales, c.s), c.s);
      if (zp.ndim() == 0) b = mx::broadcast_to(b, scales.shape(), c.s);
      return rep > 1 ? mx::repeat(b, rep, 1, c.s) : b;
    });
    if (rep > 1) scales = c.prepared("q_scales/" + tag, weight_inputs, [&] { return mx::repeat(scales, rep, 1, c.s); });
    auto w = c.prepared("words", {1}, [&] { return mx::view(packed, mx::uint32, c.s); });
    // K is padded to whole blocks in B; zero activations make the padding contribute nothing.
    if (Kp != K) x = mx::pad(x, {static_cast<int>(x.ndim()) - 1}, {0}, {Kp - K}, mx::array(0, ct), "constant", c.s);
    const bool vec = x.ndim() == 1;
    if (vec) x = mx::expand_dims(x, 0, c.s);
    // A prompt on the GPU: MLX's quantized matmul for many rows runs several times slower than
    // dequantizing the weight (one kernel) and a dense product (cuBLAS), which is what ORT's CUDA
    // EP does too. The dequantized weight lives for this run only. Float32 rows take that form
    // whatever their count: MLX's CUDA kernel for many float32 rows fails to launch at group 128.
    const int dense_rows = translation_switches().int4_dense_rows;
    if (c.s.device == mx::Device::gpu && rows > 1 &&
        (ct == mx::float32 || (dense_rows > 0 && rows >= dense_rows))) {
      std::optional<mx::array> dense;
      if (bits == 4 && translation_switches().gpu_kernels && translation_switches().int4_dequantize_kernel)
        dense = kernels::cuda::dequantize_int4(w, scales, biases, group, ct, c.s);
      if (!dense) dense = mx::dequantize(w, scales, biases, group, bits, "affine", std::nullopt, ct, c.s);
      y = mx::matmul(x, mx::transpose(*dense, c.s), c.s);
    } else
      y = mx::quantized_matmul(x, w, scales, biases, /*transpose=*/true, group, bits, "affine", c.s);
    if (vec) y = mx::squeeze(y, 0, c.s);
  } else {
    // Exact dequantization, as ORT does it: (q - zp) * scale, then a dense matmul. The
    // dequantized weight depends on the initializers only: prepared once per program.
    auto dequantized = [&] {
    auto qv = mx::astype(unpack_bits(packed, bits, c.s), ct, c.s);  // [N, Kp]
    mx::array w = qv;
    if (g_idx) {
      auto zp_full = zp.ndim() == 0 ? zp : mx::take(zp, *g_idx, 1, c.s);
      w = mx::multiply(mx::subtract(mx::slice(qv, {0, 0}, {N, K}, c.s), zp_full, c.s),
                       mx::take(scales, *g_idx, 1, c.s), c.s);
    } else {
      auto zp3 = zp.ndim() == 0 ? zp : mx::expand_dims(zp, -1, c.s);
      w = mx::multiply(mx::subtract(mx::reshape(qv, {N, nb, static_cast<int>(p.block)}, c.s), zp3, c.s),
                       mx::expand_dims(scales, -1, c.s), c.s);
      w = mx::slice(mx::reshape(w, {N, Kp}, c.s), {0, 0}, {N, K}, c.s);
    }
    return mx::transpose(w, c.s);
    };
    const auto wT = c.prepared("deq_wT/" + std::to_string(static_cast<int>(ct.val())) + (g_idx ? "/g" : ""),
                               weight_inputs, dequantized);
    // A prompt on the CPU: the EP's packed product (the dequantized weight, prepared once, is
    // laid out once more for its tiles), as MatMul by a constant takes it.
    const auto packed_y = ct == mx::float32 ? packed_product(x, wT, c.s) : std::nullopt;
    y = packed_y ? *packed_y : mx::matmul(x, wT, c.s);
  }
  if (c.has(5)) y = mx::add(y, mx::astype(c.in(5), ct, c.s), c.s);
  y = mx::astype(y, out_t, c.s);
  return {flat ? rows_to(y, batched, c.s) : y};
}

// ---- GatherBlockQuantized ----------------------------------------------------------------------

Support check_gather_block_quantized(const NodeQuery& q) {
  const auto& n = q.node;
  if (q.input_dtype(0) != DType::UInt8)
    return Support::no("GatherBlockQuantized: only uint8 data (int4/uint4/fp8/fp4 have no MLX dtype)");
  int64_t bits = n.attr_int("bits", 4);
  if (bits != 2 && bits != 4 && bits != 8)
    return Support::no("GatherBlockQuantized bits must be 2, 4 or 8");
  if (!pow2_at_least_16(n.attr_int("block_size", 128)))
    return Support::no("GatherBlockQuantized block_size must be a power of 2 >= 16");
  if (auto s = input_dtype_in(q, 1, {DType::Int32, DType::Int64}); !s) return s;
  if (auto s = input_dtype_in(q, 2, {DType::Float32, DType::Float16, DType::BFloat16}); !s) return s;
  int r = q.input_rank(0);
  if (r > 0) {
    int ga = static_cast<int>(n.attr_int("gather_axis", 0)), qa = static_cast<int>(n.attr_int("quantize_axis", 1));
    if (ga < 0) ga += r;
    if (qa < 0) qa += r;
    if (ga != 0) return Support::no("GatherBlockQuantized with uint8 data needs gather_axis 0");
    if (qa != r - 1 && bits != 8)
      return Support::no("GatherBlockQuantized: packed data must be quantized along its last axis");
    if (ga == qa && bits != 8) return Support::no("GatherBlockQuantized: gather_axis == quantize_axis");
  }
  return Support::yes();
}

// Gathers the packed rows first (a few rows of a large table), then dequantizes only those.
Outputs translate_gather_block_quantized(OpContext& c) {
  const auto& n = c.node;
  const int bits = static_cast<int>(n.attr_int("bits", 4));
  const int block = static_cast<int>(n.attr_int("block_size", 128));
  const auto& data = c.in(0);
  const int r = static_cast<int>(data.ndim());
  const int qa = norm_axis(n.attr_int("quantize_axis", 1), r, "quantize_axis");
  auto scales = c.in(2);
  const auto out_t = scales.dtype();
  const mx::Dtype ct = compute_half_in_f32(scales, c.s) ? mx::float32 : out_t;

  // Out-of-range indices give zero rows (unlike Gather); negative ones count from the end.
  const int rows = data.shape(0);
  auto idx = mx::astype(c.in(1), mx::int32, c.s);
  idx = mx::where(mx::less(idx, mx::array(0), c.s), mx::add(idx, mx::array(rows), c.s), idx, c.s);
  auto valid = mx::logical_and(mx::greater_equal(idx, mx::array(0), c.s),
                               mx::less(idx, mx::array(rows), c.s), c.s);
  idx = mx::where(valid, idx, mx::array(0), c.s);

  // Unpacked values [rows, ..., D] (the last axis expands for bits < 8).
  auto q = mx::take(unpack_bits(data, bits, c.s), idx, 0, c.s);  // idx.shape + rest
  const int lead = static_cast<int>(idx.ndim());
  const int qa_out = qa + lead - 1;  // quantize axis in the gathered output
  const int D = q.shape(qa_out);
  if (D % block != 0 && scales.shape(qa) * block < D) c.fail("scales do not cover the quantize axis");
  auto sg = mx::take(mx::astype(scales, ct, c.s), idx, 0, c.s);
  std::optional<mx::array> zg;
  if (c.has(3)) {
    auto z = c.in(3);
    if (z.dtype() == mx::uint8) z = unpack_bits(z, bits, c.s);
    // Packed zero points pad the blocked axis to a whole byte: trim to the scale count.
    if (z.shape(qa) != scales.shape(qa)) {
      auto stop = z.shape();
      stop[qa] = scales.shape(qa);
      z = mx::slice(z, mx::Shape(z.ndim(), 0), stop, c.s);
    }
    zg = mx::take(mx::astype(z, ct, c.s), idx, 0, c.s);
  }
  // Expand per-block parameters along the quantize axis to per-element, then trim padding.
  auto expand = [&](mx::array a) {
    a = mx::repeat(a, block, qa_out, c.s);
    auto stop = a.shape();
    stop[qa_out] = D;
    return mx::slice(a, mx::Shape(a.ndim(), 0), stop, c.s);
  };
  auto qf = mx::astype(q, ct, c.s);
  auto zf = zg ? expand(*zg) : mx::array(static_cast<float>(1 << (bits - 1)), ct);
  auto y = mx::multiply(mx::subtract(qf, zf, c.s), expand(sg), c.s);
  auto vshape = valid.shape();
  for (int i = lead; i < static_cast<int>(y.ndim()); ++i) vshape.push_back(1);
  y = mx::where(mx::reshape(valid, vshape, c.s), y, mx::array(0, ct), c.s);
  return {mx::astype(y, out_t, c.s)};
}

}  // namespace ortmlx::ops::contrib
