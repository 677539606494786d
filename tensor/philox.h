// philox.h — counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// A counter-based generator computes random number i directly as philox(key = seed, counter = i):
// no state is carried from one number to the next. So element (r, c) of a [R, C] random tensor is
// philox(seed, offset + r*C + c) whichever part of the tensor you generate, and a rank that owns
// rows [r0, r1) of a weight (ZeRO, tensor parallelism) can generate exactly its rows alone: they
// equal the same rows of the full tensor, byte for byte.
//
// Generator = (seed, offset). Each draw of a tensor of N elements reads counters
// [offset, offset + N) and then advances offset by N, also when only a region was generated, so
// every rank's generator stays in step. Each thread has its own default generator.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "tensor/dtype.h"

namespace sl {

// One Philox4x32-10 block: four 32-bit random words for a 64-bit counter and a 64-bit key.
SL_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;  // the Weyl key schedule
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// Uniform in [0, 1) with 24 random bits (every value exactly representable in float).
SL_HOST_DEVICE inline float philox_uniform(uint64_t counter, uint64_t key) {
  return static_cast<float>(philox4x32(counter, key)[0] >> 8) * (1.0f / 16777216.0f);
}

// Dropout's keep/drop draw, shared by dropout (tensor/ops/select.cpp) and the attention that drops
// probabilities it never stores (tensor/ops/flash_attention.cpp): element i of a draw that starts at
// counter `first` is kept iff word 0 of philox(first + i) >= threshold, threshold = ceil(p * 2^32).
// The threshold may be 2^32 (p within 2^-32 of 1), which keeps nothing, hence 64 bits.
inline uint64_t dropout_threshold(double p) { return static_cast<uint64_t>(std::ceil(p * 4294967296.0)); }
SL_HOST_DEVICE inline bool dropout_keeps(uint64_t counter, uint64_t key, uint64_t threshold) {
  return static_cast<uint64_t>(philox4x32(counter, key)[0]) >= threshold;
}

// Standard normal by Box-Muller on two of the four words (computed in double, then rounded).
double philox_normal(uint64_t counter, uint64_t key);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Reserves `count` counters: returns the first one and advances the offset past them.
  uint64_t advance(uint64_t count) {
    uint64_t first = offset_;
    offset_ += count;
    return first;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

Generator& default_generator();   // this thread's generator
void manual_seed(uint64_t seed);  // resets this thread's generator to (seed, offset 0)

}  // namespace sl
