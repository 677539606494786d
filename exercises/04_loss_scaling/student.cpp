// exercises/04_loss_scaling/student.cpp — dynamic loss scaling (PyTorch's GradScaler) by hand.
//
// fp16 has 5 exponent bits: its smallest subnormal is 6e-8, and small gradients flush to zero in
// backward. Backward is linear in its seed, so scaling the loss scales every gradient:
//
//   loss_scaled = loss · S                  a scalar [], still on the tape (sl::mul(loss, S))
//   loss_scaled.backward()                  every gradient is S · g: shifted into fp16's range
//   unscale: g = grads / S, in place        in each gradient's own dtype (S is a power of two: exact);
//                                           any inf or NaN among them? (an overflow: S too large)
//   found inf:  skip the optimizer step     S ← S · 0.5, the clean count starts again at 0,
//                                           skipped_steps + 1
//   clean:      step                        clean_steps + 1; when it reaches growth_interval:
//                                           S ← S · 2 and clean_steps ← 0
//
// The tools: sl::mul(tensor, double) (tensor/ops.h, differentiable); t.mul_(double) in place;
// t.to_vector() reads any dtype as doubles; std::isfinite. An undefined gradient (t.defined() false:
// a parameter backward never reached) is skipped. Do not call nn::GradScaler: you are writing it.
//
// Grade it:  make exercise N=04
#include <cmath>
#include <cstdint>
#include <vector>

#include "exercises/04_loss_scaling/loss_scale_state.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise04 {

// PREDICT FIRST, before any code. A scaler starts at S = 65536 with growth_interval 3. Steps 1 and 2
// overflow; steps 3 to 9 are clean. What is S after step 9? Replace the throw with your number.
double predicted_scale_after_nine_steps() {
  throw exercises::NotImplemented("predicted_scale_after_nine_steps (predict first)");
}

// LossScaleState (loss_scale_state.h): scale S, growth_interval, clean_steps, skipped_steps.

// loss [] -> loss · S [], differentiable: its backward hands S · g to every gradient.
sl::Tensor scale_loss(const LossScaleState& state, const sl::Tensor& loss) {
  // TODO: one op that stays on the autograd tape.
  throw exercises::NotImplemented("scale_loss");
}

// Divides every defined gradient by S in place; returns whether any element of any of them is inf or NaN.
bool unscale_gradients(const LossScaleState& state, const std::vector<sl::Tensor>& grads) {
  // TODO: look for non-finite values, then multiply by 1 / S in place (undefined tensors: skip).
  throw exercises::NotImplemented("unscale_gradients");
}

// After the step (skipped when found_inf): back off on an overflow, grow after growth_interval clean steps.
void update_scale(LossScaleState& state, bool found_inf) {
  // TODO: the two branches above; growth factor 2, backoff factor 0.5.
  throw exercises::NotImplemented("update_scale");
}

}  // namespace exercise04
