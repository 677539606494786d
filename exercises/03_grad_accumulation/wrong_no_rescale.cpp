// exercises/03_grad_accumulation/wrong_no_rescale.cpp — a wrong accumulation: the sum, never divided by N.
//
// A common mistake: backward of each micro-batch's sum loss L_i · n_i, as the rule says, and the
// reported loss divided by N, but the gradients left as they are. .grad then holds the gradient of
// the SUM over the batch's targets, N times the mean's: the optimizer steps N times too far (SGD),
// clipping cuts nearly every step, and the step size changes with the batch's count of targets.
// Divide every .grad by N once the loader is done.
// expect: .grad holds the gradient of the SUM over the counted targets
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
  double loss_sum = 0, N = 0;
  while (std::optional<nn::Batch> batch = next_micro_batch()) {
    const double n_i = static_cast<double>(nn::counted_targets(batch->targets));
    const Tensor L_i = model.loss(batch->inputs, batch->targets);
    mul(L_i, n_i).backward();
    loss_sum += L_i.item() * n_i, N += n_i;
  }
  SL_CHECK(N > 0, "a batch with no counted target has no mean loss");
  return loss_sum / N;  // the mistake: the loss is divided by N, every .grad is not
}

}  // namespace exercise03
