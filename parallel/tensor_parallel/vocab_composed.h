// vocab_composed.h — the vocab-parallel cross-entropy (vocab.h) with its per-row math written as
// engine ops that run on CUDA (max, exp, log, sum, masked_fill, arange, cat): the path CUDA logits
// take. The three all-reduces (max, target logit, Σ exp) are the same as on the CPU path; only the
// loops over [N, Vs] become tensor ops. Targets are checked and turned into per-row target columns
// on the host (N numbers, not N·Vs).
//
//   off_target [N, real] = column - target_column   (exactly 0 only at a row's own target: the
//                          engine has no comparison op; columns are exact integers below 2^24 in f32)
//   xt = Σ_v masked_fill(x - m, off_target, 0)      dx = (exp(x - m)/S - [off_target == 0]) · g / count
//
// Also runs on CPU tensors (tests/parallel/context_parallel/test_chapter_ops_cuda.cpp compares it with the CPU loops).
// Internal to parallel/tensor_parallel.
#pragma once
#include "parallel/tensor_parallel/vocab.h"

namespace sl::parallel {

// As vocab_parallel_cross_entropy, on any device.
Tensor vocab_parallel_cross_entropy_composed(const Tensor& logits, const Tensor& targets, const VocabRange& range,
                                             const ProcessGroupPtr& group, int64_t ignore_index = kDefaultIgnoreIndex);

// Both paths' checks, before any communication (a bad target must not leave peers waiting): logits
// [..., range.rows], host_targets (CPU, i64) one per row and each in the vocabulary or ignore_index.
// Returns how many targets count (are not ignore_index).
int64_t check_vocab_targets(const Tensor& logits, const Tensor& host_targets, const VocabRange& range,
                            int64_t ignore_index);

}  // namespace sl::parallel
