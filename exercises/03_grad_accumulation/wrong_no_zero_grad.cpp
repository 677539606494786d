// exercises/03_grad_accumulation/wrong_no_zero_grad.cpp — a wrong accumulation: last step's gradients kept.
//
// A common mistake: the sum and the division by N are right but the gradients the previous step
// left in .grad are never dropped. backward adds into .grad (that is what makes accumulation work),
// so the first micro-batch adds onto the old step's gradient and every step follows a mix of the
// last two. Clear them (model.zero_grad()) once, before the first micro-batch.
// expect: drop the old gradients (model.zero_grad()) before accumulating
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise03 {

using MicroBatchSource = std::function<std::optional<nn::Batch>()>;

double predicted_gradient_before_the_rescale() { return 36; }

double accumulate_gradients(nn::GPT& model, const MicroBatchSource& next_micro_batch) {
  // The mistake: no model.zero_grad() here, so the first backward adds onto last step's gradients.
  double loss_sum = 0, N = 0;
  while (std::optional<nn::Batch> batch = next_micro_batch()) {
    const double n_i = static_cast<double>(nn::counted_targets(batch->targets));
    const Tensor L_i = model.loss(batch->inputs, batch->targets);
    mul(L_i, n_i).backward();
    loss_sum += L_i.item() * n_i, N += n_i;
  }
  SL_CHECK(N > 0, "a batch with no counted target has no mean loss");
  NoGradGuard no_grad;
  for (const Tensor& p : model.parameters())
    if (p.grad().defined()) p.grad().mul_(1.0 / N);  // the old gradient, divided by N, is still in there
  return loss_sum / N;
}

}  // namespace exercise03
