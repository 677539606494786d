// train_report.h — what build/bin/train prints after a run (tools/train.cpp): the data-parallel
// memory and traffic tables, and --compare-serial's largest differences from the serial run.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "parallel/train/trainer.h"

namespace sl::train_report {

// A number for a JSON line: 9 significant digits, or null where JSON has no number (a diverged
// run's nan loss, the inf tokens/s of a step that took 0 ms).
inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

// One row per rank that reported (under mpirun only this process's rank has one). `memory` and
// `traffic` are indexed by rank.
inline void print_memory_and_traffic(const std::vector<std::string>& memory,
                                     const std::vector<parallel::CommStats>& traffic, int64_t steps) {
  std::printf("\nmemory per rank (held after the last step; peak since the start):\n%s\n",
              parallel::memory_table_header().c_str());
  for (const std::string& row : memory)
    if (!row.empty()) std::printf("%s\n", row.c_str());
  std::printf("communication per rank over %lld steps:\n", (long long)steps);
  // A rank's row where this process ran it (under mpirun: its own) and it talked (naive DP's rank 0 may not).
  for (size_t rank = 0; rank < traffic.size(); ++rank)
    if (!memory[rank].empty() && (traffic[rank].calls > 0 || rank == 0))
      std::printf("rank %zu: %lld calls, sent %.3f MiB, received %.3f MiB (%.3f MiB per step)\n", rank,
                  (long long)traffic[rank].calls, traffic[rank].bytes_sent / 1048576.0,
                  traffic[rank].bytes_received / 1048576.0,
                  traffic[rank].bytes_sent / 1048576.0 / std::max<int64_t>(1, steps));
}

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
// wording is read by tests/test_train_cli.cpp.
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
}

}  // namespace sl::train_report
