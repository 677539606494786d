// exercises/19_zigzag_shard/wrong_unshard_rank_order.cpp — a wrong unshard: the shards joined in rank order.
//
// A common mistake: an all-gather hands every rank the shards in rank order, and joining them as they
// come is the inverse of the contiguous split. Under zigzag it is not: rank 0's second chunk is the
// sequence's LAST chunk, and a gradient or a sequence gathered that way has its tokens out of place
// (the values are all there, so a sum or a norm does not show it).
// expect: joined the shards in rank order
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
  const int64_t c = T / (2 * cp), chunk = position / c, offset = position % c;
  if (chunk < cp) return {static_cast<int>(chunk), offset};  // rank `chunk`'s first chunk
  return {static_cast<int>(2 * cp - 1 - chunk), c + offset};  // the mirror rank's second chunk
}

sl::Tensor shard(const sl::Tensor& x, int dim, int cp, int rank) {
  const int64_t T = x.size(dim);
  SL_CHECK(T % (2 * cp) == 0, "zigzag: T ", T, " is not divisible by 2·cp = ", 2 * cp);
  const int64_t c = T / (2 * cp);
  return sl::cat({x.narrow(dim, rank * c, c), x.narrow(dim, (2 * cp - 1 - rank) * c, c)}, dim);
}

sl::Tensor unshard(const std::vector<sl::Tensor>& shards, int dim) {
  return sl::cat(shards, dim);  // the mistake: rank order is not position order under zigzag
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
