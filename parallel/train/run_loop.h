// run_loop.h — the loop every layout of build/bin/train shares, on every rank: the learning-rate
// schedule, the step, a checkpoint when one is due, and on the reporting rank the step's timing,
// its --log-jsonl line, the progress bar (or a line every 100 steps) and the held-out evaluations.
//
//   for step in [first_step, steps):
//     lr = cosine_lr(step)  ─▶  loss = step_fn(step, lr)  ─▶  after_step(step + 1)
//     report: {"step", "loss", "ms", "tokens_per_s", "lr"} to the log; progress; eval every --eval-every
//
//   Tests: tests/tools/test_train_cli.cpp
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "parallel/train/train_run.h"

namespace sl::parallel {

// A number for a JSON line: 9 significant digits, or null where JSON has no number (a diverged
// run's nan loss, the inf tokens/s of a step that took 0 ms).
std::string json_number(double value);

// Runs the run's steps. `step_fn(step, lr)` runs one optimizer step and returns its loss; `eval`
// (may be empty) gives held-out accuracy; `after_step(done)` (may be empty) runs after each step.
// `report`: this rank logs, prints and evaluates. `model` (may be null): the reporting rank's part,
// whose mixture-of-experts layers' tokens per expert each step adds to the log (moe_load_json).
// Returns the losses of the steps run.
std::vector<double> run_steps(TrainRun& run, bool report, const std::function<double(int64_t, double)>& step_fn,
                              const std::function<double()>& eval, const std::function<void(int64_t)>& after_step,
                              nn::Module* model = nullptr);

// The step's load of each MoE layer under `model`, taken (nn::take_moe_loads), as a log record's
// field: `"experts": {"h.0.mlp": {"routed": [..], "kept": [..], "tokens": N}, ...}` (empty without
// MoE layers); `imbalance` is set to the largest max/mean of routed assignments over the layers.
// Under --ep the layers' counts are the whole batch's, the same on every rank.
std::string moe_load_json(nn::Module& model, double* imbalance);

}  // namespace sl::parallel
