// exercises/03_grad_accumulation/student.cpp — gradient accumulation when micro-batches count
// different numbers of targets.
//
// One step over a batch of B rows of T tokens holds the activations of all B rows. Gradient
// accumulation cuts the rows into M micro-batches of B/M rows, runs forward + backward on each in
// turn (.grad adds up over the backwards) and steps once: the same gradient, 1/M of the activations.
//
// The loss is a mean over the COUNTED targets (nn::GPT::loss skips targets equal to the ignore
// index -100: padding, prompt tokens). With n_i counted targets in micro-batch i and N = Σ_i n_i:
//
//   the batch's loss  L = (Σ over every counted target of its loss) / N
//                       = Σ_i (n_i / N) · L_i            L_i: micro-batch i's mean over its n_i targets
//   so           grad L = Σ_i (n_i / N) · grad L_i       weight each micro-batch's backward by n_i / N
//
// NOT (1/M) · Σ_i L_i, the mean of the means: that is right only when every n_i is N/M, and otherwise
// gives the targets of a sparse micro-batch more say than those of a full one.
//
//   accumulate_gradients(model, inputs [B, T], targets [B, T], M):
//     1. B % M == 0, else throw sl::Error; N = the counted targets of the whole batch, N > 0 else
//        throw sl::Error (a batch with nothing to learn from has no mean);
//     2. drop the gradients of the previous step (they would add up with this one's);
//     3. for i in 0..M-1: rows [i·B/M, (i+1)·B/M) of inputs and targets ([B/M, T] each);
//          n_i = its counted targets;  L_i = model.loss(rows of inputs, rows of targets);
//          backward of L_i · n_i / N;  add L_i · n_i / N to the loss you report;
//     4. return the batch's mean loss L (the .grad of every parameter now holds grad L).
//
// The tools: model.zero_grad() (nn/module.h), x.size(0), x.narrow(0, start, length) (copies rows
// [start, start + length) of [B, T]), nn::counted_targets(targets) (nn/data.h), model.loss(inputs,
// targets) (a one-element tensor), sl::mul(t, scalar) (tensor/ops.h), t.backward(), t.item().
// SL_CHECK(cond, "message", values...) throws sl::Error (tensor/error.h). Do not call the library's
// run_micro_batches (parallel/runner/micro_batches.h): that is the answer.
//
// Grade it:  make exercise N=03
#include <cstdint>

#include "exercises/grader.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise03 {

// PREDICT FIRST, before any code. The grader's batch with ignored targets cut into M = 4 micro-batches
// counts 3, 7, 11 and 15 targets (N = 36). By what factor must micro-batch 1's mean loss (3 targets)
// be multiplied before its backward, so that its gradient is its share of the whole batch's?
// (The mean of the means would say 1/4.) Replace the throw with your number.
double predicted_first_micro_batch_weight() {
  throw exercises::NotImplemented("predicted_first_micro_batch_weight (predict first)");
}

// Leaves in every parameter's .grad the gradient of the batch's mean loss over its counted targets,
// computed over `micro_batches` micro-batches of equal rows; returns that mean loss.
double accumulate_gradients(nn::GPT& model, const Tensor& inputs, const Tensor& targets, int64_t micro_batches) {
  // TODO: check B % M and N > 0; zero the gradients; for each micro-batch: its rows, its counted
  // targets, its loss scaled by n_i / N, backward; return the weighted sum of the losses.
  throw exercises::NotImplemented("accumulate_gradients");
}

}  // namespace exercise03
