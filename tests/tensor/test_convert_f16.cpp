// test_convert_f16.cpp — every f16 conversion path against IEEE 754 binary16 written out here from
// its definition, by value: the vectorised cpu::widen / cpu::narrow (their vector bodies and scalar
// tails), the scalar rule f16(float) / float(f16) of tensor/dtype.h, and the tensor casts.
//
// test_convert.cpp holds the vector bodies to the scalar rule; that alone cannot see a wrong scalar
// rule, and a portable build (ARCH=, no F16C) runs the scalar rule on every path, so there the
// comparison is of the rule with itself. The reference below shares no code with either: it builds
// a half's value from sign, exponent and mantissa, and rounds a float by dividing by the spacing of
// the halves around it (exact in double) and rounding the quotient to the nearest integer, ties to
// even.
//   * f16 -> f32: all 2^16 halves (zeros, subnormals, normals, infinities, NaNs);
//   * f32 -> f16: for every finite half, itself, the midpoint to the next half and one float ulp
//     either side of it (every rounding boundary, the overflow threshold among them), a strided sweep
//     over all float bit patterns, f32 subnormals, infinities and NaNs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/cpu/convert.h"
#include "tensor/ops.h"

namespace sl {
namespace {

// The value of a finite half: (-1)^s · 2^(e-15) · (1 + m/1024) for exponents 1..30, and
// (-1)^s · 2^-14 · m/1024 for exponent 0 (zero and the subnormals).
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double magnitude = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// The bits of the half whose value is v >= 0 (v must be one: a multiple of its spacing, <= 65504).
uint16_t half_bits_of(double v) {
  if (v < std::ldexp(1.0, -14)) return static_cast<uint16_t>(v / std::ldexp(1.0, -24));  // m · 2^-24
  int E = 0;
  const double m = std::frexp(v, &E);  // v = m · 2^E, m in [0.5, 1): v = 2^(E-1) · (1 + mantissa/1024)
  return static_cast<uint16_t>((E - 1 + 15) << 10 | static_cast<int>((2 * m - 1) * 1024));
}

// A half widened to float: exact, since 11 significant bits fit in a float's 24. A NaN stays a NaN
// with its sign and payload (the top of the float's mantissa), signalling or not: tensor/dtype.h
// widens it as it is.
uint32_t widen_reference(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  if ((h & 0x7c00) == 0x7c00) return sign | 0x7f800000u | static_cast<uint32_t>(h & 0x3ff) << 13;  // inf, NaN
  return float_bits(static_cast<float>(half_value(h)));
}

// A float rounded to a half: to nearest, ties to the even mantissa, subnormals below 2^-14, ±inf
// past the largest half (65504) once rounded, and a NaN kept as a quiet NaN of its sign (the payload
// is the implementation's choice in IEEE 754; tensor/dtype.h writes the canonical 0x7e00).
uint16_t narrow_reference(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7c00;
  // Halves in [2^(E-1), 2^E) lie 2^(E-11) apart (11 significant bits); below 2^-14 the subnormals
  // keep the spacing 2^-24. Dividing by a power of two is exact, so n's fraction is the exact one.
  int E = 0;
  std::frexp(a, &E);
  const double spacing = std::ldexp(1.0, std::max(E - 11, -24));
  const double n = a / spacing;
  double k = std::floor(n);
  const double fraction = n - k;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(k, 2.0) == 1.0)) k += 1;
  const double rounded = k * spacing;
  if (rounded > 65504.0) return sign | 0x7c00;
  return sign | half_bits_of(rounded);
}

