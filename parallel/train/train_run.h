// train_run.h — one run of build/bin/train (tools/train.cpp) from its checked options: the data,
// the model's shape, the starting weights, the resume point, the log, and, once trained, what the
// ranks reported. The train program's steps, in order:
//
//   prepare_run(run, options, writer)       data read, --init-from and --resume checked, log opened
//   train_layout(run, weights)              every layout, serial included (run_layout.h)
//   accuracy(run, model)                    the addition task's held-out score
//
//   Tests: tests/tools/test_train_cli.cpp
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/addition.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "parallel/comm/mesh.h"
#include "parallel/train/run_report.h"
#include "parallel/train/train_checkpoint.h"
#include "parallel/train/train_files.h"
#include "parallel/train/train_options.h"

namespace sl::parallel {

struct TrainRun {
  TrainOptions o;  // block_size resolved (0: one addition line, 64 otherwise)
  nn::TokenStream stream;
  std::unique_ptr<nn::AdditionTask> addition;  // the addition task's evaluator; null for text and bin
  nn::GPTConfig config;
  nn::MixedPrecision precision;
  nn::StateDict initial;  // --init-from's weights; empty: the seed's draw
  train_files::LogFile log;
  bool terminal = false;     // standard output is a terminal: a progress bar instead of lines
  bool writer = true;        // writes the log and --save: every run but ranks 1.. of an mpirun job
  std::vector<RankReport> reports;  // --report-json: one per rank this process ran
  std::string plan_name = "serial";
  std::string profile;  // --profile: the serial rank's report
  ParallelismConfig parallelism;
  std::optional<train_checkpoint::Resume> resume;  // --resume: where the run continues from
  int64_t first_step = 0;
};

// Reads the data (the addition task's lines, a text or a token file), resolves the block size and
// the model's config, reads --init-from, opens --resume's checkpoint (verified, its model checked:
// sl::Error naming the values) and then the log, into `run` (a fresh one). `writer`: this process
// writes the log.
void prepare_run(TrainRun& run, const TrainOptions& options, bool writer);

// Every model of the run (each rank's part, the --compare-serial reference) starts from the same
// weights: the seed's draw, then --init-from's file over it (strict: every name, every shape).
std::unique_ptr<nn::GPT> initial_model(const TrainRun& run);

// The addition task's held-out accuracy of `model`, in [0, 1] (greedy decoding of every held-out sum).
double accuracy(const TrainRun& run, nn::GPT& model);

}  // namespace sl::parallel
