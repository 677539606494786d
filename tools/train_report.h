// train_report.h — what build/bin/train prints after a run (tools/train.cpp) besides the per-rank
// table (parallel/train/run_report.h): --compare-serial's largest differences from the serial run.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace sl::train_report {

// Largest |a - b| between two state dicts with the same names, and the tensor where it is.
inline std::pair<double, std::string> largest_difference(const nn::StateDict& a, const nn::StateDict& b) {
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& [name, tensor] : a) {
    std::vector<double> x = tensor.to_vector(), y = b.at(name).to_vector();
    for (size_t i = 0; i < x.size(); ++i)
      if (std::abs(x[i] - y[i]) > worst.first) worst = {std::abs(x[i] - y[i]), name};
  }
  return worst;
}

// --compare-serial: the parallel run's losses and final weights against the serial run's. The line's
// wording is read by tests/tools/test_train_cli.cpp.
inline void print_comparison(const std::vector<double>& losses, const std::vector<double>& serial_losses,
                             const nn::StateDict& weights, const nn::StateDict& serial_weights) {
  double worst_loss = 0;
  size_t worst_step = 0;
  for (size_t s = 0; s < losses.size() && s < serial_losses.size(); ++s)
    if (std::abs(losses[s] - serial_losses[s]) > worst_loss) {
      worst_loss = std::abs(losses[s] - serial_losses[s]);
      worst_step = s;
    }
  auto [worst_param, where] = largest_difference(weights, serial_weights);
  std::printf(
      "compared with the serial model: largest loss difference %.3g (step %zu), largest parameter "
      "difference %.3g (%s)\n",
      worst_loss, worst_step, worst_param, where.c_str());
  // Two summation orders round differently; training amplifies that over hundreds of steps (a loss
  // spike turns 1e-7 into 1e-1), so the check is how long the losses stay within the TP/PP tolerance.
  const size_t steps = std::min(losses.size(), serial_losses.size());
  size_t agree = 0;
  while (agree < steps && std::abs(losses[agree] - serial_losses[agree]) <= 4e-5 + 1e-5 * std::abs(serial_losses[agree]))
    ++agree;
  if (agree == steps)
    std::printf("the losses agree with the serial run's within rtol 1e-5, atol 4e-5 at every one of the %zu steps\n", steps);
  else
    std::printf("the losses agree with the serial run's within rtol 1e-5, atol 4e-5 for the first %zu of %zu steps; "
                "after that, rounding amplified by training drifts the two runs apart (as it does between any "
                "two summation orders)\n", agree, steps);
}

}  // namespace sl::train_report
