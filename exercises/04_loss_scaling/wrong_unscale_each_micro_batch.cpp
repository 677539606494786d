// exercises/04_loss_scaling/wrong_unscale_each_micro_batch.cpp — a wrong step: unscaled after every micro-batch.
//
// A common mistake: unscaling (and checking for inf) right after each micro-batch's backward, as if
// each were a step of its own. .grad is a running sum: after micro-batch 1 it holds g_1, then
// micro-batch 2 adds S · g_2, and the second unscale divides g_1 by S again. Micro-batch 1 of M
// ends up divided by S^M, and the step follows the last micro-batch alone. (PyTorch's GradScaler
// refuses a second unscale_ before update() for this reason.) Unscale once, after the last one.
// expect: unscale ONCE, after the last micro-batch's backward
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
  bool found = false;
  for (const auto& loss : micro_batch_losses) {
    scale_loss(scaler.scale(), loss()).backward();
    found = unscale_gradients(scaler.scale(), grads_of(optimizer)) || found;  // the mistake: every micro-batch
  }
  if (found) {
    scaler.update(true);
    return std::nullopt;
  }
  const double norm = sl::nn::clip_grad_norm(optimizer.params(), max_norm);
  optimizer.step();
  scaler.update(false);
  return norm;
}

}  // namespace exercise04
