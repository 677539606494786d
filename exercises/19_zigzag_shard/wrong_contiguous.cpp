// exercises/19_zigzag_shard/wrong_contiguous.cpp — a wrong zigzag_positions: the contiguous split.
//
// A common mistake: giving rank r the r-th slice of T/cp tokens, [r·T/cp, (r+1)·T/cp), as data
// parallelism cuts a batch. It is a valid shard, but under the causal mask the last rank's queries
// see almost every key and the first rank's almost none: rank cp-1 does about 2cp-1 times rank 0's
// work and every step waits for it. Zigzag pairs chunk r with chunk 2·cp-1-r to even that out.
// expect: the contiguous split [r·T/cp, (r+1)·T/cp)
#include <array>
#include <cstdint>
#include <vector>

#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace exercise19 {

double predicted_rank0_pairs() { return 64.0 * 65 / 2 / 4; }  // a fair share of T(T+1)/2

enum class PairWork { none, diagonal, all };

std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  SL_CHECK(T % (2 * cp) == 0, "T ", T, " does not split into 2·cp = ", 2 * cp, " chunks");
  const int64_t n = T / cp;
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < n; ++i) positions.push_back(rank * n + i);  // the mistake: one contiguous slice
  return positions;
}

sl::Tensor shard(const sl::Tensor& x, int cp, int rank) { throw exercises::NotImplemented("shard"); }

sl::Tensor unshard(const std::vector<sl::Tensor>& shards) { throw exercises::NotImplemented("unshard"); }

std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  throw exercises::NotImplemented("causal_pairs");
}

}  // namespace exercise19
