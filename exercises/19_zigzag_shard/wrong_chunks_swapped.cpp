// exercises/19_zigzag_shard/wrong_chunks_swapped.cpp — a wrong shard: the rank's two chunks in the wrong order.
//
// A common mistake: the right two chunks, joined late chunk first (chunk 2·cp-1-r, then chunk r).
// The tokens are the right ones, so the work is balanced, but local order matters: every rank's
// positions, its causal masks and the unshard that puts the sequence back assume chunk r comes
// first. A shard in another order than SequenceShard's attends with the wrong positions.
// expect: chunk 2·cp-1-r comes first
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

// x [B, T, C] -> this rank's two chunks along T, joined.
sl::Tensor shard(const sl::Tensor& x, int cp, int rank) {
  const int64_t c = x.size(1) / (2 * cp);
  const sl::Tensor early = x.narrow(1, rank * c, c), late = x.narrow(1, (2 * cp - 1 - rank) * c, c);
  return sl::cat({late, early}, 1);  // the mistake: chunk r belongs first
}

sl::Tensor unshard(const std::vector<sl::Tensor>& shards) { throw exercises::NotImplemented("unshard"); }

std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  throw exercises::NotImplemented("causal_pairs");
}

}  // namespace exercise19
