// The vectorised conversions (tensor/cpu/convert.h) against the scalar rule of tensor/dtype.h, bit for
// bit: every 16-bit pattern widened, and narrowed floats around every rounding boundary (ties, one
// ulp either side), NaNs with payloads (quiet and signalling, either sign), infinities, f32 and f16
// subnormals, fp16's overflow to inf, and random floats, at lengths and offsets that leave tails.
// Also f16 elementwise ops, which run on f32 chunks through them. bf16 is also checked against an
// independent rule here; f16's independent reference (IEEE 754 binary16 by value, which the scalar
// rule must match too) is test_convert_f16.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/cpu/convert.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

// bf16(float) written out again, independently: a branch for NaN, then the rounding.
uint16_t bf16_reference(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<uint16_t> every_16bit_pattern() {
  std::vector<uint16_t> patterns(1 << 16);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
  return patterns;
}

// Floats where rounding decides: for every exponent and sign, the halfway points of bf16 (bit 15)
// and of fp16 normals (bit 12) and subnormals (bits 13..23), one ulp either side, and odd/even
// neighbours; NaNs with payloads; fp16's largest value and its overflow threshold; random bits.
std::vector<float> boundary_floats() {
  std::vector<uint32_t> bits;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t exponent = 0; exponent < 256; ++exponent)
      for (uint32_t half_ulp = 1u << 11; half_ulp <= 1u << 22; half_ulp <<= 1)
        for (uint32_t odd : {0u, half_ulp << 1})
          for (int delta = -1; delta <= 1; ++delta)
            bits.push_back(sign | (exponent << 23) | (odd + half_ulp + static_cast<uint32_t>(delta)));
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffe000u, 0xffc00001u, 0xff800100u, 0x7f801000u})
    bits.push_back(nan);
  for (uint32_t special : {0x7f800000u, 0xff800000u, 0u, 0x80000000u, 1u, 0x807fffffu, 0x477fe000u, 0x477ff000u,
                           0x477fefffu, 0x477ff001u, 0xc77ff000u, 0x33800000u, 0x33000000u, 0x33000001u})
    bits.push_back(special);
  std::mt19937 random(22);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(random()));
  std::vector<float> floats(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) floats[i] = bits_float(bits[i]);
  return floats;
}

// Runs convert over [offset, offset + n) for offsets 0..3 and lengths that end mid-vector, so the
// scalar tails and unaligned loads are exercised.
template <typename Check>
void at_offsets(size_t size, Check check) {
  for (size_t offset = 0; offset < 4; ++offset)
    for (size_t trim : {size_t{0}, size_t{1}, size_t{7}, size_t{15}}) check(offset, size - offset - trim);
}

TEST(Convert, WidenMatchesTheScalarRuleOnEvery16BitPattern) {
  const std::vector<uint16_t> patterns = every_16bit_pattern();
  at_offsets(patterns.size(), [&](size_t offset, size_t n) {
    std::vector<float> from_bf16(n), from_f16(n);
    cpu::widen(reinterpret_cast<const bf16*>(patterns.data() + offset), from_bf16.data(), static_cast<int64_t>(n));
    cpu::widen(reinterpret_cast<const f16*>(patterns.data() + offset), from_f16.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      bf16 b;
      f16 h;
      b.bits = h.bits = patterns[offset + i];
      ASSERT_EQ(float_bits(from_bf16[i]), float_bits(static_cast<float>(b))) << "bf16 0x" << std::hex << b.bits;
      ASSERT_EQ(float_bits(from_f16[i]), float_bits(static_cast<float>(h))) << "f16 0x" << std::hex << h.bits;
    }
  });
}

TEST(Convert, NarrowMatchesTheScalarRuleAtEveryBoundary) {
  const std::vector<float> floats = boundary_floats();
  at_offsets(floats.size(), [&](size_t offset, size_t n) {
    std::vector<bf16> to_bf16(n);
    std::vector<f16> to_f16(n);
    cpu::narrow(floats.data() + offset, to_bf16.data(), static_cast<int64_t>(n));
    cpu::narrow(floats.data() + offset, to_f16.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const float x = floats[offset + i];
      ASSERT_EQ(to_bf16[i].bits, bf16(x).bits) << "float 0x" << std::hex << float_bits(x);
      ASSERT_EQ(to_bf16[i].bits, bf16_reference(x)) << "float 0x" << std::hex << float_bits(x);
      ASSERT_EQ(to_f16[i].bits, f16(x).bits) << "float 0x" << std::hex << float_bits(x);
    }
  });
}

