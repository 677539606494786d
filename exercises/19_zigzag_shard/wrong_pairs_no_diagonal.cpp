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
#include "tensor/ops.h"

namespace exercise19 {

double predicted_rank0_pairs() { return 64.0 * 65 / 2 / 4; }  // a fair share of T(T+1)/2

enum class PairWork { none, diagonal, all };

std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  throw exercises::NotImplemented("zigzag_positions");
}

sl::Tensor shard(const sl::Tensor& x, int cp, int rank) { throw exercises::NotImplemented("shard"); }

sl::Tensor unshard(const std::vector<sl::Tensor>& shards) { throw exercises::NotImplemented("unshard"); }

std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  const int q_chunk[2] = {q_rank, 2 * cp - 1 - q_rank}, k_chunk[2] = {kv_rank, 2 * cp - 1 - kv_rank};
  std::array<std::array<PairWork, 2>, 2> pairs{};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)  // the mistake: <= where the equal chunk needs the diagonal mask
      pairs[a][b] = k_chunk[b] <= q_chunk[a] ? PairWork::all : PairWork::none;
  return pairs;
}

}  // namespace exercise19
