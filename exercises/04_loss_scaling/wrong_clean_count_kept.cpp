// exercises/04_loss_scaling/wrong_clean_count_kept.cpp — a wrong update_scale: an overflow keeps the clean count.
//
// A common mistake: on an overflow, halving the scale and counting the skip but leaving
// clean_steps where it was. growth_interval counts clean steps IN A ROW: after an overflow the
// scale must prove itself for growth_interval steps again, or it doubles straight back into the
// overflow it just left, and the run skips a step every few.
// expect: count clean steps since the scale last changed
#include <vector>

#include "exercises/04_loss_scaling/loss_scale_state.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise04 {

double predicted_scale_after_nine_steps() { return 65536.0; }

sl::Tensor scale_loss(const LossScaleState& state, const sl::Tensor& loss) {
  throw exercises::NotImplemented("scale_loss");
}

bool unscale_gradients(const LossScaleState& state, const std::vector<sl::Tensor>& grads) {
  throw exercises::NotImplemented("unscale_gradients");
}

void update_scale(LossScaleState& state, bool found_inf) {
  if (found_inf) {
    state.scale *= 0.5;  // the mistake: clean_steps is not reset to 0
    ++state.skipped_steps;
    return;
  }
  if (++state.clean_steps == state.growth_interval) {
    state.scale *= 2;
    state.clean_steps = 0;
  }
}

}  // namespace exercise04
