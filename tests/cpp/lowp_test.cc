// The float8/float4/int4/uint4 codecs (ops/lowp.h), checked exhaustively against a reference
// written here independently: the value of every code from the format's definition, and
// float32 -> code as "the nearest representable value, ties to the even code", found by a
// search over the sorted values rather than by bit manipulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "ops/lowp.h"

using namespace ortmlx;
using graph::DType;
namespace mx = mlx::core;
namespace lowp = ortmlx::ops::lowp;

namespace {

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

struct Spec {
  DType t;
  int e, m, bias;
  int bits;           // 8 or 4
  bool neg_zero;      // has -0 (FN, e5m2, e2m1)
  bool nan_0x80;      // FNUZ: the only NaN is 1000 0000
  bool ieee_special;  // e5m2: top exponent is Inf (m == 0) / NaN
  bool fn_nan;        // e4m3fn: S.1111.111 is NaN
  const char* name;
};

const Spec kSpecs[] = {
    {DType::Float8E4M3FN, 4, 3, 7, 8, true, false, false, true, "e4m3fn"},
    {DType::Float8E4M3FNUZ, 4, 3, 8, 8, false, true, false, false, "e4m3fnuz"},
    {DType::Float8E5M2, 5, 2, 15, 8, true, false, true, false, "e5m2"},
    {DType::Float8E5M2FNUZ, 5, 2, 16, 8, false, true, false, false, "e5m2fnuz"},
    {DType::Float4E2M1, 2, 1, 1, 4, true, false, false, false, "e2m1"},
};

// The value of a code from the format's definition (NaN for NaN codes, +-Inf for Inf).
double ref_value(const Spec& f, int code) {
  const int sign = (code >> (f.bits - 1)) & 1;
  const int mag = code & ((1 << (f.bits - 1)) - 1);
  const int e = mag >> f.m, m = mag & ((1 << f.m) - 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (f.nan_0x80 && code == 0x80) return nan;
  if (f.fn_nan && mag == 0x7F) return nan;
  if (f.ieee_special && e == (1 << f.e) - 1)
    return m ? nan : (sign ? -INFINITY : INFINITY);
  double v = e == 0 ? m * std::pow(2.0, 1 - f.bias - f.m)
                    : (1.0 + m / std::pow(2.0, f.m)) * std::pow(2.0, e - f.bias);
  return sign ? -v : v;
}

struct Finite {
  double v;
  int code;
};

// The non-negative finite values with their codes, ascending.
std::vector<Finite> positive_values(const Spec& f) {
  std::vector<Finite> out;
  for (int c = 0; c < (1 << (f.bits - 1)); ++c) {
    double v = ref_value(f, c);
    if (std::isfinite(v)) out.push_back({v, c});
  }
  std::sort(out.begin(), out.end(), [](auto a, auto b) { return a.v < b.v; });
  return out;
}

// Reference float32 -> code: nearest representable value, ties to the even code. Out of range:
// saturate -> the largest finite value; otherwise a value that would round past it is Inf
// (e5m2) or NaN (the others), as ONNX's Cast table says. e2m1 always saturates; NaN -> 0 there.
int ref_encode(const Spec& f, const std::vector<Finite>& vals, float xf, bool saturate) {
  const double x = xf;
  const int sign_bit = 1 << (f.bits - 1);
  const int sign = std::signbit(x) ? sign_bit : 0;
  if (std::isnan(x)) {
    if (f.nan_0x80) return 0x80;
    if (f.fn_nan) return sign | 0x7F;
    if (f.ieee_special) return sign | 0x7E;
    return 0;
  }
  const double a = std::fabs(x);
  const Finite top = vals.back();
  // The value one step past the largest finite one, at the same spacing.
  const double step = std::pow(2.0, std::floor(std::log2(top.v)) - f.m);
  int mag;
  if (a > top.v) {
    const double mid = top.v + step / 2;
    bool over = a > mid || (a == mid && (top.code & 1));
    if (std::isinf(a)) over = true;
    if (!over) {
      mag = top.code;
    } else if (saturate || f.bits == 4) {
      mag = top.code;
    } else if (f.ieee_special) {
      return sign | 0x7C;
    } else if (f.nan_0x80) {
      return 0x80;
    } else {
      return sign | 0x7F;
    }
  } else {
    auto hi = std::lower_bound(vals.begin(), vals.end(), a, [](auto p, double v) { return p.v < v; });
    if (hi->v == a) {
      mag = hi->code;
    } else {
      auto lo = hi - 1;
      double dl = a - lo->v, dh = hi->v - a;
      mag = dl < dh ? lo->code : dh < dl ? hi->code : ((lo->code & 1) ? hi->code : lo->code);
    }
  }
  if (mag == 0 && !f.neg_zero) return 0;
  return sign | mag;
}

std::vector<uint8_t> encode(const Spec& f, const std::vector<float>& x, bool saturate) {
  auto in = mx::array(x.data(), {static_cast<int>(x.size())}, mx::float32);
  auto out = lowp::encode(in, f.t, saturate, cpu());
  out.eval();
  EXPECT_EQ(out.dtype(), mx::uint8);
  return std::vector<uint8_t>(out.data<uint8_t>(), out.data<uint8_t>() + out.size());
}

std::vector<float> decode(const Spec& f, const std::vector<uint8_t>& codes) {
  auto in = mx::array(codes.data(), {static_cast<int>(codes.size())}, mx::uint8);
  auto out = lowp::decode(in, f.t, cpu());
  out.eval();
  EXPECT_EQ(out.dtype(), mx::float32);
  return std::vector<float>(out.data<float>(), out.data<float>() + out.size());
}

std::vector<uint8_t> all_codes(const Spec& f) {
  std::vector<uint8_t> c(1 << f.bits);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(i);
  return c;
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace

TEST(Lowp, DecodeEveryCode) {
  for (const auto& f : kSpecs) {
    auto codes = all_codes(f);
    auto got = decode(f, codes);
    for (size_t c = 0; c < codes.size(); ++c)
      EXPECT_TRUE(same_value(got[c], ref_value(f, static_cast<int>(c))))
          << f.name << " code " << c << ": " << got[c] << " vs " << ref_value(f, static_cast<int>(c));
  }
}

TEST(Lowp, EveryCodeRoundTrips) {
  for (const auto& f : kSpecs) {
    auto codes = all_codes(f);
    auto vals = decode(f, codes);
    for (bool saturate : {false, true}) {
      auto back = encode(f, vals, saturate);
      for (size_t c = 0; c < codes.size(); ++c) {
        double v = ref_value(f, static_cast<int>(c));
        if (std::isnan(v)) {  // any NaN code comes back as a NaN code
          EXPECT_TRUE(std::isnan(ref_value(f, back[c]))) << f.name << " code " << c;
        } else if (std::isinf(v) && saturate) {  // Inf saturates to the largest finite value
          EXPECT_EQ(back[c], (c & 0x80) | 0x7B) << f.name << " code " << c;
        } else if (v == 0 && !f.neg_zero) {
          EXPECT_EQ(back[c], 0) << f.name << " code " << c;
        } else {
          EXPECT_EQ(back[c], c) << f.name << " code " << c << " value " << v;
        }
      }
    }
  }
}

// The hard cases: every midpoint between neighbouring values and the float32 numbers just
// around it, each value itself, both signs; then a sweep over the float32 bit space.
TEST(Lowp, EncodeMatchesNearestEven) {
  for (const auto& f : kSpecs) {
    std::vector<float> xs;
    auto vals = positive_values(f);
    const double step = std::pow(2.0, std::floor(std::log2(vals.back().v)) - f.m);
    vals.push_back({vals.back().v + step, -1});  // the first value past the range
    for (size_t i = 0; i < vals.size(); ++i) {
      auto v = static_cast<float>(vals[i].v);
      for (float p : {v, std::nextafter(v, 0.f), std::nextafter(v, INFINITY)}) xs.push_back(p);
      if (i + 1 < vals.size()) {
        auto mid = static_cast<float>((vals[i].v + vals[i + 1].v) / 2);
        for (float p : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) xs.push_back(p);
      }
    }
    for (float p : {0.f, 1e-30f, 1e-45f, 3e38f, INFINITY, NAN, 1e6f, 65536.f}) xs.push_back(p);
    for (uint64_t b = 0; b < (uint64_t{1} << 31); b += 40009) {  // ~54k patterns, odd stride
      uint32_t bits = static_cast<uint32_t>(b);
      float p;
      std::memcpy(&p, &bits, 4);
      xs.push_back(p);
    }
    const size_t n = xs.size();
    for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
    const auto table = positive_values(f);
    for (bool saturate : {false, true}) {
      auto got = encode(f, xs, saturate);
      int bad = 0;
      for (size_t i = 0; i < xs.size() && bad < 10; ++i) {
        int want = ref_encode(f, table, xs[i], saturate);
        if (got[i] != want) {
          ++bad;
          ADD_FAILURE() << f.name << (saturate ? " saturate" : "") << " x=" << xs[i]
                        << " got " << int(got[i]) << " want " << want;
        }
      }
    }
  }
}

// float64 -> float8 must round once: 1.0625 + 2^-40 lies just above the midpoint of 1 and
// 1.125 (e4m3), but float32 rounds it onto the midpoint, where ties-to-even would pick 1.
TEST(Lowp, Float64RoundsOnce) {
  const std::vector<double> xs = {1.0625 + std::ldexp(1.0, -40), 1.0625 - std::ldexp(1.0, -40),
                                  1.0625, -(1.0625 + std::ldexp(1.0, -40)), 1e300, -1e300};
  auto in = mx::array(xs.data(), {static_cast<int>(xs.size())}, mx::float64);
  auto out = lowp::convert(in, DType::Float64, DType::Float8E4M3FN, true, cpu());
  out.eval();
  const std::vector<uint8_t> want = {0x39, 0x38, 0x38, 0xB9, 0x7E, 0xFE};  // 1.125, 1, 1, ...
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out.data<uint8_t>()[i], want[i]) << xs[i];
}

TEST(Lowp, IntegersWrapToFourBits) {
  std::vector<int32_t> v;
  for (int i = -40; i <= 40; ++i) v.push_back(i);
  v.push_back(INT32_MAX);
  v.push_back(INT32_MIN);
  auto in = mx::array(v.data(), {static_cast<int>(v.size())}, mx::int32);
  for (auto [st, ut, mod] : {std::tuple{DType::Int4, DType::UInt4, 16}, {DType::Int2, DType::UInt2, 4}}) {
    auto sv = lowp::wrap_int(in, st, cpu());
    auto uv = lowp::wrap_int(in, ut, cpu());
    mx::eval({sv, uv});
    ASSERT_EQ(sv.dtype(), mx::int8);
    ASSERT_EQ(uv.dtype(), mx::uint8);
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t r = ((static_cast<int64_t>(v[i]) % mod) + mod) % mod;  // v mod 2^bits, >= 0
      EXPECT_EQ(uv.data<uint8_t>()[i], r) << v[i];
      EXPECT_EQ(sv.data<int8_t>()[i], r >= mod / 2 ? r - mod : r) << v[i];
    }
  }
}

// 2-bit: four per byte, element 4k in the lowest two bits.
TEST(Lowp, PackUnpackTwoBit) {
  const uint8_t packed[] = {0xE4, 0x0B};  // 0b11100100, 0b00001011: elements 0,1,2,3,3,2
  mx::Shape shape = {6};
  auto s2 = lowp::from_host(DType::Int2, shape, packed);
  auto u2 = lowp::from_host(DType::UInt2, shape, packed);
  mx::eval({s2, u2});
  const int8_t want_s[] = {0, 1, -2, -1, -1, -2};
  const uint8_t want_u[] = {0, 1, 2, 3, 3, 2};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(s2.data<int8_t>()[i], want_s[i]);
    EXPECT_EQ(u2.data<uint8_t>()[i], want_u[i]);
  }
  EXPECT_EQ(lowp::host_nbytes(DType::Int2, 6), 2u);
  EXPECT_EQ(lowp::host_nbytes(DType::UInt2, 8), 2u);
  EXPECT_EQ(lowp::host_nbytes(DType::UInt2, 9), 3u);
  uint8_t out[2] = {0xFF, 0xFF};
  lowp::to_host(s2, DType::Int2, out);
  EXPECT_EQ(out[0], packed[0]);
  EXPECT_EQ(out[1], packed[1]);  // the two unused fields are written as 0
}

