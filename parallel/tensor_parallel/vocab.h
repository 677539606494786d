// vocab.h — the vocabulary cut over tp ranks: VocabParallelEmbedding and vocab-parallel
// cross-entropy (Megatron-LM, Shoeybi et al. 2019, §3, "input embedding" and the fused loss).
//
//   wte [V, C] is cut by rows: rank r owns ids [r·V/t, (r+1)·V/t). V not divisible by t is padded
//   up to Vp (zero rows that no id reads and no logit counts), so every rank holds Vp/t rows.
//
//   Embedding:  rank r looks up only its ids; any other id reads row 0 and that row of the output
//               is zeroed (inside the graph, so row 0 gets no false gradient); g sums the ranks:
//                 ids [B, T] ──mask, clamp──▶ wte_r[ids'] [B, T, C] ──zero masked──▶ g ──▶ [B, T, C]
//
//   Cross-entropy on logits cut by columns (the tied head x·wte_rᵀ gives rank r its Vs = Vp/t
//   columns), with no rank ever holding [B, T, V]:
//                 m  = all-reduce max  ( max over my columns )              [B·T] values
//                 xt = all-reduce sum  ( x_target - m if I own the target )  [B·T]
//                 S  = all-reduce sum  ( Σ over my columns exp(x - m) )      [B·T]
//                 loss_n = log S - xt,   loss = Σ over counted n / count     (ignore_index: not counted)
//   Backward is local: dx = (exp(x - m)/S - [v == target]) · g / count on my columns; padding
//   columns (ids >= V) take no part in m, S or the gradient.
//   Bytes: 3 all-reduces of B·T floats; memory: the local logits [B·T, Vs] kept for backward.
//   The per-row math is the engine's (tensor/sliced_cross_entropy.h: row loops on the CPU, engine ops
//   on CUDA); this chapter adds the targets' columns, the three all-reduces and the autograd Function.
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel_ops.cpp (gradcheck, ×1e3 logits, -100, targets in every shard)
#pragma once
#include "nn/gpt.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

// The ids a rank owns: [start, start + rows) of the padded vocabulary, of which the first `real`
// are real (start + real <= V).
struct VocabRange {
  int64_t start = 0, rows = 0, real = 0;
  int64_t vocab = 0;  // V, the real vocabulary of every rank
  static VocabRange of(int64_t vocab_size, int rank, int size);
};

// weight [rows, C] (this rank's wte rows), ids [B, T] (i32/i64) -> [B, T, C] whole on every rank.
Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& ids, const VocabRange& range,
                                const ProcessGroupPtr& group);

// logits [..., rows] (this rank's columns), targets [...] (i32/i64, ignore_index skipped) -> the
// mean loss over counted targets (0 when none count), the same on every rank.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, const VocabRange& range,
                                    const ProcessGroupPtr& group, int64_t ignore_index = kDefaultIgnoreIndex);

}  // namespace sl::parallel
