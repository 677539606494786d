// exercises/03_grad_accumulation/wrong_mean_of_means.cpp — a wrong accumulation: the mean loss of each
// micro-batch, and .grad divided by the number of micro-batches.
//
// A common mistake: backward of each micro-batch's MEAN loss, then every .grad divided by M, the
// number of micro-batches the loader gave (the textbook 1/M recipe, with M counted after the fact).
// It averages the micro-batches' MEANS, which equals the batch mean only when every micro-batch
// counts the same number of targets. Packed to a token budget, with ignored prompt tokens, they do
// not: a micro-batch of 4 counted targets gets the same say as one of 8. Backpropagate L_i · n_i and
// divide by N.
// expect: MEAN OF THE MICRO-BATCH MEANS
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
  model.zero_grad();
  double loss = 0;
  int64_t M = 0, N = 0;
  while (std::optional<nn::Batch> batch = next_micro_batch()) {
    const Tensor L_i = model.loss(batch->inputs, batch->targets);
    L_i.backward();  // the mistake: the mean, where L_i · n_i weighs each target once
    loss += L_i.item(), ++M, N += nn::counted_targets(batch->targets);
  }
  SL_CHECK(N > 0, "a batch with no counted target has no mean loss");
  NoGradGuard no_grad;
  for (const Tensor& p : model.parameters())
    if (p.grad().defined()) p.grad().mul_(1.0 / static_cast<double>(M));
  return loss / static_cast<double>(M);
}

}  // namespace exercise03
