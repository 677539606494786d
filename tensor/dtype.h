// dtype.h — element types.
//
//   f32   float, the default            f64   double (gradcheck)
//   bf16  bfloat16 (8-bit exponent)     f16   IEEE half        (storage types: math runs in f32)
//   i32   int32 (ids, masks)            i64   int64 (ids)
//
// bf16 and f16 are stored as 16-bit patterns; every op converts them to float, computes, and rounds
// back (round-to-nearest-even), so "bf16 matmul" means bf16 inputs with f32 accumulation.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#ifdef __CUDACC__
#define SL_HOST_DEVICE __host__ __device__
#else
#define SL_HOST_DEVICE
#endif

namespace sl {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...
bool is_floating(DType dtype);        // f32, f64, bf16, f16
bool is_integer(DType dtype);         // i32, i64
inline bool is_16bit(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }  // the storage floats

// Converts between the 32-bit float and the 16-bit storage formats, shared by CPU and CUDA code.
SL_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
SL_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  SL_HOST_DEVICE bf16(float f) {  // NOLINT: implicit like a built-in float type
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    bits = static_cast<uint16_t>(u >> 16);
  }
  SL_HOST_DEVICE operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  SL_HOST_DEVICE f16(float f) {  // NOLINT
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) {
      bits = static_cast<uint16_t>(sign | 0x7e00u);
      return;
    }  // NaN
    if (abs >= 0x477ff000u) {
      bits = static_cast<uint16_t>(sign | 0x7c00u);
      return;
    }                         // overflow -> inf
    if (abs < 0x38800000u) {  // result is subnormal (or zero): shift the mantissa, round to even
      int shift = 126 - static_cast<int>(abs >> 23);  // value = mant * 2^(e-150), half = value * 2^24
      if (shift > 24) {
        bits = static_cast<uint16_t>(sign);
        return;
      }
      uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      uint32_t half = mant >> shift;
      uint32_t rest = mant & ((1u << shift) - 1);
      uint32_t midpoint = 1u << (shift - 1);
      if (rest > midpoint || (rest == midpoint && (half & 1u))) half++;
      bits = static_cast<uint16_t>(sign | half);
      return;
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
    bits = static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  SL_HOST_DEVICE operator float() const {
    uint32_t sign = (bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {                                                         // zero or subnormal: value = mant * 2^-24
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

// The C++ type behind each dtype, and the type its math runs in.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};

template <typename T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <>
struct compute_type<f16> {
  using type = float;
};
template <typename T>
using compute_t = typename compute_type<T>::type;

}  // namespace sl
