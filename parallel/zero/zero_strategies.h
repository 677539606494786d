// zero_strategies.h — the chapter as the Trainer's data-parallel strategy
// (parallel/runner/data_parallel_strategy.h).
//
//                    ZeroStrategy (ZeRO-1/2, zero_adamw.h)        FsdpStrategy (FSDP/HSDP, fsdp.h)
//   zero_grad        the flat gradient buffer / shards            — (zeroed after the last step)
//   backward passes  ZeRO-1: .grad adds into the flat buffer;     each unit reduce-scatters into its
//                    ZeRO-2: each backward reduce-scatters        gradient shard (HSDP: + all-reduce
//                    into the gradient shard                      across replicas)
//   clip             the shards' norm (+ the cut's placements)    the shards' norm (+ a stage group's)
//   step             reduce-scatter (stage 1), AdamW on the       AdamW on every unit's shard, then
//                    shard, all-gather the weights                zero the shards
//
// Both work on whichever part of the model a runner holds: the whole GPT, or a chapter's cut (a
// pipeline stage, a TP shard, a sequence shard) whose placements the clip reads.
#pragma once
#include <memory>

#include "parallel/comm/mesh.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/zero_adamw.h"

namespace sl::parallel {

class ZeroStrategy : public DataParallelStrategy {
 public:
  // ZeRO-`stage` (1 or 2) over mesh.group("dp_shard") on runner.module()'s parameters. `cut`: the
  // runner holds a cut of the model (its gradients are gathered through it, its clip reads the
  // placements over the mesh). The runner and the mesh must outlive it.
  ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload, bool cut,
               const nn::AdamWOptions& adamw);
  void zero_grad() override { zero_->zero_grad(); }
  nn::StateDict full_gradients(ModelRunner& runner) override;
  void clip_grad_norm(double max_norm) override;
  void step(double lr) override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;
  ZeroAdamW& optimizer() { return *zero_; }

 private:
  ModelRunner& runner_;
  const DeviceMesh& mesh_;
  bool cut_;
  std::unique_ptr<ZeroAdamW> zero_;
};

class FsdpStrategy : public DataParallelStrategy {
 public:
  // Steps `fsdp` (owned by whoever built it: the Trainer for the whole model, a runner for its
  // stage). stage_group: a pipeline stage's part (the norm adds the other stages'; the gradients
  // and weights are gathered through the runner); null for the whole model.
  FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ProcessGroupPtr stage_group = nullptr);
  void zero_grad() override {}  // the shards were zeroed after the last step
  nn::StateDict full_gradients(ModelRunner& runner) override;
  void clip_grad_norm(double max_norm) override { fsdp_->clip_grad_norm(max_norm, stage_group_); }
  void step(double lr) override;
  nn::StateDict full_state_dict(ModelRunner& runner) override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;

 private:
  std::shared_ptr<FullyShardedGPT> fsdp_;
  ProcessGroupPtr stage_group_;
};

}  // namespace sl::parallel