TEST(Convert, TheScalarRuleKeepsItsEdgeCases) {
  EXPECT_EQ(f16(65504.0f).bits, 0x7bff);                        // the largest half
  EXPECT_EQ(f16(bits_float(0x477fefffu)).bits, 0x7bff);         // just under halfway to 2^16: rounds down
  EXPECT_EQ(f16(65520.0f).bits, 0x7c00);                        // halfway, 0x3ff is odd: ties up, to inf
  EXPECT_EQ(f16(bits_float(0x7f800001u)).bits, 0x7e00);         // every NaN is the canonical quiet NaN
  EXPECT_EQ(bf16(bits_float(0x7f800001u)).bits, 0x7fc0);        // bf16 keeps the top bits, quieted
  EXPECT_EQ(bf16(bits_float(0x00010000u)).bits, 0x0001);        // an f32 subnormal stays a bf16 subnormal
  EXPECT_EQ(f16(5.960464477539063e-08f).bits, 0x0001);          // the smallest f16 subnormal
  EXPECT_EQ(f16(2.9802322387695312e-08f).bits, 0x0000);         // half of it: ties to even, zero
  f16 signalling;
  signalling.bits = 0x7c01;
  EXPECT_EQ(float_bits(static_cast<float>(signalling)), 0x7f802000u);  // widened as it is, not quieted
}

TEST(Convert, TensorCastsUseTheSameRule) {
  const std::vector<float> floats = boundary_floats();
  Tensor x = Tensor::empty({static_cast<int64_t>(floats.size())}, TensorOptions{DType::f32});
  std::copy(floats.begin(), floats.end(), x.data<float>());
  Tensor as_bf16 = x.to(DType::bf16), as_f16 = x.to(DType::f16);
  Tensor back_bf16 = as_bf16.to(DType::f32), back_f16 = as_f16.to(DType::f32);
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(as_bf16.data<bf16>()[i].bits, bf16(floats[i]).bits) << i;
    ASSERT_EQ(as_f16.data<f16>()[i].bits, f16(floats[i]).bits) << i;
    ASSERT_EQ(float_bits(back_bf16.data<float>()[i]), float_bits(static_cast<float>(as_bf16.data<bf16>()[i]))) << i;
    ASSERT_EQ(float_bits(back_f16.data<float>()[i]), float_bits(static_cast<float>(as_f16.data<f16>()[i]))) << i;
  }
  EXPECT_TRUE(std::string(cpu::conversion_isa()).size() > 0);
}

// f16's elementwise loops run on f32 chunks (in_f32_chunks): each result is the f32 op on the widened
// operands, rounded once, bitwise, across chunk boundaries (n = 1000 is 3 chunks and a tail), for
// both operands walking, one of them a constant, and a unary op's forward and backward.
TEST(Convert, F16ElementwiseOpsAreTheF32OpsRoundedOnce) {
  Generator gen(9);
  Tensor a = randn({1000}, {}, &gen).to(DType::f16), b = randn({1000}, {}, &gen).to(DType::f16);
  auto same = [](const Tensor& half, const Tensor& single) {
    EXPECT_EQ(half.dtype(), DType::f16);
    EXPECT_EQ(half.to(DType::f64).to_vector(), single.to(DType::f16).to(DType::f64).to_vector());
  };
  const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
  same(add(a, b), add(a32, b32));
  same(mul(a, 0.25), mul(a32, 0.25));
  same(sub(a, b.narrow(0, 0, 1)), sub(a32, b32.narrow(0, 0, 1)));
  same(sub(a.narrow(0, 0, 1), b), sub(a32.narrow(0, 0, 1), b32));
  same(gelu(a), gelu(a32));
  Tensor x = a.detach().set_requires_grad(), x32 = a32.detach().set_requires_grad();
  gelu(x).backward(b);
  gelu(x32).backward(b32);
  same(x.grad(), x32.grad());
}

}  // namespace
}  // namespace sl
