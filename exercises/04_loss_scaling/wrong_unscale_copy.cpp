// exercises/04_loss_scaling/wrong_unscale_copy.cpp — a wrong unscale_gradients: it divides a copy.
//
// A common mistake: `g = sl::mul(g, 1 / S)` on the loop variable. sl::mul returns a NEW tensor; the
// assignment rebinds the local handle and the parameter's .grad still holds S·g. The optimizer
// then steps with gradients 65536 times too large. Unscaling must change the gradients in place
// (g.mul_(1 / S)), the tensors the optimizer reads.
// expect: the gradients still hold S·g after unscale_gradients
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
  for (sl::Tensor g : grads) {
    if (!g.defined()) continue;
    for (double v : g.to_vector())
      if (!std::isfinite(v)) found_inf = true;
    g = sl::mul(g, 1 / scale);  // the mistake: a new tensor in a local handle, .grad unchanged
  }
  return found_inf;
}

std::optional<double> scaled_accumulation_step(sl::nn::GradScaler& scaler, sl::nn::Optimizer& optimizer,
                                               const MicroBatchLosses& micro_batch_losses, double max_norm) {
  throw exercises::NotImplemented("scaled_accumulation_step");
}

}  // namespace exercise04
