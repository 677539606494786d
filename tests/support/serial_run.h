// tests/support/serial_run.h — the serial reference of the parity suites: one whole nn::GPT trained
// by nn::AdamW (and nn::clip_grad_norm), recording what each step saw and did, for a parallel run to
// be compared with. Written once here so that every suite is held to the same reference loop.
//
//   serial_run(options, batch_of_step)         one batch per step, one backward
//   serial_run_micro(options, micros_of_step)  several micro-batches per step, each loss weighted
//                                              (gradient accumulation in one model)
//   state_of(named), flat_values(named)        a step's record as a StateDict, or all its values in
//                                              parameter order
//   named_grads(module)                        a module's gradients by name (no copies), to compare
//
// Each step: zero_grad, forward and backward of every micro-batch (weight 1: the loss itself; else
// loss · weight, so Σ weights = 1 gives the mean over the step's targets), record the loss and the
// gradients, clip (when asked), step, record the parameters. Records are copies on the device the
// run happened on (the caller's DeviceGuard: suites that watch a rank's ledger keep it elsewhere).
// Only nn/ is included: the tests of the layers below the chapters may use it too.
#pragma once
#include <functional>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"

namespace sl::test_support {

struct SerialOptions {
  nn::GPTConfig config;
  uint64_t seed = 0;
  nn::AdamWOptions adamw;
  int steps = 5;
  double clip = 0;                // > 0: nn::clip_grad_norm(parameters, clip) before each update
  bool grads_after_clip = false;  // record the gradients the update used (clipped), not backward's
};

// One micro-batch of a step and the weight of its loss (its share of the step's counted targets).
struct WeightedBatch {
  nn::Batch batch;
  double weight = 1.0;
};

struct SerialStep {
  double loss = 0;          // Σ weight · micro-batch loss
  double norm = 0;          // clip_grad_norm's (the norm before clipping); 0 without clipping
  nn::NamedTensors grads;   // parameter order
  nn::NamedTensors params;  // after the update
};

struct SerialRun {
  nn::NamedTensors initial;  // the parameters before the first step
  std::vector<SerialStep> steps;
  nn::StateDict optimizer_state;  // nn::AdamW's state_dict() after the last step
};

inline nn::NamedTensors copies(const nn::NamedTensors& named, bool grads = false) {
  nn::NamedTensors out;
  out.reserve(named.size());
  for (const auto& [name, t] : named)  // a gradient never computed (an expert no token chose) as zeros
    out.emplace_back(name, grads && !t.grad().defined() ? zeros(t.shape(), TensorOptions(t.dtype(), t.device()))
                                                        : (grads ? t.grad() : t).detach().clone());
  return out;
}

inline SerialRun serial_run_micro(const SerialOptions& options,
                                  const std::function<std::vector<WeightedBatch>(int step)>& micros_of_step) {
  nn::GPT model(options.config, options.seed);
  nn::AdamW adamw(model.parameters(), options.adamw);
  SerialRun run;
  run.initial = copies(model.named_parameters());
  for (int s = 0; s < options.steps; ++s) {
    adamw.zero_grad();
    SerialStep step;
    for (const WeightedBatch& micro : micros_of_step(s)) {
      Tensor loss = model.loss(micro.batch.inputs, micro.batch.targets);
      step.loss += loss.item() * micro.weight;
      (micro.weight == 1.0 ? loss : mul(loss, micro.weight)).backward();
    }
    if (!options.grads_after_clip) step.grads = copies(model.named_parameters(), true);
    if (options.clip > 0) step.norm = nn::clip_grad_norm(model.parameters(), options.clip);
    if (options.grads_after_clip) step.grads = copies(model.named_parameters(), true);
    adamw.step();
    step.params = copies(model.named_parameters());
    run.steps.push_back(std::move(step));
  }
  for (const auto& [name, t] : adamw.state_dict()) run.optimizer_state.emplace(name, t.detach().clone());
  return run;
}

inline SerialRun serial_run(const SerialOptions& options, const std::function<nn::Batch(int step)>& batch_of_step) {
  return serial_run_micro(options, [&](int step) { return std::vector<WeightedBatch>{{batch_of_step(step), 1.0}}; });
}

inline nn::NamedTensors named_grads(const nn::Module& module) {
  nn::NamedTensors out;
  for (const auto& [name, p] : module.named_parameters()) out.emplace_back(name, p.grad());
  return out;
}

inline nn::StateDict state_of(const nn::NamedTensors& named) { return nn::StateDict(named.begin(), named.end()); }

inline std::vector<float> flat_values(const nn::NamedTensors& named) {
  std::vector<float> out;
  for (const auto& [name, t] : named) {
    const std::vector<float> v = t.values<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace sl::test_support
