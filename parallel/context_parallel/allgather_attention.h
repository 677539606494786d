// allgather_attention.h — the all-gather variant of context parallelism (Llama 3's choice):
// gather every rank's K/V, attend the local Q to all of it, reduce-scatter dK/dV in backward.
//
//   forward   all_gather(K), all_gather(V)   ──►   [cp blocks of K/V] on every rank
//             attend Q_r to block src = r, r-1, ..., r-cp+1 (the ring's order and its causal/zigzag
//             work table, sequence_shard.h), merging with the online softmax
//   backward  recompute each block with the final lse, dQ locally, dK/dV of every block into a
//             [cp blocks] buffer, reduce_scatter: rank r gets Σ over ranks of block r's gradients
//
//   Simpler than the ring (two collectives, no overlap to arrange) and the same arithmetic, but it
//   holds all T keys and values per layer (cp times the ring's K/V) and the gathered copies are
//   saved for backward. Bytes per layer per rank, blk = B·NH·(T/cp)·HS·4:
//     forward  2·blk·(cp-1) (all-gather of K and V)     backward  2·blk·(cp-1) (reduce-scatter of dK, dV)
//
//   Lesson: lessons/13_ring_attention.cpp   Tests: tests/parallel/context_parallel/test_context_parallel*.cpp
#pragma once
#include "parallel/comm/process_group.h"
#include "parallel/context_parallel/sequence_shard.h"

namespace sl::parallel {

// As ring_attention (ring_attention.h): same inputs, same output, other communication.
Tensor allgather_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                           const ProcessGroupPtr& group, double scale = 0);

}  // namespace sl::parallel
