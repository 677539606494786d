// ulysses_attention.h — DeepSpeed-Ulysses (Jacobs et al., 2023): trade the sequence cut for a head
// cut around attention, with two all-to-alls, and hybrid USP (Fang and Zhao, 2024): Ulysses inside a
// group of U ranks, ring attention across the R groups.
//
//   Ulysses, cp = U = 2, NH = 4 heads (h0..h3), T = 8 tokens (t0..t7), contiguous shards:
//
//     before: rank 0  t0..t3 × h0 h1 h2 h3     all_to_all   rank 0  t0..t7 × h0 h1   causal attention
//             rank 1  t4..t7 × h0 h1 h2 h3     ─────────▶   rank 1  t0..t7 × h2 h3   over the WHOLE
//                                              (Q, K, V)                             sequence, NH/U heads
//     after:  the output all_to_all back: rank r again holds its tokens × every head, for c_proj.
//
//   Bytes per layer and rank: q, k, v and out are [B, T/cp, C] each, and an all-to-all keeps 1/U of
//   its input home, so forward sends 4·B·(T/cp)·C·(U-1)/U elements (DeepSpeed's 4Nh/P, N = B·T tokens,
//   h = C, P = cp, less the rank's own share) and receives as many; backward the same for dOut, dQ,
//   dK, dV. Unlike the ring's, a rank's bytes FALL as cp grows, but the heads bound the degree:
//   U <= NH (NH/tp under tensor parallelism), and U must divide it.
//   Memory: a rank holds q, k, v of the whole sequence for NH/U heads, as many bytes as its own
//   tokens for every head, and runs the serial GPT's causal attention on them (bit for bit).
//
//   Hybrid: U × R = cp ranks; rank = i·U + u. The all-to-all runs over the U ranks of ring shard i
//   (sequence_shard.h's hybrid layout), giving each rank ring shard i's tokens for NH/U heads; ring
//   attention then runs over the R ranks with the same u (the same heads), and the output goes back.
//   Bytes: Ulysses' 4·(U-1)/U of a rank's q, k, v, out, plus the ring's 2·(R-1) blocks of K/V of
//   B·(NH/U)·(T/R)·HS elements each.
//
//   Lesson: lessons/13_ring_attention.cpp ("ring or Ulysses")   Tests: tests/parallel/context_parallel/test_ulysses.cpp
#pragma once
#include "parallel/comm/process_group.h"
#include "parallel/context_parallel/sequence_shard.h"

namespace sl::parallel {

// x [B, NH, T/cp, HS], this rank's tokens of every head -> [B, NH/U, T/R, HS], every token of ring
// shard shard.ring() (in its local order) for head group u = ulysses_group->rank(). Differentiable
// (backward: heads_to_sequence of the gradient). Collective over ulysses_group (size shard.ulysses).
Tensor sequence_to_heads(const Tensor& x, const SequenceShard& shard, const ProcessGroupPtr& ulysses_group);
// The inverse: y [B, NH/U, T/R, HS] -> [B, NH, T/cp, HS].
Tensor heads_to_sequence(const Tensor& y, const SequenceShard& shard, const ProcessGroupPtr& ulysses_group);

// q, k, v [B, NH, T/cp, HS] -> out [B, NH, T/cp, HS]: Ulysses over ulysses_group, and (shard.ulysses <
// shard.cp) ring attention over ring_group between the two all-to-alls. Differentiable; NH must
// divide by shard.ulysses (refused naming both). scale <= 0: 1/sqrt(HS).
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                         const ProcessGroupPtr& ulysses_group, const ProcessGroupPtr& ring_group);

}  // namespace sl::parallel
