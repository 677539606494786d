// exercises/04_loss_scaling/wrong_clip_before_unscale.cpp — a wrong step: the gradients clipped while scaled.
//
// A common mistake: clipping right after the backwards, then unscaling in the optimizer's step (the
// order a loop has when loss scaling is added to it last). clip_grad_norm then measures S · g: a norm
// S times too large, nearly always over max_norm, so it cuts S times too much, and the unscale
// divides by S again: the update is S times too small and the norm logged is S times too large.
// Unscale first (PyTorch: scaler.unscale_(optimizer) before clip_grad_norm_), then clip.
// expect: clip saw a norm S x too large
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
  const double norm = sl::nn::clip_grad_norm(optimizer.params(), max_norm);  // the mistake: S · g clipped
  if (unscale_gradients(scaler.scale(), grads_of(optimizer))) {
    scaler.update(true);
    return std::nullopt;
  }
  optimizer.step();
  scaler.update(false);
  return norm;
}

}  // namespace exercise04
