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
// The tools: x.size(1) is T; x.narrow(1, start, length) copies tokens [start, start + length) of
// [B, T, C]; sl::cat({a, b, ...}, 1) joins along T (tensor/ops.h). SL_CHECK(cond, "message", values...)
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

// The global positions of rank `rank`'s tokens, in local order: T / cp of them.
// Throws sl::Error (naming T and 2·cp) unless T is divisible by 2·cp.
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  // TODO: chunk r's positions, then chunk 2·cp-1-r's.
  throw exercises::NotImplemented("zigzag_positions");
}

// x [B, T, C] (the whole sequence) -> rank `rank`'s tokens [B, T / cp, C], in local order.
sl::Tensor shard(const sl::Tensor& x, int cp, int rank) {
  // TODO: two narrows along dim 1, joined.
  throw exercises::NotImplemented("shard");
}

// shards[r] [B, T / cp, C], one per rank (cp = shards.size()) -> the whole sequence [B, T, C].
sl::Tensor unshard(const std::vector<sl::Tensor>& shards) {
  // TODO: put every rank's two chunks back in chunk order 0, 1, ..., 2·cp-1.
  throw exercises::NotImplemented("unshard");
}

// pairs[a][b]: what query rank q_rank's chunk a (0: its first chunk, 1: its second) computes against
// key rank kv_rank's chunk b, under the causal mask.
std::array<std::array<PairWork, 2>, 2> causal_pairs(int cp, int q_rank, int kv_rank) {
  // TODO: the chunk numbers of both ranks, compared.
  throw exercises::NotImplemented("causal_pairs");
}

}  // namespace exercise19
