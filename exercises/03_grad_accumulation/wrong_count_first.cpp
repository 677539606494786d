// exercises/03_grad_accumulation/wrong_count_first.cpp — a wrong accumulation: the loader drained first.
//
// A common way out: read every micro-batch first to count N, then run lesson 03's loop with the
// weights n_i / N. The gradient is right, but it holds every micro-batch at once, and this loader
// (like one that packs on demand, or a count that is only all-reduced after the backwards) gives
// the next micro-batch only after this one's backward. Backpropagate the sum loss_i · n_i as each
// micro-batch comes, and divide by N at the end.
// expect: before micro-batch 1's backward
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
  std::vector<nn::Batch> batches;  // the mistake: reads ahead of the backwards to know N
  while (std::optional<nn::Batch> batch = next_micro_batch()) batches.push_back(*batch);
  double N = 0;
  for (const nn::Batch& b : batches) N += static_cast<double>(nn::counted_targets(b.targets));
  SL_CHECK(N > 0, "a batch with no counted target has no mean loss");
  model.zero_grad();
  double loss = 0;
  for (const nn::Batch& b : batches) {
    const double share = static_cast<double>(nn::counted_targets(b.targets)) / N;
    const Tensor L_i = model.loss(b.inputs, b.targets);
    mul(L_i, share).backward();
    loss += L_i.item() * share;
  }
  return loss;
}

}  // namespace exercise03
