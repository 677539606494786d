#include "tensor/philox.h"

#include <cmath>

namespace sl {

double philox_normal(uint64_t counter, uint64_t key) {
  std::array<uint32_t, 4> words = philox4x32(counter, key);
  // u1 in (0, 1] so that log(u1) is finite; u2 in [0, 1). 53 bits each from two words.
  uint64_t bits1 = (static_cast<uint64_t>(words[0]) << 21) ^ (words[1] >> 11);
  uint64_t bits2 = (static_cast<uint64_t>(words[2]) << 21) ^ (words[3] >> 11);
  double u1 = (static_cast<double>(bits1 & ((1ull << 53) - 1)) + 1.0) / 9007199254740992.0;
  double u2 = static_cast<double>(bits2 & ((1ull << 53) - 1)) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

namespace {
thread_local Generator tls_generator{0};
}

Generator& default_generator() { return tls_generator; }
void manual_seed(uint64_t seed) { tls_generator = Generator(seed); }

}  // namespace sl
