// convert.cpp — the vectorised conversions of convert.h: one loop per direction and format, its
// vector body picked by the build's -march, the scalar rule of tensor/dtype.h for the tail and for
// any group of lanes the instruction would round differently.
#include "tensor/cpu/convert.h"

#if defined(__AVX2__) || defined(__AVX512F__)
// GCC 12 warns that the AVX-512 intrinsics' own _mm512_undefined_* placeholders "may be used
// uninitialized" once inlined (GCC bug 105593); they are never read.
#if !defined(__clang__)  // clang has no such warning (the sanitizer build compiles with it)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace sl::cpu {

namespace {

template <typename Half>
void widen_scalar(const Half* in, float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(in[i]);
}
template <typename Half>
void narrow_scalar(const float* in, Half* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = Half(in[i]);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr int64_t kWidth = 16;  // floats per vector
using Bits = __m512i;           // 16 float bit patterns

[[maybe_unused]] inline Bits load_bits(const float* p) { return _mm512_castps_si512(_mm512_loadu_ps(p)); }
// A half NaN whose quiet bit (0x200) is clear: the scalar rule keeps it signalling, vcvtph2ps quiets it.
inline bool any_signalling_half_nan(__m256i h) {
  const __m256i top = _mm256_and_si256(h, _mm256_set1_epi16(0x7e00));
  const __mmask16 nan_exponent = _mm256_cmpeq_epi16_mask(top, _mm256_set1_epi16(0x7c00));
  return (nan_exponent & _mm256_test_epi16_mask(h, _mm256_set1_epi16(0x3ff))) != 0;
}
inline bool any_nan(Bits u) {
  return _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
}
// bf16(float) in integers: (u + 0x7fff + lsb) >> 16, a NaN's top half with its quiet bit set.
inline __m256i bf16_bits(Bits u) {
  const Bits top = _mm512_srli_epi32(u, 16);
  const Bits lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
  const Bits rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const Bits quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
#elif defined(__AVX2__) && defined(__F16C__)
constexpr int64_t kWidth = 8;
using Bits = __m256i;

[[maybe_unused]] inline Bits load_bits(const float* p) { return _mm256_castps_si256(_mm256_loadu_ps(p)); }
inline bool any_signalling_half_nan(__m128i h) {
  const __m128i nan_exponent = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7e00)), _mm_set1_epi16(0x7c00));
  const __m128i no_mantissa = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x3ff)), _mm_setzero_si128());
  return _mm_movemask_epi8(_mm_andnot_si128(no_mantissa, nan_exponent)) != 0;
}
inline Bits nan_lanes(Bits u) {  // |u| > inf; a signed compare is right, |u| < 2^31
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
}
inline bool any_nan(Bits u) { return _mm256_movemask_epi8(nan_lanes(u)) != 0; }
inline __m128i bf16_bits(Bits u) {
  const Bits top = _mm256_srli_epi32(u, 16);
  const Bits lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
  const Bits rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const Bits quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
  const Bits r = _mm256_blendv_epi8(rounded, quiet, nan_lanes(u));
  // packus works within each 128-bit half: [r0..r3 r0..r3 | r4..r7 r4..r7]; keep quadwords 0 and 2.
  const Bits packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
#else
constexpr int64_t kWidth = 0;  // no vector body: the scalar rule throughout
#endif

}  // namespace

const char* conversion_isa() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
  return "avx512-bf16";
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return "avx512";
#elif defined(__AVX2__) && defined(__F16C__)
  return "avx2-f16c";
#else
  return "scalar";
#endif
}

void widen(const bf16* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; i + kWidth <= n; i += kWidth) {  // bits << 16, 16 at a time
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + kWidth <= n; i += kWidth) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
  widen_scalar(in, out, i, n);
}

void widen(const f16* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; i + kWidth <= n; i += kWidth) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    if (any_signalling_half_nan(h))
      widen_scalar(in, out, i, i + kWidth);
    else
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(h));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + kWidth <= n; i += kWidth) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    if (any_signalling_half_nan(h))
      widen_scalar(in, out, i, i + kWidth);
    else
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  widen_scalar(in, out, i, n);
}

void narrow(const float* in, bf16* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
  for (; i + kWidth <= n; i += kWidth) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const Bits u = _mm512_castps_si512(x);
    // vcvtneps2bf16 rounds to nearest even and quiets NaNs as bf16(float) does, but reads an f32
    // subnormal as zero: those lanes' group is rounded in integers instead.
    const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                                _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
    const __m256i bits = subnormal ? bf16_bits(u) : (__m256i)_mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bits);
  }
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; i + kWidth <= n; i += kWidth)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16_bits(load_bits(in + i)));
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + kWidth <= n; i += kWidth)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16_bits(load_bits(in + i)));
#endif
  narrow_scalar(in, out, i, n);
}

void narrow(const float* in, f16* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; i + kWidth <= n; i += kWidth) {  // vcvtps2ph keeps a NaN's payload; f16(float) writes 0x7e00
    const __m512 x = _mm512_loadu_ps(in + i);
    if (any_nan(_mm512_castps_si512(x)))
      narrow_scalar(in, out, i, i + kWidth);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtps_ph(x, kRound));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; i + kWidth <= n; i += kWidth) {
    const __m256 x = _mm256_loadu_ps(in + i);
    if (any_nan(_mm256_castps_si256(x)))
      narrow_scalar(in, out, i, i + kWidth);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(x, kRound));
  }
#endif
  narrow_scalar(in, out, i, n);
}

}  // namespace sl::cpu
