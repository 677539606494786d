// tensor_parallel.h — tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism
// (Korthikanti et al. 2022): cut every weight matrix over t ranks, not the batch. Include this header
// for the whole chapter.
//
// The idea. A Linear Y = X·Wᵀ (W [out, in]) can be cut two ways:
//   column parallel  rank i holds rows i of W, computes Y_i = X·W_iᵀ [B, T, out/t]: Y stays split
//   row parallel     rank i holds columns i of W, takes the split X_i, computes a partial X_i·W_iᵀ
//                    [B, T, out]; the sum over ranks is Y, and the bias is added once, after it
// Column then row needs nothing between them (GeLU and the attention heads act on a rank's own
// columns), so the two meet the rest of the model through two operators, each the other's transpose:
//   f  (enters a column layer)  forward: identity           backward: all-reduce
//   g  (leaves a row layer)     forward: all-reduce         backward: identity
// Sequence parallelism swaps f for an all-gather along T and g for a reduce-scatter along T: the
// same bytes (an all-reduce is a reduce-scatter then an all-gather), while the LayerNorms, dropouts
// and residual adds between the blocks' halves hold and compute only T/t rows.
//
//   one block on rank i of t; between the halves x is [B, T, C] (SP: [B, T/t, C], this rank's rows)
//
//     x ─ln_1─▶ f ─▶ c_attn_i ──▶ heads_i ──▶ c_proj_i ─▶ g ─▶ + b ─▶ + x ──▶ h
//                    [3C/t, C]    NH/t heads   [C, C/t]
//     h ─ln_2─▶ f ─▶ c_fc_i ─GeLU─▶ c_proj_i ─▶ g ─▶ + b ─▶ + h ──▶ out
//                    [4C/t, C]       [C, 4C/t]
//
//   around the blocks: wte cut by vocabulary rows (VocabParallelEmbedding, then g); the tied head
//   x·wte_iᵀ is column parallel (f after ln_f) and the cross-entropy is computed from its [B, T, Vp/t]
//   columns with 3 all-reduces of B·T numbers, never the whole [B, T, V] logits.
//
//   Nothing is rebuilt: the GPT's shard (nn::GPTShardSpec::with_tensor_parallel) holds rank i's slices
//   of the serial draw, and the communication is forward hooks on its own modules (linear.h).
//
// Bytes per block per training step, per rank (f32, S = 4·B·T·C bytes, ring collectives):
//   TP   forward 2 all-reduces (the g's), backward 2 (the f's): 4 · 2(t-1)/t · S = 8(t-1)/t · S
//   SP   forward 2 all-gathers + 2 reduce-scatters, backward the same: 8 · (t-1)/t · S, the same bytes
//   Around them: the embedding's g and the head's f (2 · 2(t-1)/t · S), the loss's 3 all-reduces of
//   4·B·T bytes; under SP also the partial LayerNorm and c_proj-bias gradients summed over tp.
//   Example (README, config B: B 8, T 128, C 256, 6 layers, t 2): 27,275,272 bytes a step, clipping's
//   8 included.
// Memory per rank: weights per block 12C²/t + 7C/t + 6C floats (the LayerNorms and the c_proj biases
//   are not cut), wte Vp·C/t (V padded to a multiple of t); activations per layer, Korthikanti's
//   sbh(10 + 24/t + 5as/(ht)) without SP and sbh(34 + 5as/h)/t with it (fp16 bytes; measured in f32
//   against the ledger in lesson 12).
//
// Read the files in this order:
//   1 mappings.h                 f, g and the SP pairs as autograd Functions, forward and backward side
//                                by side
//   2 linear.h                   the column- and row-parallel Linear: make_column_parallel /
//                                make_row_parallel, hooks on an nn::Linear holding its slice (the one
//                                implementation: the GPT, lesson 11 and the tests use it)
//   3 parallel_block.h           a GPT block: attention split by whole heads, the MLP
//   4 vocab.h                    the vocabulary cut: embedding and cross-entropy over vocabulary shards
//                                (the loss's per-row kernels: tensor/sliced_cross_entropy.h, either device)
//   5 tp_gpt.h                   the whole GPT on a tp group: placements, SP's partial gradients, the
//                                gathers back to the serial model's tensors
//   6 tensor_parallel_runner.h   TensorParallelRunner: what the Trainer runs for `train --tp N [--sp]`
//
// Lessons: lessons/11_tensor_parallel.cpp (f and g on the page, the head split, bytes, the vocabulary
//          cut, tp 2 == serial), lessons/12_sequence_parallel.cpp (SP: activation memory and bytes)
// Tests:   tests/parallel/tensor_parallel/test_tensor_parallel_ops.cpp (each piece against its serial meaning: gradchecks of
//          the mappings, column/row == serial Linear with and without SP, vocabulary cut),
//          tests/parallel/tensor_parallel/test_tensor_parallel.cpp (the GPT against serial: tp 2/3/4, SP, DP × TP, Trainer),
//          tests/parallel/nd/test_nd_parallel.cpp (tp composed with pp and cp)
// Bench:   bench/tensor_parallel.cpp
#pragma once
#include "parallel/tensor_parallel/linear.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/parallel_block.h"
#include "parallel/tensor_parallel/tensor_parallel_runner.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/tensor_parallel/vocab.h"
