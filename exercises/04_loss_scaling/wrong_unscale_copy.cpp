// exercises/04_loss_scaling/wrong_unscale_copy.cpp — a wrong unscale_gradients: it divides a copy.
//
// A common mistake: `g = sl::mul(g, 1 / S)` on the loop variable. sl::mul returns a NEW tensor; the
// assignment rebinds the local handle and the parameter's .grad still holds S·g. The optimizer
// then steps with gradients 65536 times too large. Unscaling must change the gradients in place
// (g.mul_(1 / S)), the tensors the optimizer reads.
// expect: the gradients still hold S·g after unscale_gradients
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
  for (sl::Tensor g : grads) {
    if (!g.defined()) continue;
    for (double v : g.to_vector())
      if (!std::isfinite(v)) found_inf = true;
    g = sl::mul(g, 1 / state.scale);  // the mistake: a new tensor in a local handle, .grad unchanged
  }
  return found_inf;
}

void update_scale(LossScaleState& state, bool found_inf) { throw exercises::NotImplemented("update_scale"); }

}  // namespace exercise04
