// exercises/04_loss_scaling/wrong_isinf_misses_nan.cpp — a wrong unscale_gradients: overflow found with std::isinf.
//
// A common mistake: looking for an overflow with std::isinf (or v == inf || v == -inf). An fp16
// overflow often arrives as NaN instead (inf - inf, 0 · inf in the backward), and NaN is neither
// inf nor equal to anything. The step then runs on NaN gradients and the weights are lost for
// good. std::isfinite is false for inf, -inf and NaN alike.
// expect: a NaN planted in the last gradient was not found
#include <cmath>
#include <vector>

#include "exercises/04_loss_scaling/loss_scale_state.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise04 {

double predicted_scale_after_nine_steps() { return 65536.0; }

sl::Tensor scale_loss(const LossScaleState& state, const sl::Tensor& loss) { return sl::mul(loss, state.scale); }

bool unscale_gradients(const LossScaleState& state, const std::vector<sl::Tensor>& grads) {
  bool found_inf = false;
  for (const sl::Tensor& g : grads) {
    if (!g.defined()) continue;
    for (double v : g.to_vector())
      if (std::isinf(v)) found_inf = true;  // the mistake: NaN is not inf
    g.mul_(1 / state.scale);
  }
  return found_inf;
}

void update_scale(LossScaleState& state, bool found_inf) { throw exercises::NotImplemented("update_scale"); }

}  // namespace exercise04