// ORT's layout: element 2k in the low nibble of byte k; an odd count leaves the last high
// nibble unused (written as 0).
TEST(Lowp, PackUnpackFourBit) {
  const uint8_t packed[] = {0x21, 0xF8, 0x07};  // elements 1, 2, 8, 15, 7
  mx::Shape shape = {5};
  auto s4 = lowp::from_host(DType::Int4, shape, packed);
  auto u4 = lowp::from_host(DType::UInt4, shape, packed);
  mx::eval({s4, u4});
  const int8_t want_s[] = {1, 2, -8, -1, 7};
  const uint8_t want_u[] = {1, 2, 8, 15, 7};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(s4.data<int8_t>()[i], want_s[i]);
    EXPECT_EQ(u4.data<uint8_t>()[i], want_u[i]);
  }
  EXPECT_EQ(lowp::host_nbytes(DType::Int4, 5), 3u);
  for (auto t : {DType::Int4, DType::UInt4, DType::Float4E2M1}) {
    auto a = lowp::from_host(t, shape, packed);
    a.eval();
    uint8_t out[3] = {0xAA, 0xAA, 0xAA};
    lowp::to_host(a, t, out);
    EXPECT_EQ(std::vector<uint8_t>(out, out + 3), std::vector<uint8_t>(packed, packed + 3));
  }
  // float8 is one byte per element, copied as is.
  const uint8_t f8[] = {0x00, 0x7F, 0x80, 0xFF};
  auto a = lowp::from_host(DType::Float8E5M2, {4}, f8);
  a.eval();
  uint8_t out[4] = {};
  lowp::to_host(a, DType::Float8E5M2, out);
  EXPECT_EQ(std::memcmp(out, f8, 4), 0);
  // A storage array of the wrong dtype is refused rather than written out.
  auto wrong = mx::array({1.f, 2.f});
  wrong.eval();
  EXPECT_THROW(lowp::to_host(wrong, DType::Int4, out), std::logic_error);
}

