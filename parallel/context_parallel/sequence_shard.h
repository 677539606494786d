// sequence_shard.h — which tokens a context-parallel rank holds, and which part of each K/V block
// its queries attend to under the causal mask.
//
//   contiguous (balance none): rank r holds tokens [r·T/cp, (r+1)·T/cp)
//   zigzag:                    the sequence is cut into 2·cp chunks; rank i holds chunks i and 2cp-1-i
//
//   T = 16, cp = 2           chunk:  0    1    2    3            causal work of Q (rows) against K/V
//     contiguous  rank 0   [ 0..7        ]                          contiguous       zigzag
//                 rank 1                [ 8..15      ]             K0   K1           K0    K1
//     zigzag      rank 0   [0..3]              [12..15]        Q0  ◺    ·        Q0  ◺▮   ·▮    (▮ = the
//                 rank 1        [4..7][8..11]                  Q1  ■    ◺        Q1  ■·   ◺     second half
//                                                              rank 0: 1 block   rank 0: ¾ + ½ block
//                                                              rank 1: 2 blocks  rank 1: ¾ + ½ block
//
// At ring step s a rank holds the K/V of rank src = (rank - s) mod cp and does one of:
//   src == rank                   causal over its own tokens (zigzag too: chunk i comes before chunk
//                                 2cp-1-i, so the local causal mask is the global one). Zigzag
//                                 computes it as three quarter blocks, leaving out the fourth (chunk
//                                 i's queries against chunk 2cp-1-i's keys, all in the future):
//                                 [i vs i causal] [2cp-1-i vs i full] [2cp-1-i vs 2cp-1-i causal]
//   contiguous, src < rank        every query against every key (mask none)
//   contiguous, src > rank        nothing: the block is wholly in the future (skip)
//   zigzag,     src < rank        every query against the FIRST half of K/V (chunk src; chunk
//                                 2cp-1-src is in the future of both local chunks)
//   zigzag,     src > rank        the SECOND half of Q (chunk 2cp-1-rank) against all of K/V
// With zigzag every rank does 3 causal-or-full quarter blocks plus cp-1 half blocks: the same work everywhere.
//
// Hybrid (USP, ulysses = U > 1): cp = U × R ranks, rank = ring index i · U + Ulysses index u. The
// sequence is first cut for a ring of R (chunks as above, over R), then each chunk into U equal
// pieces: rank (i, u) holds piece u of each of ring shard i's chunks. Ulysses' all-to-all over the U
// ranks of ring shard i gives each of them ring shard i's tokens in its local order (for some heads),
// and the ring runs over ring(). Plain Ulysses is R = 1: the whole sequence is one ring shard.
//
//   T = 16, cp = 4, U = 2, zigzag:   ring shard 0 = chunks 0, 3   ring shard 1 = chunks 1, 2
//     rank 0 (i 0, u 0): 0 1 | 12 13     rank 2 (i 1, u 0): 4 5 | 8 9
//     rank 1 (i 0, u 1): 2 3 | 14 15     rank 3 (i 1, u 1): 6 7 | 10 11
//
//   Tests: tests/parallel/context_parallel/test_context_parallel.cpp (positions, the work table, rejected lengths)
#pragma once
#include <string>
#include <vector>

#include "parallel/context_parallel/attention_block.h"
#include "tensor/tensor.h"

namespace sl::parallel {

enum class CpBalance { none, zigzag };
const char* cp_balance_name(CpBalance balance);

// One step's work: rows [q_begin, q_begin + q_len) of the local Q against rows
// [kv_begin, kv_begin + kv_len) of the K/V block held, with `mask`.
// `starts_rows`: the first block these query rows see (it sets their out and lse; later ones merge).
struct StepWork {
  BlockMask mask = BlockMask::skip;
  int64_t q_begin = 0, q_len = 0, kv_begin = 0, kv_len = 0;
  bool starts_rows = false;
};

struct SequenceShard {
  int cp = 1;    // every context-parallel rank: U × R
  int rank = 0;
  CpBalance balance = CpBalance::zigzag;
  int ulysses = 1;  // U: the Ulysses degree (1: ring or all-gather only; cp: Ulysses only)

  // The ring-level shard this rank's Ulysses group holds together: {R, rank / U, balance}.
  SequenceShard ring() const;
  int ulysses_rank() const { return rank % ulysses; }
  struct Piece {
    int64_t begin, length;  // global token positions [begin, begin + length)
  };
  std::vector<Piece> pieces(int64_t T) const;  // this rank's tokens, in local order

  // Throws sl::Error naming the values unless T splits: T % cp (contiguous), T % (2·cp) (zigzag).
  void check_length(int64_t T) const;
  int64_t local_length(int64_t T) const { return T / cp; }
  // The global positions of this rank's tokens, in local order: i64 [T / cp].
  Tensor positions(int64_t T) const;
  // x [B, T, ...] (whole sequence) -> this rank's tokens [B, T / cp, ...] (copies).
  Tensor take(const Tensor& x, int dim = 1) const;
  // What this rank's queries do against the K/V of rank `src`, with local length Tl: one block or,
  // on the zigzag diagonal, three. Empty: skipped. The ring's table: ulysses must be 1 (use ring()).
  std::vector<StepWork> work(int src, int64_t Tl) const;
};

// One block of a ring step on the forward pass: attends q's rows (the work's) to k/v's rows and
// merges the result into (out, lse), or starts those rows (work.starts_rows; out and lse
// [B, NH, Tl, HS] and [B, NH, Tl] are allocated by the first one).
void attend_step(const StepWork& work, const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out,
                 Tensor& lse);
// Its backward: adds into dq (the work's rows) and dk, dv (the work's K/V rows).
void attend_step_backward(const StepWork& work, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                          const Tensor& lse, const Tensor& delta, double scale, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv);

}  // namespace sl::parallel
