// serial_reference.h — the serial run written out by hand: one nn::GPT, one nn::AdamW, the whole
// batch on one rank, nothing from parallelize or the Trainer. train --compare-serial trains it beside
// the layout the flags chose and compares losses and weights: a reference that shares none of the
// code it checks.
//
//   for step in [first_step, steps):
//     lr = cosine_lr(step)                      warm-up, then cosine decay to min_lr
//     zero the gradients
//     for each micro-batch m of the step's rows:  backward( loss_m · c_m / C · S )
//       (c_m its counted targets, C the batch's; S the fp16 loss scale, 1 otherwise)
//     unscale (fp16); an inf or NaN skips the update
//     clip_grad_norm(grad_clip), AdamW.step
//
//   Tests: tests/tools/test_train_cli.cpp (--compare-serial), tests/parallel/train/test_trainer.cpp
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/grad_scaler.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/train/train_options.h"

namespace sl::parallel {

// The same loop one step at a time: build/bin/diverge (divergence.h) reads the gradients before each
// update and the weights after it. `before_update` runs once the gradients are final (summed over the
// micro-batches, unscaled), before clipping and AdamW; not on a step fp16's overflow skips.
class SerialReference {
 public:
  SerialReference(nn::GPT& model, const TrainOptions& o, const nn::MixedPrecision& precision);
  ~SerialReference();
  // One optimizer step on global batch `step`; returns the batch's mean loss before the update.
  double step(const nn::TokenStream& data, int64_t step, const std::function<void()>& before_update = {});
  // Its optimizer and loss scaler, whose state build/bin/diverge sets to the layout's before a step.
  nn::AdamW& optimizer();
  nn::GradScaler& scaler();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Trains `model` in place on `data` with the options' schedule, batch (o.block_size resolved: not 0),
// micro-batches, clipping and AdamW, from step `first_step` to o.steps. Returns each step's loss:
// the batch's mean over its counted targets, before the update.
std::vector<double> train_serial_reference(nn::GPT& model, const nn::TokenStream& data, const TrainOptions& o,
                                           const nn::MixedPrecision& precision, int64_t first_step = 0);

}  // namespace sl::parallel
