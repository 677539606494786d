// exercises/03_grad_accumulation/wrong_mean_of_means.cpp — a wrong accumulation: each micro-batch weighted 1/M.
//
// A common mistake: scaling every micro-batch's loss by 1/M, the textbook recipe for gradient
// accumulation. It averages the micro-batches' MEANS, which equals the batch mean only when every
// micro-batch counts the same number of targets. With padding or ignored prompt tokens they do
// not: a micro-batch of 3 counted targets gets the same say as one of 15, and the gradient is not
// the batch's. Weight micro-batch i by n_i / N.
// expect: MEAN OF THE MICRO-BATCH MEANS
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
  SL_CHECK(nn::counted_targets(targets) > 0, "a batch with no counted target has no mean loss");
  model.zero_grad();
  double loss = 0;
  for (int64_t i = 0, rows = B / M; i < M; ++i) {
    const Tensor L_i = model.loss(inputs.narrow(0, i * rows, rows), targets.narrow(0, i * rows, rows));
    mul(L_i, 1.0 / M).backward();  // the mistake: 1/M, where n_i / N weighs each target once
    loss += L_i.item() / M;
  }
  return loss;
}

}  // namespace exercise03
