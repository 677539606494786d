// exercises/19_zigzag_shard/wrong_pairs_no_diagonal.cpp — a wrong causal_pairs: the same chunk computed whole.
//
// A common mistake: "a key chunk at or before the query chunk is in the past", so a chunk against
// itself is computed with no mask. Inside one chunk a query must not see the keys after it: the
// chunk's own block needs the causal (diagonal) mask, or each token attends to its future and the
// model learns to copy the next token.
// expect: is diagonal, you said all
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
  const int cp = static_cast<int>(shards.size());
  const int64_t c = shards[0].size(dim) / 2;
  std::vector<sl::Tensor> chunks;  // chunk k: rank k's first half, or rank 2·cp-1-k's second
  for (int k = 0; k < 2 * cp; ++k)
    chunks.push_back(k < cp ? shards[static_cast<size_t>(k)].narrow(dim, 0, c) : shards[static_cast<size_t>(2 * cp - 1 - k)].narrow(dim, c, c));
  return sl::cat(chunks, dim);
}

std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  const int q_chunk[2] = {q_rank, 2 * cp - 1 - q_rank}, k_chunk[2] = {kv_rank, 2 * cp - 1 - kv_rank};
  std::array<std::array<PairWork, 2>, 2> pairs{};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      pairs[a][b] = k_chunk[b] <= q_chunk[a] ? PairWork::all : PairWork::none;  // the mistake: <= computed whole
  return pairs;
}

}  // namespace exercise19
