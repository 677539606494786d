// convert.h — whole arrays between f32 and the 16-bit storage formats, vectorised, bitwise equal to
// the scalar bf16(float) / f16(float) and their float() of tensor/dtype.h.
//
//   widen(in, out, n)    bf16/f16 [n] -> float [n]        (exact)
//   narrow(in, out, n)   float [n] -> bf16/f16 [n]        (round to nearest, ties to even)
//
// The instructions are chosen when the library is compiled (-march): AVX512-BF16's vcvtneps2bf16
// and AVX-512F's vcvtps2ph/vcvtph2ps, 16 floats at a time; AVX2 + F16C, 8 at a time; plain C++
// otherwise. Where the hardware and the scalar rule disagree (vcvtneps2bf16 flushes f32 subnormals
// to zero; F16C quiets a signalling half NaN and keeps a float NaN's payload, where f16(float)
// writes the canonical 0x7e00), that group of lanes takes the scalar rule, so every build rounds
// alike. tests/tensor/test_dtype.cpp compares both directions with the scalar rule over every 16-bit
// pattern and over floats around every rounding boundary.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace sl::cpu {

void widen(const bf16* in, float* out, int64_t n);
void widen(const f16* in, float* out, int64_t n);
void narrow(const float* in, bf16* out, int64_t n);
void narrow(const float* in, f16* out, int64_t n);

// Which instructions this build converts with: "avx512-bf16", "avx512", "avx2-f16c" or "scalar".
const char* conversion_isa();

// f16's scalar rule branches (NaN, overflow, subnormals: GCC reports "control flow in loop"), so an
// elementwise loop that converts each f16 element stays scalar, where bf16's vectorises. Such a loop
// runs on f32 chunks instead: body(a, b, out, count) on a and b (b may be null) widened, out narrowed.
inline constexpr int64_t kChunk = 256;
template <typename Body>
void in_f32_chunks(const f16* a, const f16* b, f16* out, int64_t n, Body body) {
  float a32[kChunk], b32[kChunk], out32[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t count = n - i < kChunk ? n - i : kChunk;
    widen(a + i, a32, count);
    if (b) widen(b + i, b32, count);
    body(a32, b32, out32, count);
    narrow(out32, out + i, count);
  }
}

}  // namespace sl::cpu
