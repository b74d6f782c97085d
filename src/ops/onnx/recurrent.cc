// RNN, GRU and LSTM, unrolled over time into one MLX graph.
//
// The sequence length is a shape, so it is known when the translator runs: every time step
// becomes a handful of MLX ops and the recurrent state never leaves MLX (one fused, compiled
// graph per input signature). The input projection X·W^T (+ the biases that can be folded) is
// one matmul for all steps outside the loop; a step only does H·R^T and the gate arithmetic.
// Both directions of a bidirectional layer advance together as a batch of 2 (a batched matmul
// on [2, B, H]): step k runs time k forward and time T-1-k backward.
//
// sequence_lens works with masks, so it is never read on the host: at a step past a batch
// row's length the state is kept and the output is 0. Running the reverse direction from T-1
// down to 0 with the same mask keeps the initial state until the row's last valid step, which
// is exactly ONNX's "reverse each sequence within its own length".
#include <algorithm>
#include <cctype>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "ops/common.h"
#include "ops/int_matmul.h"

namespace ortmlx::ops {

namespace {

enum class Cell { RNN, GRU, LSTM };

// ---------------------------------------------------------------------------------------------
// Activation functions (the list ONNX allows for the recurrent ops)

enum class Fn {
  Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu,
  Softsign, Softplus
};

struct FnInfo {
  const char* name;
  Fn fn;
  bool alpha, beta;            // consumes a value from activation_alpha / activation_beta
  float def_alpha, def_beta;   // defaults of the ONNX operator of the same name
  bool has_defaults;           // ONNX's and ORT's defaults agree (else explicit values needed)
};

constexpr FnInfo kFns[] = {
    {"Sigmoid", Fn::Sigmoid, false, false, 0, 0, true},
    {"Tanh", Fn::Tanh, false, false, 0, 0, true},
    {"Relu", Fn::Relu, false, false, 0, 0, true},
    {"Affine", Fn::Affine, true, true, 0, 0, false},
    {"LeakyRelu", Fn::LeakyRelu, true, false, 0.01f, 0, true},
    {"ThresholdedRelu", Fn::ThresholdedRelu, true, false, 0, 0, false},
    {"ScaledTanh", Fn::ScaledTanh, true, true, 0, 0, false},
    {"HardSigmoid", Fn::HardSigmoid, true, true, 0.2f, 0.5f, true},
    {"Elu", Fn::Elu, true, false, 1.0f, 0, true},
    {"Softsign", Fn::Softsign, false, false, 0, 0, true},
    {"Softplus", Fn::Softplus, false, false, 0, 0, true},
};

struct Act {
  Fn fn = Fn::Tanh;
  float alpha = 0, beta = 0;
  bool operator==(const Act& o) const {
    return fn == o.fn && alpha == o.alpha && beta == o.beta;
  }
};

bool same_name(const std::string& a, const char* b, bool case_sensitive) {
  std::string_view bv(b);
  if (a.size() != bv.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = bv[i];
    if (!case_sensitive) {
      x = static_cast<char>(std::tolower(static_cast<unsigned char>(x)));
      y = static_cast<char>(std::tolower(static_cast<unsigned char>(y)));
    }
    if (x != y) return false;
  }
  return true;
}

int num_directions(const graph::Node& n) {
  return n.attr_string("direction", "forward") == "bidirectional" ? 2 : 1;
}
int funcs_per_direction(Cell k) { return k == Cell::RNN ? 1 : k == Cell::GRU ? 2 : 3; }

// The activations of every direction, in attribute order (f, g[, h] of direction 0, then of
// direction 1), with alpha/beta consumed in that order. Fills `why` and returns {} where the
// node's attributes are ambiguous or invalid.
std::vector<Act> parse_activations(const graph::Node& n, Cell k, std::string* why) {
  const int D = num_directions(n), N = funcs_per_direction(k);
  static const std::vector<std::string> kDefaults[] = {
      {"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
  const auto* attr = n.attr("activations");
  std::vector<std::string> names = attr ? attr->strings : std::vector<std::string>{};
  if (names.empty())
    for (int d = 0; d < D; ++d)
      names.insert(names.end(), kDefaults[static_cast<int>(k)].begin(),
                   kDefaults[static_cast<int>(k)].end());
  // ORT's RNN takes the first of two names for one direction (the schema's default lists two).
  if (k == Cell::RNN && D == 1 && names.size() == 2) names.resize(1);
  if (static_cast<int>(names.size()) != N * D) {
    *why = "expected " + std::to_string(N * D) + " activations, got " +
           std::to_string(names.size());
    return {};
  }
  const auto alphas = n.attr_floats("activation_alpha");
  const auto betas = n.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  std::vector<Act> acts;
  for (size_t j = 0; j < names.size(); ++j) {
    // ORT matches GRU/LSTM names case-insensitively, RNN names exactly.
    const FnInfo* info = nullptr;
    for (const auto& f : kFns)
      if (same_name(names[j], f.name, k == Cell::RNN)) info = &f;
    if (!info) {
      *why = "unsupported activation '" + names[j] + "'";
      return {};
    }
    Act a{info->fn, info->def_alpha, info->def_beta};
    // ORT's RNN indexes activation_alpha/beta by direction instead of consuming them in order;
    // both readings agree only when direction d's value is the d-th one.
    auto take = [&](bool needed, const std::vector<float>& vals, size_t& idx, float& out) {
      if (!needed) return true;
      if (k == Cell::RNN && idx != j) return false;
      if (idx < vals.size()) {
        out = vals[idx++];
        return true;
      }
      // ONNX: "defaults are those of the operator of the same name"; ORT uses 0 for RNN and
      // for Affine/ThresholdedRelu/ScaledTanh. Only the agreed defaults are used.
      return info->has_defaults && k != Cell::RNN;
    };
    if (!take(info->alpha, alphas, ai, a.alpha) || !take(info->beta, betas, bi, a.beta)) {
      *why = std::string("activation ") + info->name +
             " needs explicit activation_alpha/activation_beta values (defaults are ambiguous)";
      return {};
    }
    acts.push_back(a);
  }
  return acts;
}

mx::array sc(double v, const mx::array& like) { return scalar_like(v, like); }

mx::array apply_fn(const Act& a, const mx::array& x, mx::Stream s) {
  switch (a.fn) {
    case Fn::Sigmoid: return sigmoid_precise(x, s);
    case Fn::Tanh: return tanh_precise(x, s);
    case Fn::Relu: return mx::maximum(x, sc(0, x), s);
    case Fn::Affine: return mx::add(mx::multiply(sc(a.alpha, x), x, s), sc(a.beta, x), s);
    case Fn::LeakyRelu:
      return mx::where(mx::greater_equal(x, sc(0, x), s), x, mx::multiply(sc(a.alpha, x), x, s), s);
    case Fn::ThresholdedRelu:  // ORT and the ThresholdedRelu operator: x > alpha
      return mx::where(mx::greater(x, sc(a.alpha, x), s), x, sc(0, x), s);
    case Fn::ScaledTanh:
      return mx::multiply(sc(a.alpha, x), tanh_precise(mx::multiply(sc(a.beta, x), x, s), s), s);
    case Fn::HardSigmoid: {
      auto y = mx::add(mx::multiply(sc(a.alpha, x), x, s), sc(a.beta, x), s);
      return mx::minimum(mx::maximum(y, sc(0, x), s), sc(1, x), s);
    }
    case Fn::Elu: {
      auto e = exp_precise(x, s);
      auto neg = mx::multiply(sc(a.alpha, x), mx::subtract(e, sc(1, x), s), s);
      return mx::where(mx::greater_equal(x, sc(0, x), s), x, neg, s);
    }
    case Fn::Softsign: return mx::divide(x, mx::add(sc(1, x), mx::abs(x, s), s), s);
    case Fn::Softplus: {  // log(1 + e^x) = max(x, 0) + log1p(e^-|x|), without overflow
      auto t = mx::log1p(exp_precise(mx::negative(mx::abs(x, s), s), s), s);
      return mx::add(mx::maximum(x, sc(0, x), s), t, s);
    }
  }
  return x;
}

// ---------------------------------------------------------------------------------------------
// The unrolled layer

struct Layer {
  Layer(Cell cell, mx::Stream s) : cell(cell), s(s) {}
  Cell cell;
  mx::Stream s;
  int D = 1, T = 0, B = 0, H = 0;
  std::vector<bool> reversed;  // per direction
  std::vector<Act> acts;       // N per direction
  std::optional<float> clip;

  // Activation number `j` (0 = f, 1 = g, 2 = h) applied to x [D, B, n]: once when every
  // direction uses the same function, else per direction.
  mx::array act(int j, const mx::array& x) const {
    const int N = funcs_per_direction(cell);
    if (D == 1 || acts[j] == acts[N + j]) return apply_fn(acts[j], x, s);
    std::vector<mx::array> parts;
    for (int d = 0; d < D; ++d)
      parts.push_back(apply_fn(acts[d * N + j], mx::slice(x, {d, 0, 0}, {d + 1, B, x.shape(2)}, s), s));
    return mx::concatenate(parts, 0, s);
  }
  mx::array clipped(const mx::array& x) const {
    if (!clip) return x;
    return mx::clip(x, sc(-*clip, x), sc(*clip, x), s);
  }
  // Last-axis slice [lo, hi) of a [D, B, n] array.
  mx::array cols(const mx::array& x, int lo, int hi) const {
    return mx::slice(x, {0, 0, lo}, {x.shape(0), x.shape(1), hi}, s);
  }
  // Reverse the time axis of the reversed directions of a [D, T, ...] array.
  mx::array flip_reversed(const mx::array& x) const {
    if (D == 1) return reversed[0] ? mx::flip(x, 1, s) : x;
    if (!reversed[1]) return x;
    auto sh = x.shape();
    auto lo = mx::Shape(sh.size(), 0), hi = sh;
    hi[0] = 1;
    auto d0 = mx::slice(x, lo, hi, s);
    lo[0] = 1;
    hi[0] = 2;
    auto d1 = mx::flip(mx::slice(x, lo, hi, s), 1, s);
    return mx::concatenate({d0, d1}, 0, s);
  }
};

Support check_recurrent(const NodeQuery& q, Cell k) {
  const auto& n = q.node;
  if (auto s = input_dtype_in(q, 0, kFloat); !s) return s;
  if (q.gpu && q.input_dtype(0) == DType::Float64)
    return Support::no("float64 is not supported on the GPU");
  if (auto s = input_dtype_in(q, 4, {DType::Int32}); !s) return s;
  auto dir = n.attr_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    return Support::no("unknown direction '" + dir + "'");
  auto layout = n.attr_int("layout", 0);
  if (layout != 0 && layout != 1) return Support::no("layout must be 0 or 1");
  if (n.has_attr("clip") && !(n.attr_float("clip", 0) > 0))
    return Support::no("clip must be positive");
  std::string why;
  if (parse_activations(n, k, &why).empty()) return Support::no(why);
  for (size_t i : {0, 1, 2})
    if (!q.has_input(i)) return Support::no("X, W and R are required");
  return Support::yes();
}

// An LSTM step through the CPU kernels: h [1, B, H] @ R[0]^T by the packed kernel, then the
// cell (cpu_lstm_cell) from the step's projection xt; {h', c'}, or nullopt where either declines.
std::optional<std::vector<mx::array>> lstm_cell_step(const mx::array& xt, const mx::array& h, const mx::array& R,
                                                     const mx::array& cell, mx::Stream s) {
  auto hr = packed_product(h, mx::transpose(mx::squeeze(R, 0, s), s), s);
  return hr ? cpu_lstm_cell(xt, *hr, cell, s) : std::nullopt;
}

// One function for RNN, GRU and LSTM, though long: the shared attribute and input handling
// (directions, sequence lengths, initial states, clip, activations) and the unrolled loop differ
// only in the cell, so splitting it would duplicate that handling per op.
Outputs translate_recurrent(OpContext& c, Cell k) {
  const auto& n = c.node;
  const mx::Stream s = c.s;
  const mx::Dtype out_t = c.in(0).dtype();
  const mx::Dtype ct = compute_half_in_f32(c.in(0), s) ? mx::float32 : out_t;
  auto opt = [&](size_t i) -> std::optional<mx::array> {
    if (!c.has(i)) return std::nullopt;
    return mx::astype(c.in(i), ct, s);
  };
  const int G = k == Cell::RNN ? 1 : k == Cell::GRU ? 3 : 4;  // gates
  const bool batch_major = n.attr_int("layout", 0) == 1;

  Layer L(k, s);
  std::string why;
  L.acts = parse_activations(n, k, &why);
  if (L.acts.empty()) c.fail(why);
  L.D = num_directions(n);
  const std::string dir = n.attr_string("direction", "forward");
  for (int d = 0; d < L.D; ++d) L.reversed.push_back(dir == "reverse" || d == 1);
  if (n.has_attr("clip")) L.clip = n.attr_float("clip", 0);

  mx::array x = mx::astype(c.in(0), ct, s);
  mx::array W = mx::astype(c.in(1), ct, s);
  mx::array R = mx::astype(c.in(2), ct, s);
  if (x.ndim() != 3 || W.ndim() != 3 || R.ndim() != 3) c.fail("X, W and R must be 3-D");
  if (batch_major) x = mx::transpose(x, {1, 0, 2}, s);  // [B, T, I] -> [T, B, I]
  L.T = x.shape(0);
  L.B = x.shape(1);
  const int I = x.shape(2), D = L.D, T = L.T, B = L.B;
  const int H = L.H = R.shape(2);
  if (n.has_attr("hidden_size") && n.attr_int("hidden_size", 0) != H)
    c.fail("hidden_size does not match R's shape");
  if (W.shape(0) != D || W.shape(1) != G * H || W.shape(2) != I)
    c.fail("W must have shape [num_directions, " + std::to_string(G) + "*hidden_size, input_size]");
  if (R.shape(0) != D || R.shape(1) != G * H) c.fail("R has the wrong shape");
  auto check_state = [&](std::optional<mx::array>& st, const char* what) {
    if (!st) return;
    if (batch_major) st = mx::transpose(*st, {1, 0, 2}, s);  // [B, D, H] -> [D, B, H]
    if (st->shape() != mx::Shape{D, B, H}) c.fail(std::string(what) + " has the wrong shape");
  };
  auto h0 = opt(5);
  check_state(h0, "initial_h");
  std::optional<mx::array> c0;
  if (k == Cell::LSTM) {
    c0 = opt(6);
    check_state(c0, "initial_c");
  }

  const bool input_forget = k == Cell::LSTM && n.attr_int("input_forget", 0) != 0;
  // On the CPU, one direction of an LSTM with ONNX's default activations, no clip, peepholes or
  // coupled gates, and constant float32 weights (a converted half-precision one would be a new
  // buffer each run, which the kernel would lay out again): both products through the packed
  // kernel (each weight laid out once) and a step's gate arithmetic as one kernel (cpu_lstm_cell).
  const bool kernel_lstm = k == Cell::LSTM && s.device == mx::Device::cpu && D == 1 && !L.clip && !input_forget &&
                           !c.has(7) && c.is_constant(1) && c.is_constant(2) && c.in(0).dtype() == mx::float32 &&
                           c.in(1).dtype() == mx::float32 && c.in(2).dtype() == mx::float32 &&
                           L.acts == std::vector<Act>{{Fn::Sigmoid}, {Fn::Tanh}, {Fn::Tanh}};
  // Input projection for every step at once: [1, T*B, I] @ [D, I, G*H] -> [D, T, B, G*H].
  std::optional<mx::array> xw_kernel;
  if (kernel_lstm) {
    std::optional<mx::array> bias;  // Wb + Rb [G*H], the products' start
    if (c.has(3))
      bias = c.prepared("lstm_bias", {3}, [&] {
        auto b = mx::astype(c.in(3), ct, s);
        if (b.shape() != mx::Shape{1, 2 * G * H}) c.fail("B has the wrong shape");
        return mx::add(mx::slice(b, {0, 0}, {1, G * H}, s), mx::slice(b, {0, G * H}, {1, 2 * G * H}, s), s);
      });
    if (bias) bias = mx::reshape(*bias, {G * H}, s);
    xw_kernel = packed_product(mx::reshape(x, {T * B, I}, s), mx::transpose(mx::squeeze(W, 0, s), s), s, bias);
  }
  auto xw = xw_kernel ? *xw_kernel
                      : mx::matmul(mx::reshape(x, {1, T * B, I}, s), mx::transpose(W, {0, 2, 1}, s), s);
  xw = mx::reshape(xw, {D, T, B, G * H}, s);
  // Biases: Wb + Rb fold into the projection, except GRU's Rbh with linear_before_reset,
  // which ONNX multiplies by the reset gate.
  const bool lbr = k == Cell::GRU && n.attr_int("linear_before_reset", 0) != 0;
  std::optional<mx::array> rbh;  // [D, 1, H]
  if (auto bias = xw_kernel ? std::nullopt : opt(3)) {
    if (bias->shape() != mx::Shape{D, 2 * G * H}) c.fail("B has the wrong shape");
    auto wb = mx::slice(*bias, {0, 0}, {D, G * H}, s);
    auto rb = mx::slice(*bias, {0, G * H}, {D, 2 * G * H}, s);
    if (lbr) {
      rbh = mx::reshape(mx::slice(rb, {0, 2 * H}, {D, 3 * H}, s), {D, 1, H}, s);
      rb = mx::concatenate({mx::slice(rb, {0, 0}, {D, 2 * H}, s), mx::zeros({D, H}, ct, s)}, 1, s);
    }
    xw = mx::add(xw, mx::reshape(mx::add(wb, rb, s), {D, 1, 1, G * H}, s), s);
  }
  // Step k reads time T-1-k for a reversed direction; [T, D, B, G*H] split into T steps.
  xw = mx::transpose(L.flip_reversed(xw), {1, 0, 2, 3}, s);
  std::vector<mx::array> xw_steps =
      T > 0 ? mx::split(xw, T, 0, s) : std::vector<mx::array>{};

  // Masks [D, B, 1] per step: the step's time index < the row's length.
  std::vector<mx::array> masks;
  std::optional<mx::array> empty_rows;  // [1, B, 1]: rows of length 0 (final state 0, as ORT)
  if (c.has(4)) {
    auto lens = mx::astype(c.in(4), mx::int32, s);
    if (lens.shape() != mx::Shape{B}) c.fail("sequence_lens must have shape [batch_size]");
    std::vector<int32_t> times;
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < D; ++d) times.push_back(L.reversed[d] ? T - 1 - t : t);
    auto tt = mx::array(times.data(), {T, D, 1, 1}, mx::int32);
    auto m = mx::less(tt, mx::reshape(lens, {1, 1, B, 1}, s), s);
    if (T > 0) masks = mx::split(m, T, 0, s);
    empty_rows = mx::reshape(mx::equal(lens, mx::array(0, mx::int32), s), {1, B, 1}, s);
  }

  const auto RT = mx::transpose(R, {0, 2, 1}, s);  // [D, H, G*H]
  std::optional<mx::array> pi, po, pf;            // LSTM peepholes, [D, 1, H]
  if (k == Cell::LSTM) {
    if (auto P = opt(7)) {
      if (P->shape() != mx::Shape{D, 3 * H}) c.fail("P has the wrong shape");
      auto part = [&](int j) { return mx::reshape(mx::slice(*P, {0, j * H}, {D, (j + 1) * H}, s), {D, 1, H}, s); };
      pi = part(0);
      po = part(1);
      pf = part(2);
    }
  }
  mx::array RT_zr = RT, RT_h = RT;
  if (k == Cell::GRU && !lbr) {  // (r ⊙ H)·Rh^T needs r first: split R into [Rz Rr] and Rh
    RT_zr = mx::slice(RT, {0, 0, 0}, {D, H, 2 * H}, s);
    RT_h = mx::slice(RT, {0, 0, 2 * H}, {D, H, 3 * H}, s);
  }

  mx::array h = h0 ? *h0 : mx::zeros({D, B, H}, ct, s);
  mx::array cell = c0 ? *c0 : mx::zeros({D, B, H}, ct, s);
  const bool want_y = n.has_output(0);
  std::vector<mx::array> ys;
  const auto one = mx::array(1.0, ct), zero = mx::array(0.0, ct);

  for (int t = 0; t < T; ++t) {
    auto xt = mx::squeeze(xw_steps[t], 0, s);  // [D, B, G*H]
    mx::array hn = h, cn = cell;
    if (k == Cell::RNN) {
      hn = L.act(0, L.clipped(mx::add(xt, mx::matmul(h, RT, s), s)));
    } else if (k == Cell::GRU) {
      auto hr = mx::matmul(h, RT_zr, s);  // [D, B, 2H] (3H with linear_before_reset)
      auto zr = L.act(0, L.clipped(mx::add(L.cols(xt, 0, 2 * H), L.cols(hr, 0, 2 * H), s)));
      auto z = L.cols(zr, 0, H), r = L.cols(zr, H, 2 * H);
      mx::array pre = L.cols(xt, 2 * H, 3 * H);
      if (lbr) {
        auto lin = L.cols(hr, 2 * H, 3 * H);
        if (rbh) lin = mx::add(lin, *rbh, s);
        pre = mx::add(pre, mx::multiply(r, lin, s), s);
      } else {
        pre = mx::add(pre, mx::matmul(mx::multiply(r, h, s), RT_h, s), s);
      }
      auto hh = L.act(1, L.clipped(pre));
      hn = mx::add(mx::multiply(mx::subtract(one, z, s), hh, s), mx::multiply(z, h, s), s);
    } else if (auto cell_kernel = kernel_lstm ? lstm_cell_step(xt, h, R, cell, s) : std::nullopt) {
      hn = (*cell_kernel)[0];
      cn = (*cell_kernel)[1];
    } else {
      auto g = mx::add(xt, mx::matmul(h, RT, s), s);  // gates i, o, f, c
      mx::array i = L.cols(g, 0, H), o = L.cols(g, H, 2 * H), f = L.cols(g, 2 * H, 3 * H);
      if (!pi && !input_forget) {  // i, o, f share f(): one activation over [D, B, 3H]
        auto iof = L.act(0, L.clipped(L.cols(g, 0, 3 * H)));
        i = L.cols(iof, 0, H);
        o = L.cols(iof, H, 2 * H);
        f = L.cols(iof, 2 * H, 3 * H);
      } else {
        if (pi) i = mx::add(i, mx::multiply(*pi, cell, s), s);
        i = L.act(0, L.clipped(i));
        if (input_forget) {  // coupled gates (ORT): f = 1 - i
          f = mx::subtract(one, i, s);
        } else {
          if (pf) f = mx::add(f, mx::multiply(*pf, cell, s), s);
          f = L.act(0, L.clipped(f));
        }
      }
      auto cc = L.act(1, L.clipped(L.cols(g, 3 * H, 4 * H)));
      cn = mx::add(mx::multiply(f, cell, s), mx::multiply(i, cc, s), s);
      if (pi || input_forget) {  // the output gate's peephole reads the new cell state
        if (po) o = mx::add(o, mx::multiply(*po, cn, s), s);
        o = L.act(0, L.clipped(o));
      }
      hn = mx::multiply(o, L.act(2, cn), s);
    }
    if (!masks.empty()) {
      const auto& m = masks[t];  // [1, D, B, 1] broadcasts against [D, B, H]
      auto mm = mx::squeeze(m, 0, s);
      if (want_y) ys.push_back(mx::where(mm, hn, zero, s));
      h = mx::where(mm, hn, h, s);
      if (k == Cell::LSTM) cell = mx::where(mm, cn, cell, s);
    } else {
      if (want_y) ys.push_back(hn);
      h = hn;
      cell = cn;
    }
  }

  auto finish = [&](mx::array a) { return a.dtype() == out_t ? a : mx::astype(a, out_t, s); };
  auto final_state = [&](mx::array st) {
    if (empty_rows) st = mx::where(*empty_rows, zero, st, s);
    if (batch_major) st = mx::transpose(st, {1, 0, 2}, s);
    return finish(st);
  };
  Outputs outs;
  auto y_h = final_state(h);
  if (want_y) {
    // [D, T, B, H] in step order -> time order -> [T, D, B, H] (layout 1: [B, T, D, H])
    mx::array y = T > 0 ? L.flip_reversed(mx::stack(ys, 1, s)) : mx::zeros({D, 0, B, H}, ct, s);
    y = mx::transpose(y, batch_major ? std::vector<int>{2, 1, 0, 3} : std::vector<int>{1, 0, 2, 3}, s);
    outs.push_back(finish(y));
  } else {
    outs.push_back(y_h);  // placeholder for the absent output
  }
  outs.push_back(y_h);
  if (k == Cell::LSTM) outs.push_back(final_state(cell));
  return outs;
}

Support check_rnn(const NodeQuery& q) { return check_recurrent(q, Cell::RNN); }
Support check_gru(const NodeQuery& q) { return check_recurrent(q, Cell::GRU); }
Support check_lstm(const NodeQuery& q) { return check_recurrent(q, Cell::LSTM); }
Outputs translate_rnn(OpContext& c) { return translate_recurrent(c, Cell::RNN); }
Outputs translate_gru(OpContext& c) { return translate_recurrent(c, Cell::GRU); }
Outputs translate_lstm(OpContext& c) { return translate_recurrent(c, Cell::LSTM); }

constexpr std::string_view kNotes =
    "unrolled over time in one graph; activations with parameters need explicit "
    "activation_alpha/beta where ONNX's and ORT's defaults differ; a row with sequence_lens 0 "
    "gets a zero final state (as ORT)";

const OpEntry kOps[] = {
    {"", "RNN", 1, kAnyOpset, check_rnn, translate_rnn, kNotes},
    {"", "GRU", 1, kAnyOpset, check_gru, translate_gru, kNotes},
    {"", "LSTM", 1, kAnyOpset, check_lstm, translate_lstm, kNotes},
};

}  // namespace

std::span<const OpEntry> recurrent_ops() { return kOps; }

}  // namespace ortmlx::ops
