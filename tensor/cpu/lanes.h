// lanes.h — row sums and maxima that the compiler can vectorize, in a fixed order.
//
// A plain `for (i) total += f(i)` stays scalar: float addition is not associative, so GCC may not
// reorder it into vector lanes (not without -ffast-math, which the project does not use). Written
// here with kLanes independent partial results, acc[j] = f(j) + f(j + 16) + f(j + 32) + ..., the
// reordering is ours and explicit: GCC turns the inner 16-wide loop into one zmm or two ymm
// operations, and f itself (exp_of, a product) is vectorized with it.
//
// The summation order is fixed by this code, not by the ISA: an AVX2, AVX-512 or portable build
// gives bitwise the same sums, and so the same losses.
//
//   lane_sum<C>(n, f)   sum of f(0) ... f(n-1) in compute type C
//   lane_max(n, f)      max of f(0) ... f(n-1) (float), -inf for n = 0
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/functors.h"

namespace sl {

inline constexpr int64_t kLanes = 16;  // one zmm of floats, two ymm: enough independent adds to hide latency

// The partial results are folded pairwise (8 + 8, 4 + 4, ...), which also halves the rounding
// error's growth compared with one running sum.
template <typename Acc, typename Combine>
inline Acc fold_lanes(Acc* acc, Combine combine) {
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t j = 0; j < width; ++j) acc[j] = combine(acc[j], acc[j + width]);
  return acc[0];
}

template <typename Compute, typename Value>
inline Compute lane_sum(int64_t n, Value&& value) {
  Compute acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += static_cast<Compute>(value(i + j));
  for (int64_t j = 0; i + j < n; ++j) acc[j] += static_cast<Compute>(value(i + j));  // the tail, lane by lane
  return fold_lanes<Compute>(acc, [](Compute a, Compute b) { return a + b; });
}

// The max over floats is taken on ordered_key (tensor/functors.h), an int that orders as the
// floats do: a float compare keeps the loop scalar on AVX2 (GCC's -ftrapping-math), an integer
// max is one instruction. A NaN with its sign bit clear is above every number and wins, one with
// it set loses; either way the softmax built on it is NaN on that row, as before. Doubles (used
// for gradient checks) take the plain loop.
template <typename Compute, typename Value>
inline Compute lane_max(int64_t n, Value&& value) {
  if constexpr (std::is_same_v<Compute, float>) {
    constexpr int32_t minus_inf_key = -0x7f800000 - 1;  // ordered_key(bits of -inf) = 0xff800000 ^ 0x7fffffff
    int32_t acc[kLanes];
    std::fill(acc, acc + kLanes, minus_inf_key);
    auto key_of = [&](int64_t i) { return ordered_key(float_bits(static_cast<float>(value(i)))); };
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) acc[j] = std::max(acc[j], key_of(i + j));
    for (int64_t j = 0; i + j < n; ++j) acc[j] = std::max(acc[j], key_of(i + j));
    const int32_t top = fold_lanes<int32_t>(acc, [](int32_t a, int32_t b) { return std::max(a, b); });
    return bits_float(static_cast<uint32_t>(ordered_key(static_cast<uint32_t>(top))));
  } else {
    Compute m = -std::numeric_limits<Compute>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<Compute>(value(i)));
    return m;
  }
}

}  // namespace sl
