// exercises/15_vocab_parallel_ce/student.cpp — cross-entropy over a vocabulary cut across tp ranks.
//
// The tied head gives rank r the logits of its vocabulary slice only: logits [N, Vs] (N = B·T rows,
// Vs = V/tp columns), the columns of ids [start, start + Vs) with start = r·Vs. No rank may ever hold
// the [N, V] logits (that is the memory the cut saves), yet the loss must equal the serial one:
//
//   loss = mean over n of ( log Σ_v exp(x[n, v]) - x[n, target_n] )          (the serial cross-entropy)
//
// Three all-reduces of N numbers each build it (Megatron-LM's fused loss):
//   1. m[n] = max over ALL v of x[n, v]:  the max of my columns, all-reduce (ReduceOp::max)
//      (subtract it before exp: at logits of 1e3, exp(x) overflows f32 to inf)
//   2. xt[n] = x[n, target_n] - m[n]:  only the rank that OWNS target_n (start <= target_n < start + Vs)
//      knows it; the others contribute 0; all-reduce (sum)
//   3. S[n] = Σ over ALL v of exp(x[n, v] - m[n]):  the sum over my columns, all-reduce (sum)
//   loss = Σ over counted n of ( log S[n] - xt[n] ) / count          a scalar, the same on every rank
//
// Padding: a row whose target is `ignore_index` (-100 by default, as in PyTorch; a tokenizer's pad id is
// another choice, inside the vocabulary) is not counted. The loss is the mean over the `count` rows
// whose target counts, exactly sl::cross_entropy(full_logits, targets, ignore_index); 0 when none
// count. Every row still takes part in the three all-reduces (every rank must make the same calls).
//
// Backward needs no communication: with softmax p = exp(x - m) / S (my columns of it),
//   dL/dx[n, v] = g · (p[n, v] - [v == target_n]) / count   on my columns; the one-hot only on the owner
//   dL/dx[n, v] = 0                                          on a row whose target is ignore_index
// where g is the gradient of the loss (grads[0], a scalar).
//
// Lesson 11 writes the forward of this loss on its page, for targets that all count. Here the
// targets carry padding, and the backward is yours too.
//
// Tools: sl::max(x, 1, /*keepdim=*/true), sl::sub, sl::exp, sl::sum(x, 1), sl::log, sl::div
// (tensor/ops.h); group->all_reduce(t, ReduceOp::max or ReduceOp::sum) works in place; plain loops over
// t.to_vector() and sl::from_vector(values, shape, {dtype, device}) are fine for the target column
// (targets are i64). Keep logits' dtype and device (logits.dtype(), logits.device()).
//
// Grade it:  make exercise N=15
#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise15 {

using sl::parallel::ProcessGroupPtr;

// PREDICT FIRST, before any code. GPT-2's padded vocabulary V = 50304 cut over tp 4 (12576 columns a
// rank), N = B·T = 12 rows. How many bytes does one rank send in the loss's forward? Replace the throw
// with your number; the grader runs the library's vocab-parallel loss and reads the ledger.
double predicted_forward_bytes_sent() { throw exercises::NotImplemented("predicted_forward_bytes_sent (predict first)"); }

struct VocabParallelCrossEntropy : sl::Function<VocabParallelCrossEntropy> {
  // logits [N, Vs] (this rank's columns), targets [N] i64 (ids in [0, V), or ignore_index),
  // vocab_start = r·Vs -> the mean loss over the counted targets, a one-element tensor, the same on every rank.
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& logits, const sl::Tensor& targets,
                            int64_t vocab_start, const ProcessGroupPtr& group, int64_t ignore_index) {
    // TODO: the three all-reduces above, then the loss over the counted rows. Save what backward needs
    // (the local softmax p [N, Vs], the targets; ctx.set("count", count) for a value).
    throw exercises::NotImplemented("VocabParallelCrossEntropy::forward");
  }
  // grads[0]: dL/dloss (one element) -> {dL/dlogits [N, Vs], no gradient for targets (sl::Tensor())}.
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    // TODO: (p - one_hot) · g / count on my columns; the one-hot only where I own the target; zero rows
    // where the target is ignore_index.
    throw exercises::NotImplemented("VocabParallelCrossEntropy::backward");
  }
};

sl::Tensor vocab_parallel_cross_entropy(const sl::Tensor& logits, const sl::Tensor& targets, int64_t vocab_start,
                                        const ProcessGroupPtr& group, int64_t ignore_index) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, group, ignore_index);
}

}  // namespace exercise15