// The reference against hand-worked values: if it were wrong, every comparison below would be too.
TEST(ConvertF16Reference, AgreesWithHandWorkedHalves) {
  EXPECT_EQ(narrow_reference(1.0f), 0x3c00);
  EXPECT_EQ(narrow_reference(-2.0f), 0xc000);
  EXPECT_EQ(narrow_reference(65504.0f), 0x7bff);                // the largest half
  EXPECT_EQ(narrow_reference(65519.99f), 0x7bff);               // below halfway to 2^16
  EXPECT_EQ(narrow_reference(65520.0f), 0x7c00);                // halfway, 0x3ff odd: to even, which is inf
  EXPECT_EQ(narrow_reference(1.0f + 1.0f / 2048), 0x3c00);      // halfway 1 -> 1 + 2^-10: ties to even (down)
  EXPECT_EQ(narrow_reference(1.0f + 3.0f / 2048), 0x3c02);      // halfway from the odd 0x3c01: up
  EXPECT_EQ(narrow_reference(std::ldexp(1.0f, -24)), 0x0001);   // the smallest subnormal
  EXPECT_EQ(narrow_reference(std::ldexp(1.0f, -25)), 0x0000);   // half of it: ties to even, zero
  EXPECT_EQ(narrow_reference(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 of it: to even, 2
  EXPECT_EQ(narrow_reference(std::ldexp(1023.5f, -24)), 0x0400);  // the top subnormal's tie rounds to 2^-14
  EXPECT_EQ(narrow_reference(-0.0f), 0x8000);
  EXPECT_EQ(narrow_reference(bits_float(0xff800001u)), 0xfe00);  // a NaN stays a NaN, its sign kept
  EXPECT_EQ(bits_float(widen_reference(0x3555)), 0.333251953125f);
  EXPECT_EQ(bits_float(widen_reference(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(widen_reference(0xfc00), 0xff800000u);
}

// Every path of f16 -> f32, for all 2^16 halves, at offsets and lengths that leave vector tails.
TEST(ConvertF16, WideningEveryHalfMatchesTheDefinition) {
  std::vector<uint16_t> halves(1 << 16);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  for (size_t offset : {0, 1, 3})
    for (size_t trim : {0, 5}) {
      const size_t n = halves.size() - offset - trim;
      std::vector<float> vectorised(n);
      cpu::widen(reinterpret_cast<const f16*>(halves.data() + offset), vectorised.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(float_bits(vectorised[i]), widen_reference(halves[offset + i]))
            << "cpu::widen, half 0x" << std::hex << halves[offset + i] << " at offset " << std::dec << offset;
    }
  Tensor t = Tensor::empty({static_cast<int64_t>(halves.size())}, TensorOptions{DType::f16});
  std::copy(halves.begin(), halves.end(), reinterpret_cast<uint16_t*>(t.data<f16>()));
  const Tensor cast = t.to(DType::f32);
  for (size_t i = 0; i < halves.size(); ++i) {
    f16 h;
    h.bits = halves[i];
    ASSERT_EQ(float_bits(static_cast<float>(h)), widen_reference(h.bits)) << "float(f16), half 0x" << std::hex << h.bits;
    ASSERT_EQ(float_bits(cast.data<float>()[i]), widen_reference(h.bits)) << "to(f32), half 0x" << std::hex << h.bits;
  }
}

// Floats where rounding to a half is decided, and a spread of all the others.
std::vector<float> rounding_sweep() {
  std::vector<float> floats;
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half >= 0, and the midpoint to the next
    const double here = half_value(static_cast<uint16_t>(h));
    const double next = h == 0x7bff ? 65536.0 : half_value(static_cast<uint16_t>(h + 1));  // 65536: overflow
    const float midpoint = static_cast<float>((here + next) / 2);                         // exact in a float
    for (float x : {static_cast<float>(here), std::nextafter(midpoint, 0.0f), midpoint,
                    std::nextafter(midpoint, 1e30f)})
      floats.insert(floats.end(), {x, -x});
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) floats.push_back(bits_float(static_cast<uint32_t>(bits)));
  for (uint32_t bits : {1u, 0x007fffffu, 0x80000001u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                        0x7f800001u, 0xffc00001u, 0x7fbfffffu, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u})
    floats.push_back(bits_float(bits));
  return floats;
}

// Every path of f32 -> f16 over the sweep: cpu::narrow at offsets (vector bodies and tails), the
// scalar rule, and the tensor cast.
TEST(ConvertF16, NarrowingMatchesTheDefinitionAtEveryRoundingBoundary) {
  const std::vector<float> floats = rounding_sweep();
  std::vector<uint16_t> want(floats.size());
  for (size_t i = 0; i < floats.size(); ++i) want[i] = narrow_reference(floats[i]);
  for (size_t offset : {0, 1, 3})
    for (size_t trim : {0, 7}) {
      const size_t n = floats.size() - offset - trim;
      std::vector<f16> vectorised(n);
      cpu::narrow(floats.data() + offset, vectorised.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(vectorised[i].bits, want[offset + i])
            << "cpu::narrow, float 0x" << std::hex << float_bits(floats[offset + i]) << " (" << floats[offset + i]
            << ") at offset " << std::dec << offset;
    }
  Tensor x = Tensor::empty({static_cast<int64_t>(floats.size())}, TensorOptions{DType::f32});
  std::copy(floats.begin(), floats.end(), x.data<float>());
  const Tensor cast = x.to(DType::f16);
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(f16(floats[i]).bits, want[i]) << "f16(float), float 0x" << std::hex << float_bits(floats[i]) << " ("
                                            << floats[i] << ")";
    ASSERT_EQ(cast.data<f16>()[i].bits, want[i]) << "to(f16), float 0x" << std::hex << float_bits(floats[i]);
  }
}

}  // namespace
}  // namespace sl
