// plan_of_options.h — train's flags (TrainOptions, train_options.h) as a layout and an optimizer:
// the one mapping from the command line's words to the TrainPlan that parallelize builds. The train
// program runs it; the planner (parallel/planner/plan_request.h) estimates it.
//
//   --dp N [--zero Z] [--naive-dp]          TrainPlan::data_parallel(N, Z) (naive: the classic DataParallel)
//   --dp-replicate R --dp-shard S           HSDP: FSDP within each S shards, R replicas
//   --pp / --tp / --cp and their options    the chapters' degrees and choices
//   no parallel flag                        the serial layout: world 1, DDP over a mesh of one
//
//   Tests: tests/tools/test_train_cli.cpp, tests/parallel/planner/test_planner.cpp
#pragma once
#include <string>
#include <vector>

#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/train/train_options.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel {

// The layout the options describe, with `precision` (nn::MixedPrecision::parse of their precision
// flags). The options are checked already (TrainOptions::validate); the plan's own rules are
// TrainPlan::validate's.
TrainPlan plan_of_options(const TrainOptions& o, const nn::MixedPrecision& precision);

// AdamW as train runs it: --lr, betas (0.9, 0.95), --adam-eps, --weight-decay, f32 master weights
// under mixed precision.
nn::AdamWOptions adamw_of_options(const TrainOptions& o);

// --stage-layers "2,1,1" -> {2, 1, 1} (its form checked by the options); "" -> {}.
std::vector<int> parse_stage_layers(const std::string& text);

}  // namespace sl::parallel
