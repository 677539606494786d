// exercises/19_zigzag_shard/wrong_contiguous.cpp — a wrong shard: the contiguous split.
//
// A common mistake: giving rank r the r-th slice of T/cp tokens, [r·T/cp, (r+1)·T/cp), as data
// parallelism cuts a batch, in the owner map, the shard and the unshard alike. It is a valid shard,
// but under the causal mask the last rank's queries see almost every key and the first rank's almost
// none: rank cp-1 does about 2cp-1 times rank 0's work and every step waits for it. Zigzag pairs
// chunk r with chunk 2·cp-1-r to even that out.
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

struct Owner {
  int rank = 0;
  int64_t local = 0;
};

Owner zigzag_owner(int64_t T, int cp, int64_t position) {
  SL_CHECK(cp >= 1 && T % (2 * cp) == 0, "zigzag: T ", T, " is not divisible by 2·cp = ", 2 * cp);
  SL_CHECK(position >= 0 && position < T, "zigzag: position ", position, " is not in [0, ", T, ")");
  const int64_t local_length = T / cp;  // the mistake: contiguous slices
  return {static_cast<int>(position / local_length), position % local_length};
}

sl::Tensor shard(const sl::Tensor& x, int dim, int cp, int rank) {
  const int64_t T = x.size(dim);
  SL_CHECK(T % (2 * cp) == 0, "zigzag: T ", T, " is not divisible by 2·cp = ", 2 * cp);
  return x.narrow(dim, rank * (T / cp), T / cp);  // the mistake: contiguous slices
}

sl::Tensor unshard(const std::vector<sl::Tensor>& shards, int dim) {
  return sl::cat(shards, dim);  // contiguous slices join in rank order
}

std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  const int q_chunk[2] = {q_rank, 2 * cp - 1 - q_rank}, k_chunk[2] = {kv_rank, 2 * cp - 1 - kv_rank};
  std::array<std::array<PairWork, 2>, 2> pairs{};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      pairs[a][b] = k_chunk[b] < q_chunk[a] ? PairWork::all : k_chunk[b] == q_chunk[a] ? PairWork::diagonal : PairWork::none;
  return pairs;
}

}  // namespace exercise19
