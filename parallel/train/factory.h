// factory.h — the one place that knows every chapter: a TrainPlan becomes this rank's ModelRunner
// (what part of the model it computes) and DataParallelStrategy (how the replicas agree). A new
// technique is a new folder under parallel/ plus one line here.
//
//   plan.parallelism   runner                                     the chapter's options from the plan
//   (no cut)           WholeModelRunner (runner/)                 —
//   pp = P             PipelineRunner   (this stage)    schedule, virtual_stages, stage_layers
//   tp = T             TensorParallelRunner       (this shard)    sequence_parallel
//   cp = C             ContextParallelRunner      (this sequence) cp_balance, cp_variant, ulysses_degree
//   two or more of them NdRunner (parallel/nd)    (this stage's   all of the above
//                                                   tp × cp cut)
//   any cut with fsdp  FsdpNdRunner (parallel/nd) (its shards     all of the above
//                                                   over dp_shard × cp; brings its own strategy)
//
//   plan.dp_strategy   strategy
//   ddp                DdpStrategy (data_parallel/)   (a cut model at dp 1: AdamW alone)
//   naive              NaiveStrategy (data_parallel/)
//   zero1, zero2       ZeroStrategy (zero/)
//   fsdp               FsdpStrategy (zero/): over the whole GPT (HSDP with dp_replicate), or the
//                      runner's own (FSDP / HSDP over a cut)
//
// Each runner builds its part from the serial model's seed (the same slice of the same draw), then
// takes its part of `initial` when that is not empty (train --init-from: the serial file).
#pragma once
#include <memory>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/model_runner.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel {

// The chapters' own rules for this model (layers per stage and schedule; heads and SP's sequence
// over tp; the sequence over cp), checked before any rank starts: throws sl::Error naming the values.
void check_model_runner(const TrainPlan& plan, const nn::GPTConfig& config);

// This rank's part of the model on `mesh` when the plan cuts it (collective over the chapter's
// group where it says so).
std::unique_ptr<ModelRunner> make_model_runner(const TrainPlan& plan, const nn::GPTConfig& config, uint64_t seed,
                                               const nn::StateDict& initial, const DeviceMesh& mesh);

// The strategy around a cut model's runner (collective over the data-parallel group: DDP's first
// broadcast). fsdp: the runner's own (ModelRunner::own_strategy); throws if it has none.
std::unique_ptr<DataParallelStrategy> make_strategy(const TrainPlan& plan, ModelRunner& runner, const DeviceMesh& mesh,
                                                    const nn::AdamWOptions& adamw);

// The uncut model under data parallelism alone: its runner and strategy (collective over the mesh).
// `side`: a group for what tests ask of naive DP, outside its exchanges' ledgers.
struct WholeModel {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<DataParallelStrategy> strategy;
};
WholeModel make_whole_model(const TrainPlan& plan, nn::GPT& model, const DeviceMesh& mesh, ProcessGroupPtr world,
                            ProcessGroupPtr side, const nn::AdamWOptions& adamw);

}  // namespace sl::parallel
