// exercises/04_loss_scaling/wrong_isinf_misses_nan.cpp — a wrong unscale_gradients: overflow found with std::isinf.
//
// A common mistake: looking for an overflow with std::isinf (or v == inf || v == -inf). An fp16
// overflow often arrives as NaN instead (inf - inf, 0 · inf in the backward), and NaN is neither
// inf nor equal to anything. The step then runs on NaN gradients and the weights are lost for
// good. std::isfinite is false for inf, -inf and NaN alike.
// expect: a NaN planted in the last gradient was not found
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
      if (std::isinf(v)) found_inf = true;  // the mistake: NaN is not inf
    g.mul_(1 / scale);
  }
  return found_inf;
}

std::optional<double> scaled_accumulation_step(sl::nn::GradScaler& scaler, sl::nn::Optimizer& optimizer,
                                               const MicroBatchLosses& micro_batch_losses, double max_norm) {
  throw exercises::NotImplemented("scaled_accumulation_step");
}

}  // namespace exercise04
