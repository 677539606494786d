// exercises/04_loss_scaling/wrong_step_on_overflow.cpp — a wrong step: an overflow zeroes the gradients
// and steps anyway.
//
// A common mistake: on an overflow, zeroing the gradients and calling optimizer.step() as usual, to
// "step with nothing". With SGD and no momentum that leaves the weights alone; with AdamW it does not:
// the step divides the decayed first moment m by sqrt(v) and moves every weight, decays the matrices,
// and counts a step in the bias correction. A skipped step must not call step() at all.
// expect: the weights moved in a step that overflowed
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "exercises/grader.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "tensor/ops.h"

namespace exercise04 {

using MicroBatchLosses = std::vector<std::function<sl::Tensor()>>;

double predicted_scale_after_six_steps() { return 32768; }

sl::Tensor scale_loss(double scale, const sl::Tensor& loss) { return sl::mul(loss, scale); }

bool unscale_gradients(double scale, const std::vector<sl::Tensor>& grads) {
  bool found_inf = false;
  for (const sl::Tensor& g : grads) {
    if (!g.defined()) continue;
    for (double v : g.to_vector())
      if (!std::isfinite(v)) found_inf = true;
    g.mul_(1 / scale);
  }
  return found_inf;
}

std::vector<sl::Tensor> grads_of(const sl::nn::Optimizer& optimizer) {
  std::vector<sl::Tensor> grads;
  for (const sl::Tensor& p : optimizer.params()) grads.push_back(p.grad());
  return grads;
}

std::optional<double> scaled_accumulation_step(sl::nn::GradScaler& scaler, sl::nn::Optimizer& optimizer,
                                               const MicroBatchLosses& micro_batch_losses, double max_norm) {
  optimizer.zero_grad();
  for (const auto& loss : micro_batch_losses) scale_loss(scaler.scale(), loss()).backward();
  const bool found = unscale_gradients(scaler.scale(), grads_of(optimizer));
  std::optional<double> norm;
  if (found) {
    for (const sl::Tensor& p : optimizer.params()) p.set_grad(sl::zeros_like(p));  // the mistake: then steps
  } else {
    norm = sl::nn::clip_grad_norm(optimizer.params(), max_norm);
  }
  optimizer.step();
  scaler.update(found);
  return norm;
}

}  // namespace exercise04
