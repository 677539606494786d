// exercises/03_grad_accumulation/student.cpp — gradient accumulation when the batch's count of
// targets is known only after the last micro-batch.
//
// One step over a batch of B rows holds the activations of all B rows. Gradient accumulation runs
// forward + backward on one micro-batch at a time (.grad adds up over the backwards) and steps once.
//
// The loss is a mean over the COUNTED targets (nn::GPT::loss skips targets equal to the ignore
// index -100: padding, prompt tokens). With n_i counted targets in micro-batch i and N = Σ_i n_i:
//
//   the batch's loss  L = (Σ over every counted target of its loss) / N
//                       = Σ_i (n_i / N) · L_i            L_i: micro-batch i's mean over its n_i targets
//
// Lesson 03 weights each backward by n_i / N, which needs N before the first backward. Here the
// micro-batches come from a loader that packs rows on demand into micro-batches of at most a token
// budget (so they hold different numbers of rows and of targets) and makes the next one only after
// this one's backward: N is known only once the loader says it is done. (Megatron-LM's per-token
// loss is in the same position: the count is summed, and all-reduced over data-parallel ranks,
// after the backwards.) So take the sum first and the mean last:
//
//   backward of L_i · n_i                  the SUM of micro-batch i's targets' losses (no N in it)
//   after the last backward               .grad = grad (Σ over all targets of their loss) = N · grad L
//   divide every .grad by N, once          .grad = grad L, the batch mean's gradient
//
//   accumulate_gradients(model, next_micro_batch):
//     1. drop the gradients of the previous step (they would add up with this one's);
//     2. while next_micro_batch() returns a batch (inputs, targets: [rows, T], rows vary):
//          n_i = its counted targets;  L_i = model.loss(inputs, targets);
//          backward of L_i · n_i;  add L_i · n_i to the loss sum, n_i to N;
//     3. N > 0, else throw sl::Error (a batch with nothing to learn from has no mean);
//        every parameter's .grad (where defined) times 1 / N, in place;
//     4. return the batch's mean loss, the loss sum / N.
//
// NOT backward of L_i and then .grad / M (the mean of the micro-batch means): right only when every
// n_i is N/M, and otherwise gives the targets of a sparse micro-batch more say than those of a full one.
//
// The tools: model.zero_grad() (nn/module.h), model.parameters(), p.grad() (may be undefined),
// p.grad().mul_(double) in place (inside a NoGradGuard, autograd/grad_mode.h), nn::counted_targets
// (nn/data.h), model.loss(inputs, targets) (a one-element tensor), sl::mul(t, double) (tensor/ops.h),
// t.backward(), t.item(). SL_CHECK(cond, "message", values...) throws sl::Error (tensor/error.h).
//
// Grade it:  make exercise N=03
#include <cstdint>
#include <functional>
#include <optional>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise03 {

// Returns the next micro-batch, or std::nullopt once the batch is done. Call it again only after
// the micro-batch it gave you has had its backward.
using MicroBatchSource = std::function<std::optional<nn::Batch>()>;

// PREDICT FIRST, before any code. The loader hands out 4 micro-batches counting 10, 11, 7 and 8
// targets. After the backward of L_i · n_i on each of them (before you divide), .grad holds how
// many times the gradient of the batch's mean loss? Replace the throw with your number.
double predicted_gradient_before_the_rescale() {
  throw exercises::NotImplemented("predicted_gradient_before_the_rescale (predict first)");
}

// Leaves in every parameter's .grad the gradient of the batch's mean loss over its counted targets,
// reading the batch one micro-batch at a time from next_micro_batch; returns that mean loss.
double accumulate_gradients(nn::GPT& model, const MicroBatchSource& next_micro_batch) {
  // TODO: zero the gradients; for each micro-batch: its counted targets, backward of its loss times
  // them, add up the loss sum and N; then check N > 0, divide every .grad by N, return the mean.
  throw exercises::NotImplemented("accumulate_gradients");
}

}  // namespace exercise03
