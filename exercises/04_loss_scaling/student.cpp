// exercises/04_loss_scaling/student.cpp — loss scaling over accumulated micro-batches: one unscale, one
// decision, one clip.
//
// fp16 has 5 exponent bits: its smallest subnormal is 6e-8, and small gradients flush to zero in
// backward. Backward is linear in its seed, so scaling the loss scales every gradient:
//
//   loss_scaled = loss · S                  a scalar [], still on the tape (sl::mul(loss, S))
//   loss_scaled.backward()                  every gradient is S · g: shifted into fp16's range
//   unscale: g = grads / S, in place        in each gradient's own dtype (S is a power of two: exact);
//                                           any inf or NaN among them? (an overflow: S too large)
//
// Lesson 04 shows the scale's bookkeeping (halve on an overflow, double after growth_interval clean
// steps: nn::GradScaler::update does it here). What it does not show is where these calls go in a
// real step, which accumulates M micro-batches and clips the gradient's global norm:
//
//   optimizer.zero_grad()
//   for each micro-batch i:  backward of scale_loss(S, micro_batch_losses[i]())   .grad adds up S · g_i
//   found = unscale_gradients(S, every parameter's .grad)     ONCE, after the last micro-batch: .grad
//                                                             holds S · Σ g_i; unscaled once it is Σ g_i
//   found:  skip the whole step          no clip, no optimizer.step() (AdamW would still move the
//                                        weights with zero gradients: momentum, weight decay);
//                                        scaler.update(true) halves S; return std::nullopt
//   clean:  norm = nn::clip_grad_norm(optimizer.params(), max_norm)   on the UNSCALED gradients: the
//                                        scaled ones have a norm S x too large
//           optimizer.step(); scaler.update(false); return norm
//
// An inf in any micro-batch reaches the sum (inf + x = inf, NaN stays NaN), so the one check after
// the last micro-batch finds it, and the step's other micro-batches are thrown away with it: their
// gradients were summed with it.
//
// The tools: sl::mul(tensor, double) (tensor/ops.h, differentiable); t.mul_(double) in place;
// t.to_vector() reads any dtype as doubles; std::isfinite. An undefined gradient (t.defined() false:
// a parameter backward never reached) is skipped. nn::GradScaler (nn/grad_scaler.h): scale(),
// update(found_inf); do not call its unscale: you are writing it. nn::clip_grad_norm(params, max_norm)
// (nn/optim.h) returns the norm before clipping; optimizer.params(), p.grad(), optimizer.step().
//
// Grade it:  make exercise N=04
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "exercises/grader.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "tensor/ops.h"

namespace exercise04 {

// Each returns its micro-batch's loss (a scalar []), already weighted so that they add up to the batch's.
using MicroBatchLosses = std::vector<std::function<sl::Tensor()>>;

// PREDICT FIRST, before any code. Steps of 3 micro-batches, S = 65536 at first, growth_interval 2.
// Micro-batch 3 of step 1 overflows, and micro-batches 1 and 2 of step 3; every other micro-batch is
// clean. What is S after step 6? Replace the throw with your number.
double predicted_scale_after_six_steps() {
  throw exercises::NotImplemented("predicted_scale_after_six_steps (predict first)");
}

// loss [] -> loss · S [], differentiable: its backward hands S · g to every gradient.
sl::Tensor scale_loss(double scale, const sl::Tensor& loss) {
  // TODO: one op that stays on the autograd tape.
  throw exercises::NotImplemented("scale_loss");
}

// Divides every defined gradient by S in place; returns whether any element of any of them is inf or NaN.
bool unscale_gradients(double scale, const std::vector<sl::Tensor>& grads) {
  // TODO: look for non-finite values, then multiply by 1 / S in place (undefined tensors: skip).
  throw exercises::NotImplemented("unscale_gradients");
}

// One optimizer step over the micro-batches under loss scaling, as drawn above. Returns the unscaled
// gradient's global norm before clipping, or std::nullopt when an overflow skipped the step.
std::optional<double> scaled_accumulation_step(sl::nn::GradScaler& scaler, sl::nn::Optimizer& optimizer,
                                               const MicroBatchLosses& micro_batch_losses, double max_norm) {
  // TODO: zero_grad; scaled backward per micro-batch; unscale once; skip, or clip and step; update.
  throw exercises::NotImplemented("scaled_accumulation_step");
}

}  // namespace exercise04
