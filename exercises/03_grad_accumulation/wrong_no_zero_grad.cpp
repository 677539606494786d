// exercises/03_grad_accumulation/wrong_no_zero_grad.cpp — a wrong accumulation: last step's gradients kept.
//
// A common mistake: weighting the micro-batches right but never dropping the gradients the previous
// step left in .grad. backward adds into .grad (that is what makes accumulation work), so the first
// micro-batch adds onto the old step's gradient and every step follows a mix of the last two. Clear
// them (model.zero_grad()) once, before the first micro-batch.
// expect: drop the old gradients (model.zero_grad()) before accumulating
#include <cstdint>

#include "exercises/grader.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise03 {

double predicted_first_micro_batch_weight() { return 3.0 / 36; }

double accumulate_gradients(nn::GPT& model, const Tensor& inputs, const Tensor& targets, int64_t micro_batches) {
  const int64_t B = inputs.size(0), M = micro_batches;
  SL_CHECK(M >= 1 && B % M == 0, B, " rows do not cut into ", M, " equal micro-batches");
  const double N = static_cast<double>(nn::counted_targets(targets));
  SL_CHECK(N > 0, "a batch with no counted target has no mean loss");
  // The mistake: no model.zero_grad() here, so the first backward adds onto last step's gradients.
  double loss = 0;
  for (int64_t i = 0, rows = B / M; i < M; ++i) {
    const Tensor micro_targets = targets.narrow(0, i * rows, rows);
    const double share = static_cast<double>(nn::counted_targets(micro_targets)) / N;
    const Tensor L_i = model.loss(inputs.narrow(0, i * rows, rows), micro_targets);
    mul(L_i, share).backward();
    loss += L_i.item() * share;
  }
  return loss;
}

}  // namespace exercise03
