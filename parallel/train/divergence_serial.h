// divergence_serial.h — the serial half of build/bin/diverge (divergence.h): the serial run in the
// layout's dtype, recorded step by step, beside its f64 twin, and each recorded value's bound from the
// rounding noise measured between the two (divergence_compare.h states the bound and why).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "parallel/train/divergence_compare.h"
#include "parallel/train/train_run.h"

namespace sl::parallel {

// What the serial run did at one step, and the bounds of its values.
struct SerialStepRecord {
  double loss = 0, loss_bound = 0, lr = 0;
  std::map<std::string, Tensor> outputs;  // module -> the whole batch's output, f32
  NoiseBound output_bound, grad_bound, weight_bound;
  std::map<std::string, std::vector<double>> grads, grad_bounds;      // before the update
  std::map<std::string, std::vector<double>> weights, weight_bounds;  // after it
};

// run.o.steps steps of the serial model and its f64 twin; `parameter_order`: the model's parameter names.
std::vector<SerialStepRecord> record_serial(const TrainRun& run, std::vector<std::string>& parameter_order);

// The bounds' derivation, printed above the finder's answer.
std::vector<std::string> derivation_of(const TrainRun& run);

std::vector<double> values_f64(const Tensor& t);

}  // namespace sl::parallel