// Cast routing: float8 -> float8 of another format, int4 <-> float, float -> int4 truncation.
TEST(Lowp, ConvertBetweenTypes) {
  auto s = cpu();
  // e5m2 0x3D = 1.25 -> e4m3fn 0x3A; e5m2 0x7C (Inf) -> e4m3fn saturates to 448 (0x7E).
  auto a = lowp::convert(mx::array({uint8_t{0x3D}, uint8_t{0x7C}}), DType::Float8E5M2,
                         DType::Float8E4M3FN, true, s);
  a.eval();
  EXPECT_EQ(a.data<uint8_t>()[0], 0x3A);
  EXPECT_EQ(a.data<uint8_t>()[1], 0x7E);
  auto b = lowp::convert(mx::array({-2.7f, 2.7f, 9.f, -9.f}), DType::Float32, DType::Int4, true, s);
  b.eval();
  const int8_t want_b[] = {-2, 2, -7, 7};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.data<int8_t>()[i], want_b[i]);
  auto c = lowp::convert(mx::array({int8_t{-8}, int8_t{7}}), DType::Int4, DType::Float16, true, s);
  c.eval();
  ASSERT_EQ(c.dtype(), mx::float16);
  EXPECT_EQ(static_cast<float>(c.data<mx::float16_t>()[0]), -8.f);
  EXPECT_EQ(static_cast<float>(c.data<mx::float16_t>()[1]), 7.f);
  // A float8 value must arrive in its byte storage.
  EXPECT_THROW(lowp::convert(mx::array({1.f}), DType::Float8E4M3FN, DType::Float32, true, s),
               ops::TranslateError);
}
