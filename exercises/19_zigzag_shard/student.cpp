// exercises/19_zigzag_shard/student.cpp — the zigzag sequence shard of context parallelism.
//
// cp ranks share one sequence of T tokens. Cut it into 2·cp chunks of c = T / (2·cp) tokens:
//
//   T = 16, cp = 2, c = 4     chunk:  0        1        2          3
//                                    [0..3]   [4..7]   [8..11]    [12..15]
//   rank 0 holds chunks 0 and 3:     [0..3]                       [12..15]   local order: chunk 0, chunk 3
//   rank 1 holds chunks 1 and 2:              [4..7]   [8..11]
//
// rank r holds chunk r, then chunk 2·cp-1-r: T/cp tokens. Why not simply [r·T/cp, (r+1)·T/cp)? Under the
// causal mask (query i sees key j iff j <= i) the contiguous split gives rank 0 one triangle of work
// and rank cp-1 a triangle plus cp-1 full blocks: everyone waits for the last rank. Pairing an early
// chunk with a late one gives every rank the same work.
//
// Which pairs of chunks a query rank computes against the K/V of a rank it receives (ring attention):
//   key chunk <  query chunk   all   every key is in the past
//   key chunk == query chunk   diagonal   the causal triangle (key j <= query i inside the chunk)
//   key chunk >  query chunk   none  every key is in the future: skip it
//
// Lesson 13 writes the positions a rank holds on its page; they are given below. Yours is the rest: the
// inverse map (which rank, and where in it, holds position p), the shard and its inverse along any
// dimension (attention's tensors are [B, NH, T, HS], the sequence at dim 2), and the causal rule per
// chunk pair. The grader gathers the library's ring attention's gradients with your unshard and holds
// them to the serial attention's.
//
// The tools: x.size(dim) is T; x.narrow(dim, start, length) copies tokens [start, start + length) along
// dim; sl::cat({a, b, ...}, dim) joins along it (tensor/ops.h). SL_CHECK(cond, "message", values...)
// throws sl::Error (tensor/error.h). Do not call the library's SequenceShard: that is the answer.
//
// Grade it:  make exercise N=19
#include <array>
#include <cstdint>
#include <vector>

#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace exercise19 {

// PREDICT FIRST, before any code. Causal attention over T = 64 tokens, context parallel cp 4 with the
// zigzag shard. How many visible (query, key) pairs does rank 0 compute over all ring steps (a pair is
// visible when pos_k <= pos_q)? Replace the throw with your number; the grader counts the library's
// per-step work.
double predicted_rank0_pairs() { throw exercises::NotImplemented("predicted_rank0_pairs (predict first)"); }

// What a query chunk computes against a key chunk (the grader declares the same enum).
enum class PairWork { none, diagonal, all };

// Where a global position lives: on rank `rank`, at local index `local` (0 <= local < T / cp).
struct Owner {
  int rank = 0;
  int64_t local = 0;
};

// GIVEN (lesson 13's positions_on_page): the global positions of rank `rank`'s tokens, in local order,
// T / cp of them: chunk r's, then chunk 2·cp-1-r's.
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  SL_CHECK(cp >= 1 && T % (2 * cp) == 0, "zigzag: T ", T, " is not divisible by 2·cp = ", 2 * cp);
  const int64_t c = T / (2 * cp);
  std::vector<int64_t> positions;
  for (int64_t chunk : {int64_t(rank), int64_t(2 * cp - 1 - rank)})
    for (int64_t i = 0; i < c; ++i) positions.push_back(chunk * c + i);
  return positions;
}

// The inverse of zigzag_positions: the rank holding global position `position`, and its local index.
// Throws sl::Error unless T is divisible by 2·cp and 0 <= position < T.
Owner zigzag_owner(int64_t T, int cp, int64_t position) {
  // TODO: the chunk of `position`; its rank (chunk k < cp: rank k; else the mirror); where in the rank.
  throw exercises::NotImplemented("zigzag_owner");
}

// x, the whole sequence along `dim` (T = x.size(dim)) -> rank `rank`'s tokens, T / cp along `dim`,
// in local order. [B, T, C] with dim 1; q, k, v [B, NH, T, HS] with dim 2.
sl::Tensor shard(const sl::Tensor& x, int dim, int cp, int rank) {
  // TODO: two narrows along dim, joined.
  throw exercises::NotImplemented("shard");
}

// shards[r], rank r's tokens along `dim` (cp = shards.size()) -> the whole sequence in position order:
// the inverse of shard. An all-gather hands you the shards in rank order; this puts the tokens back.
sl::Tensor unshard(const std::vector<sl::Tensor>& shards, int dim) {
  // TODO: every chunk 0, 1, ..., 2·cp-1 from the rank that holds it.
  throw exercises::NotImplemented("unshard");
}

// pairs[a][b]: what query rank q_rank's chunk a (0: its first chunk, 1: its second) computes against
// key rank kv_rank's chunk b, under the causal mask.
std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  // TODO: the chunk numbers of both ranks, compared.
  throw exercises::NotImplemented("causal_pairs");
}

}  // namespace exercise19
