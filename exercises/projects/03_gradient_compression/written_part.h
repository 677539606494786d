// exercises/projects/03_gradient_compression/written_part.h — the numbers the written part asks for
// (ANALYSIS.md), measured by the grader's runs and printed after its checks; never graded (given:
// grader.cpp includes it).
//
// Bytes from the group's ledger (yours, and an uncompressed all_reduce of the same gradients), losses
// from the runs. "without error feedback" is your averager made new every step (RunOptions::memoryless):
// whatever it did not send is forgotten. None is a formula.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exercises/grader.h"

namespace project03::written {

// What one data-parallel run measured.
struct Training {
  std::vector<double> losses;                // per step, the global batch's mean loss
  std::vector<std::vector<double>> weights;  // [n] every rank's parameters, flattened, after the last step
  std::vector<int64_t> bytes_per_step;       // [n] bytes rank r sent per step (the last step's)
  std::vector<int64_t> ring_bytes_per_step;  // [n] what an uncompressed all_reduce of the same gradients sent
  int64_t gradient_bytes = 0;                // S: every gradient, f32
};

// How a data-parallel run uses the averager. memoryless: a new averager every step, so nothing is
// carried from one step to the next (no error feedback, no warm start): top-k of this step's gradient
// alone. measure_ring: also all-reduce a copy of each step's gradients uncompressed, for its bytes.
struct RunOptions {
  bool memoryless = false;
  bool measure_ring = false;
};

struct FeedbackGap {
  double gap = 0, factor = 0;
};

// The grader's runs: data_parallel(n, keep, steps, how), error_feedback_gap(n, steps, memoryless).
using TrainFn = std::function<Training(int n, double keep, int steps, RunOptions how)>;
using GapFn = std::function<FeedbackGap(int n, int steps, bool memoryless)>;

inline double mean_of_last(const std::vector<double>& v, int count) {
  double sum = 0;
  for (size_t i = v.size() - count; i < v.size(); ++i) sum += v[i] / count;
  return sum;
}

inline int64_t most(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

inline void print_bytes_against_world(const TrainFn& data_parallel, double keep) {
  std::printf("    keep %.2f   world  yours (bytes/rank/step)  uncompressed all_reduce  yours / uncompressed\n", keep);
  for (int n : {2, 4, 8}) {
    const Training run = data_parallel(n, keep, 1, {.measure_ring = true});
    std::printf("                %-5d  %-23lld  %-23lld  %.3f\n", n, static_cast<long long>(most(run.bytes_per_step)),
                static_cast<long long>(most(run.ring_bytes_per_step)),
                static_cast<double>(most(run.bytes_per_step)) / static_cast<double>(most(run.ring_bytes_per_step)));
  }
}

inline void print_written_part_numbers(exercises::Grader& grader, const Training& serial_run, int steps,
                                       const TrainFn& data_parallel, const GapFn& error_feedback_gap) {
  grader.numbers("Q1: bytes per rank per step (the ledger's), one step at worlds 2, 4, 8", [&] {
    print_bytes_against_world(data_parallel, 0.1);
    print_bytes_against_world(data_parallel, 0.01);
  });
  std::map<std::pair<double, bool>, Training> runs;  // (keep, memoryless) at world 4
  auto run_at = [&](double keep, bool memoryless) -> const Training& {
    const auto key = std::make_pair(keep, memoryless);
    if (!runs.count(key)) runs[key] = data_parallel(4, keep, steps, {.memoryless = memoryless});
    return runs.at(key);
  };
  grader.numbers("Q2: world 4, keep 0.10: the loss with and without error feedback", [&] {
    const Training &with = run_at(0.1, false), &without = run_at(0.1, true);
    std::printf("    step  serial  with error feedback  without\n");
    for (int s = 0; s < steps; s += 5)
      std::printf("    %4d  %.4f  %.4f               %.4f\n", s, serial_run.losses[s], with.losses[s],
                  without.losses[s]);
    std::printf("    %4d  %.4f  %.4f               %.4f   (the last step)\n", steps - 1, serial_run.losses.back(),
                with.losses.back(), without.losses.back());
    std::printf("    mean of the last 5 steps: serial %.4f, with %.4f, without %.4f\n",
                mean_of_last(serial_run.losses, 5), mean_of_last(with.losses, 5), mean_of_last(without.losses, 5));
  });
  grader.numbers("Q3: world 2, keep 0.10: a constant gradient averaged 60 times", [&] {
    const FeedbackGap with = error_feedback_gap(2, 60, false), without = error_feedback_gap(2, 60, /*memoryless=*/true);
    std::printf("    ‖Σ arrived − 60 · average‖ / ‖60 · average‖: with error feedback %.3f, without %.3f\n", with.gap,
                without.gap);
    std::printf("    Σ arrived ≈ f · 60 · average, best f: with %.3f, without %.3f\n", with.factor, without.factor);
  });
  grader.numbers("Q4: world 4, " + std::to_string(steps) + " steps: keep against bytes and loss", [&] {
    std::printf(
        "    keep  bytes/rank/step  mean loss of the last 5 steps: with error feedback  without  (serial %.4f)\n",
        mean_of_last(serial_run.losses, 5));
    for (double keep : {1.0, 0.3, 0.1, 0.01}) {
      const Training &with = run_at(keep, false), &without = run_at(keep, true);
      std::printf("    %.2f  %-15lld  %.4f                                     %.4f\n", keep,
                  static_cast<long long>(most(with.bytes_per_step)), mean_of_last(with.losses, 5),
                  mean_of_last(without.losses, 5));
    }
  });
}

}  // namespace project03::written
