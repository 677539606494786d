// runners.h — the one place that knows every chapter that cuts the model: a TrainPlan with pp, tp or
// cp > 1 gets the chapter's ModelRunner (model_runner.h) for this rank.
//
//   plan.parallelism   runner                                     the chapter's options from the plan
//   pp = P             pipeline::PipelineRunner   (this stage)    schedule, virtual_stages, stage_layers
//   tp = T             TensorParallelRunner       (this shard)    sequence_parallel
//   cp = C             ContextParallelRunner      (this sequence) cp_balance, cp_variant
//   two or more of them NdRunner (parallel/nd)    (this stage's   all of the above
//                                                   tp × cp cut)
//
// Each builds its part from the serial model's seed (the same slice of the same draw), then takes its
// part of `initial` when that is not empty (train --init-from: the serial file).
#pragma once
#include <memory>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/train/model_runner.h"
#include "parallel/train/trainer.h"

namespace sl::parallel {

// The chapter's own rules for this model (layers per stage and schedule; heads and SP's sequence
// over tp; the sequence over cp), checked before any rank starts: throws sl::Error naming the values.
void check_model_runner(const TrainPlan& plan, const nn::GPTConfig& config);

// This rank's part of the model on `mesh` (collective over the chapter's group where it says so).
std::unique_ptr<ModelRunner> make_model_runner(const TrainPlan& plan, const nn::GPTConfig& config, uint64_t seed,
                                               const nn::StateDict& initial, const DeviceMesh& mesh);

}  // namespace sl::parallel
