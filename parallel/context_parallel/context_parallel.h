// context_parallel.h — the context-parallel chapter: cut the SEQUENCE over cp ranks. Every rank
// holds the whole model and T/cp tokens of every row; everything but attention is per token and
// runs on the local tokens unchanged, and attention gets the keys and values of the other shards
// by passing blocks around a ring (or gathering them all).
//
//   T = 8 tokens, cp = 2, zigzag balance (each rank gets a cheap and an expensive causal chunk):
//     rank 0: t0 t1 | t6 t7        rank 1: t2 t3 | t4 t5
//
//   ring attention, per layer (cp steps; K/V of one shard in flight while the rank computes):
//     step 0: Q_r · K_r, V_r       step 1: Q_r · K_{r-1}, V_{r-1}   …   merge the blocks by their
//     log-sum-exp (attention_block.h: FlashAttention's online softmax, exact)
//
//   Bytes per layer per rank: forward (cp-1)/cp of K and V ([B, T, C] each, 2·e·B·T·C·(cp-1)/cp with
//   e bytes per element: 4 in f32, 2 in bf16/fp16, where K and V travel in 16 bits), backward the same
//   plus dK, dV travelling back (f32 accumulators: 2·4·B·T·C per rank on the ring). Memory:
//   activations of T/cp tokens and one [T/cp]² score block at a time (the serial GPT holds [T]² per head).
//   Mixed precision: each block computes in f32, blocks merge in f32, and out, dQ, dK, dV are rounded
//   once to 16 bits: within one rounding of the serial 16-bit kernel's result.
//
//   Ulysses (ulysses_attention.h) cuts the HEADS instead, for attention only: all-to-all q, k, v from
//   [T/cp tokens × NH heads] to [T tokens × NH/cp heads], the serial causal attention, all-to-all back;
//   4·(cp-1)/cp of a rank's [B, T/cp, C] each way per layer, falling with cp, but cp <= NH. The hybrid
//   (USP) runs Ulysses over U ranks and the ring over cp/U.
//
//   Gradients: every parameter is replicated over cp; each rank's backward gives its tokens' part,
//   so they are SUMMED over cp after the backward (parallel/comm/flatten.h), before the
//   data-parallel average over dp.
//
// Read in this order:
//   sequence_shard.h          which tokens a rank holds (contiguous or zigzag), global positions
//   attention_block.h         one Q block against one K/V block, and the LSE merge (the math lives in
//                             the engine, tensor/attention.h: a blockwise kernel on the CPU, engine ops
//                             on CUDA; the chapter calls the same ops on either device)
//   ring_attention.h          the ring: K/V passed around, dK/dV back in backward
//   allgather_attention.h     the all-gather variant (Llama 3's)
//   ulysses_attention.h       Ulysses (all-to-all to a head cut) and hybrid USP (Ulysses inside, ring across)
//   cp_gpt.h                  apply_context_parallel: a GPT part's attention over a sequence shard;
//                             the variants' groups and the chapter's rules
//
//   Lesson: lessons/13_ring_attention.cpp
//   Tests: tests/parallel/context_parallel/test_context_parallel.cpp, tests/parallel/context_parallel/test_context_parallel_runner.cpp,
//   tests/parallel/context_parallel/test_ring_attention_16bit.cpp
#pragma once
#include "parallel/context_parallel/allgather_attention.h"
#include "parallel/context_parallel/attention_block.h"
#include "parallel/context_parallel/cp_gpt.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/sequence_shard.h"
#include "parallel/context_parallel/ulysses_attention.h"
