// Rotary position embeddings: com.microsoft RotaryEmbedding, ai.onnx RotaryEmbedding (opset 23),
// and the rotation GroupQueryAttention applies with do_rotary.
//
// The caches are arbitrary tables (scaled, LongRoPE, ...), so the rotation is composed from
// gathered cos/sin rows rather than mx::fast::rope, which derives its own frequencies.
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "ops/contrib/contrib_internal.h"
#include "ops/switches.h"

namespace ortmlx::ops::contrib {

mx::array slice_axis(const mx::array& a, int axis, int lo, int hi, mx::Stream s) {
  mx::Shape start(a.ndim(), 0), stop = a.shape();
  start[axis] = lo;
  stop[axis] = hi;
  return mx::slice(a, start, stop, s);
}

namespace {

mx::array slice_last(const mx::array& a, int lo, int hi, mx::Stream s) {
  return slice_axis(a, static_cast<int>(a.ndim()) - 1, lo, hi, s);
}

}  // namespace

std::pair<mx::array, mx::array> rotary_half_tables(const mx::array& cos, const mx::array& sin,
                                                   mx::Dtype t, mx::Stream s) {
  auto c = mx::astype(cos, t, s), sn = mx::astype(sin, t, s);
  return {mx::concatenate({c, c}, -1, s), mx::concatenate({mx::negative(sn, s), sn}, -1, s)};
}

std::pair<mx::array, mx::array> prepared_half_tables(OpContext& c, mx::Dtype t, size_t cos_i,
                                                     size_t sin_i) {
  const std::string tag = std::to_string(static_cast<int>(t.val())) + "/" + c.node.inputs[cos_i] + "/" +
                          c.node.inputs[sin_i];
  auto cos2 = c.prepared("shared:rope_cos2/" + tag, {cos_i, sin_i},
                         [&] { return rotary_half_tables(c.in(cos_i), c.in(sin_i), t, c.s).first; });
  auto sin2 = c.prepared("shared:rope_sin2/" + tag, {cos_i, sin_i},
                         [&] { return rotary_half_tables(c.in(cos_i), c.in(sin_i), t, c.s).second; });
  return {cos2, sin2};
}

namespace {

// x * [cos, cos] + swap(x) * [-sin, sin] over x viewed as [..., 2, half]: the swap of halves is
// a reversed view of that axis (no copy), so under mx::compile the two products and the sum are
// one fused kernel reading x twice in place. Eager, the same rotation is four kernels (the swap's
// concatenation, two products, a sum), which a GPU decode step pays in every layer.
using ArrayFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

std::vector<mx::array> rotate_halves_body(const std::vector<mx::array>& in, mx::Stream s) {
  const mx::array& x = in[0];  // [..., 2, half]
  const int r = static_cast<int>(x.ndim());
  mx::Shape start(r, 0), stop = x.shape(), step(r, 1);
  start[r - 2] = 1;   // index 1, then 0: the halves swapped
  stop[r - 2] = -3;   // one before index 0 (MLX normalises a negative stop by adding the size)
  step[r - 2] = -1;
  auto swapped = mx::slice(x, start, stop, step, s);
  return {mx::add(mx::multiply(x, in[1], s), mx::multiply(swapped, in[2], s), s)};
}

// One compiled function per stream: a compiled tape keeps the stream its ops were traced on,
// so a function shared between streams would replay on the wrong one. The engine runs on the
// default streams, which MLX keeps per thread and device: one entry per such pair.
const ArrayFn& fused_rotate_halves(mx::Stream s) {
  static std::mutex mu;
  static std::map<int, ArrayFn> fns;
  std::lock_guard<std::mutex> lock(mu);
  auto it = fns.find(s.index);
  if (it == fns.end())
    it = fns.emplace(s.index, mx::compile([s](const std::vector<mx::array>& in) {
                       return rotate_halves_body(in, s);
                     })).first;
  return it->second;
}

}  // namespace

mx::array apply_rotary_halves(const mx::array& x, const mx::array& cos2, const mx::array& sin2,
                              int rotary_dim, mx::Stream s) {
  const int H = x.shape(-1), half = rotary_dim / 2;
  const mx::Dtype ct = compute_dtype(x, s);
  auto xc = mx::astype(x, ct, s);
  auto rot = rotary_dim == H ? xc : slice_last(xc, 0, rotary_dim, s);
  auto c2 = mx::astype(cos2, ct, s), s2 = mx::astype(sin2, ct, s);
  mx::array out = rot;
  // The option fused_rotary=0 keeps the eager four-kernel form (for comparisons).
  if (translation_switches().fused_rotary) {
    // Same products and sum as below, so the same roundings (up to the fused kernel's FMA).
    auto halves = [&](const mx::array& a) {
      auto shp = a.shape();
      shp.back() = 2;
      shp.push_back(a.shape(-1) / 2);
      return mx::reshape(a, shp, s);
    };
    const std::vector<mx::array> in = {halves(rot), halves(c2), halves(s2)};
    // Walked CPU runs (engine/caller_eval.h) compute the plain ops, not a generated kernel.
    const bool walked = s.device == mx::Device::cpu && translation_switches().cpu_caller_eval;
    out = mx::reshape((walked ? rotate_halves_body(in, s) : fused_rotate_halves(s)(in))[0], rot.shape(), s);
  } else {
    // [x1, x2] * [cos, cos] + [x2, x1] * [-sin, sin] = [x1 cos - x2 sin, x2 cos + x1 sin]: the
    // same roundings as the two halves computed apart (a - b == a + (-b) exactly).
    auto swapped = mx::concatenate({slice_last(rot, half, rotary_dim, s), slice_last(rot, 0, half, s)}, -1, s);
    out = mx::add(mx::multiply(rot, c2, s), mx::multiply(swapped, s2, s), s);
  }
  if (rotary_dim != H) out = mx::concatenate({out, slice_last(xc, rotary_dim, H, s)}, -1, s);
  return mx::astype(out, x.dtype(), s);
}

mx::array apply_rotary(const mx::array& x, const mx::array& cos, const mx::array& sin,
                       int rotary_dim, bool interleaved, mx::Stream s) {
  const int half = rotary_dim / 2, r = static_cast<int>(x.ndim());
  if (!interleaved) {
    auto [cos2, sin2] = rotary_half_tables(cos, sin, compute_dtype(x, s), s);
    return apply_rotary_halves(x, cos2, sin2, rotary_dim, s);
  }
  const int H = x.shape(-1);
  const mx::Dtype ct = compute_dtype(x, s);
  auto xc = mx::astype(x, ct, s);
  auto c = mx::astype(cos, ct, s), sn = mx::astype(sin, ct, s);
  auto rot = rotary_dim == H ? xc : slice_last(xc, 0, rotary_dim, s);
  // pairs (2i, 2i+1) rotate together
  auto shp = rot.shape();
  shp.back() = half;
  shp.push_back(2);
  auto pairs = mx::reshape(rot, shp, s);
  auto x1 = mx::take(pairs, 0, r, s), x2 = mx::take(pairs, 1, r, s);
  auto o1 = mx::subtract(mx::multiply(x1, c, s), mx::multiply(x2, sn, s), s);
  auto o2 = mx::add(mx::multiply(x2, c, s), mx::multiply(x1, sn, s), s);
  mx::array out = mx::reshape(mx::stack({o1, o2}, -1, s), rot.shape(), s);
  if (rotary_dim != H) out = mx::concatenate({out, slice_last(xc, rotary_dim, H, s)}, -1, s);
  return mx::astype(out, x.dtype(), s);
}

namespace {

// Rotates x given as [B, S, hidden] (num_heads from the attribute or the cache) or [B, N, S, H],
// with cos/sin rows already gathered per (batch, position): [B or 1, S, half], or with
// full_width the halves form's tables [B or 1, S, 2 * half] (rotary_half_tables).
mx::array rotate_bsd_or_bnsh(OpContext& c, const mx::array& x, mx::array cos, mx::array sin,
                             int num_heads, int rotary_dim, bool interleaved, bool full_width = false) {
  const int half = full_width ? cos.shape(-1) / 2 : cos.shape(-1);
  auto rotate = [&](const mx::array& v, const mx::array& co, const mx::array& si) {
    return full_width ? apply_rotary_halves(v, co, si, rotary_dim, c.s)
                      : apply_rotary(v, co, si, rotary_dim, interleaved, c.s);
  };
  if (x.ndim() == 4) {
    // [B, N, S, H]: positions vary along axis 2
    const int H = x.shape(3);
    if (rotary_dim == 0) rotary_dim = 2 * half;
    if (rotary_dim > H || rotary_dim != 2 * half) c.fail("rotary dimension does not match the cache");
    return rotate(x, mx::expand_dims(cos, 1, c.s), mx::expand_dims(sin, 1, c.s));
  }
  if (x.ndim() != 3) c.fail("input must be 3-D or 4-D");
  const int B = x.shape(0), S = x.shape(1), D = x.shape(2);
  if (num_heads <= 0) {
    // head size = the full rotary dimension the cache implies
    if (rotary_dim != 0 && rotary_dim != 2 * half) c.fail("num_heads is required for partial rotation");
    if (D % (2 * half) != 0) c.fail("hidden size is not a multiple of the cache's head size");
    num_heads = D / (2 * half);
  }
  if (D % num_heads != 0) c.fail("hidden size is not a multiple of num_heads");
  const int H = D / num_heads;
  if (rotary_dim == 0) rotary_dim = 2 * half;
  if (rotary_dim > H || rotary_dim != 2 * half) c.fail("rotary dimension does not match the cache");
  auto x4 = mx::reshape(x, {B, S, num_heads, H}, c.s);
  auto y = rotate(x4, mx::expand_dims(cos, 2, c.s), mx::expand_dims(sin, 2, c.s));
  return mx::reshape(y, {B, S, D}, c.s);
}

int seq_len_of(const mx::array& x) { return x.ndim() == 4 ? x.shape(2) : x.shape(1); }

// cos/sin rows for position ids [B, S] (or a scalar start position broadcast to [1, S]). Every
// rotary node of a decoder (two a layer) gathers the same rows from the same tables: gathered
// once per translation and shared (an eager run of a 24-layer fp16 Llama gathered them 96 times,
// each a kernel launch on the GPU; inside a shape family's segment MLX's compile merges them).
std::pair<mx::array, mx::array> gather_rows(OpContext& c, const mx::array& pos, const mx::array& cos,
                                            const mx::array& sin, int S) {
  auto rows = c.shared_result("rotary_rows/" + std::to_string(S), {pos, cos, sin}, [&] {
    mx::array p = mx::astype(pos, mx::int32, c.s);
    if (p.ndim() <= 1 && p.size() == 1)  // a start offset: positions start .. start + S - 1
      p = mx::expand_dims(mx::add(mx::arange(S, mx::int32, c.s), mx::reshape(p, {}, c.s), c.s), 0, c.s);
    if (p.ndim() != 2) c.fail("position_ids must be [batch, sequence] or a single start position");
    p = c.checked_indices(p, {cos.shape(0)}, false, "position_ids");
    return std::vector<mx::array>{mx::take(cos, p, 0, c.s), mx::take(sin, p, 0, c.s)};
  });
  return {rows[0], rows[1]};
}

// RotaryEmbedding's shared tables (prepared_half_tables) where its caches are constants and
// not interleaved; nullopt otherwise (then the rows are gathered first and the tables built
// from those).
std::optional<std::pair<mx::array, mx::array>> shared_half_tables(OpContext& c, const mx::array& x,
                                                                  size_t cos_i, size_t sin_i) {
  if (c.node.attr_int("interleaved", 0) != 0 || !c.is_constant(cos_i) || !c.is_constant(sin_i))
    return std::nullopt;
  return prepared_half_tables(c, compute_dtype(x, c.s), cos_i, sin_i);
}

}  // namespace

// ---- com.microsoft RotaryEmbedding: (input, position_ids, cos_cache, sin_cache) ---------------

Support check_rotary_ms(const NodeQuery& q) {
  if (q.node.attr_int("is_packed_batching", 0) != 0)
    return Support::no("RotaryEmbedding with is_packed_batching (ragged batches)");
  if (auto s = input_dtype_in(q, 0, {DType::Float32, DType::Float16, DType::BFloat16}); !s) return s;
  if (auto s = input_dtype_in(q, 1, {DType::Int64, DType::Int32}); !s) return s;
  return Support::yes();
}

Outputs translate_rotary_ms(OpContext& c) {
  const auto& x = c.in(0);
  // `scale` is accepted and unused, like ORT's CPU and CUDA kernels.
  const auto tables = shared_half_tables(c, x, 2, 3);
  auto [cos, sin] = gather_rows(c, c.in(1), tables ? tables->first : c.in(2),
                                tables ? tables->second : c.in(3), seq_len_of(x));
  return {rotate_bsd_or_bnsh(c, x, cos, sin, static_cast<int>(c.node.attr_int("num_heads", 0)),
                             static_cast<int>(c.node.attr_int("rotary_embedding_dim", 0)),
                             c.node.attr_int("interleaved", 0) != 0, tables.has_value())};
}

// ---- ai.onnx RotaryEmbedding-23: (X, cos_cache, sin_cache, position_ids?) ------------------------

Support check_rotary_onnx(const NodeQuery& q) {
  return input_dtype_in(q, 0, {DType::Float32, DType::Float16, DType::BFloat16});
}

Outputs translate_rotary_onnx(OpContext& c) {
  const auto& x = c.in(0);
  mx::array cos = c.in(1), sin = c.in(2);
  // Shared tables only where rows are gathered (without position_ids the caches are per call).
  const auto tables = c.has(3) ? shared_half_tables(c, x, 1, 2) : std::nullopt;
  if (c.has(3)) {
    std::tie(cos, sin) = gather_rows(c, c.in(3), tables ? tables->first : cos, tables ? tables->second : sin,
                                     seq_len_of(x));
  } else if (cos.ndim() != 3) {
    c.fail("without position_ids the caches must be [batch, sequence, dim/2]");
  }
  return {rotate_bsd_or_bnsh(c, x, cos, sin, static_cast<int>(c.node.attr_int("num_heads", 0)),
                             static_cast<int>(c.node.attr_int("rotary_embedding_dim", 0)),
                             c.node.attr_int("interleaved", 0) != 0, tables.has_value())};
}

}  // namespace ortmlx::ops::contrib
