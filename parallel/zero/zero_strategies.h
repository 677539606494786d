// zero_strategies.h — the chapter as the Trainer's data-parallel strategy
// (parallel/runner/data_parallel_strategy.h).
//
//                    ZeroStrategy (ZeRO-1/2, zero_adamw.h)        FsdpStrategy (FSDP/HSDP, fsdp.h)
//   zero_grad        the flat gradient buffer / shards            — (zeroed after the last step)
//   backward passes  ZeRO-1: .grad adds into the flat buffer;     each unit reduce-scatters into its
//                    ZeRO-2: each backward reduce-scatters        gradient shard (HSDP: + all-reduce
//                    into the gradient shard                      across replicas)
//   the cut's sums   ZeRO-1: on .grad (views of the flat buffer);  on the units' shards, except over
//                    ZeRO-2: on the shard (sharded_gradients.h)   the dims the shard group spans (cp)
//   clip             the shards' norm (+ the cut's placements)    the shards' norm (+ the cut's placements)
//   step             reduce-scatter (stage 1), AdamW on the       AdamW on every unit's shard, then
//                    shard, all-gather the weights                zero the shards
//
// Both work on whichever part of the model a runner holds: the whole GPT, or a chapter's cut (a
// pipeline stage, a TP shard, a sequence shard, any mix) whose placements the clip reads.
// fully_shard() is FSDP's one entry: parallel/nd/parallelize.cpp calls it on every layout it shards.
// An expert-parallel model (ep > 1) keeps its experts out of ZeRO's flat buffers and FSDP's units
// (expert_replicas.h: whole, averaged over expert_dp_cp, their own AdamW).
#pragma once
#include <memory>

#include "nn/mixed_precision.h"
#include "parallel/comm/mesh.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/zero/expert_replicas.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/sharded_gradients.h"
#include "parallel/zero/zero_adamw.h"

namespace sl::parallel {

class ZeroStrategy : public DataParallelStrategy {
 public:
  // ZeRO-`stage` (1 or 2) over mesh.group(MeshDim::dp_shard) on runner.module()'s parameters (its gradients
  // are gathered through the runner, its clip reads the placements over the mesh). The runner and
  // the mesh must outlive it.
  // An expert-parallel model (ep > 1, parallel/expert_parallel): the flat buffers hold every weight
  // but the experts and shard over dp_shard x ep (the ranks that replicate those weights); the
  // experts stay whole in .grad, averaged over expert_dp_cp, stepped by a whole nn::AdamW
  // (expert_replicas.h: ZeRO's saving on the replicated weights only), the unused ones skipped.
  // Mixed precision (`precision`): the flat buffers hold the model's 16-bit weights, the gradients
  // precision.grad_dtype, and AdamW an f32 master shard.
  ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload, const nn::AdamWOptions& adamw,
               const nn::MixedPrecision& precision = {});
  void zero_grad() override;
  void finish_gradients(ModelRunner& runner) override;  // ZeRO-2: the runner's sums on the shard
  nn::StateDict full_gradients(ModelRunner& runner) override;
  double clip_grad_norm(double max_norm) override;
  bool unscale_gradients(const nn::GradScaler& scaler) override { return zero_->unscale_gradients(scaler); }
  void step(double lr) override;
  // The weights whole (every rank holds them: replicas over dp and cp), AdamW's state as my shard of
  // it (replicas over cp and dp_replicate).
  std::vector<LocalStateRun> local_state(ModelRunner& runner) override;
  std::vector<LocalGradientRun> local_gradients(ModelRunner& runner) override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;
  ZeroAdamW& optimizer() { return *zero_; }

 private:
  ModelRunner& runner_;
  const DeviceMesh& mesh_;
  MeshDims shard_dims_{MeshDim::dp_shard};  // the flat buffers' group: dp_shard, or dp_shard x ep with experts
  std::unique_ptr<ZeroAdamW> zero_;
  std::unique_ptr<ExpertReplicas> experts_;  // an expert-parallel model's experts (null without)
  std::vector<std::string> names_;           // the flat layout's segments: runner.module()'s parameters but the experts
  std::vector<nn::Placement> placements_;    // theirs
};

class FsdpStrategy : public DataParallelStrategy {
 public:
  // Steps `fsdp`, built over the part `runner` runs (fully_shard below): the gradients and weights
  // are gathered through the runner, its gradient_sums() act on the units' shards except those over
  // dp_shard and cp (the shard group spans them: the reduce-scatter has summed over them), and the
  // clip counts each piece as its parameter's placement says, split over dp_shard x cp. The runner
  // and mesh must outlive it.
  // `experts`: an expert-parallel model's experts, left out of fsdp's units (fully_shard).
  FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ModelRunner& runner, const DeviceMesh& mesh,
               std::unique_ptr<ExpertReplicas> experts = nullptr);
  // step() zeroes the shards after it, but a step skipped on an fp16 overflow never gets there and
  // leaves them holding inf: they are zeroed here too, or every later step would overflow again.
  void zero_grad() override;
  void finish_gradients(ModelRunner& runner) override;
  nn::StateDict full_gradients(ModelRunner& runner) override;
  double clip_grad_norm(double max_norm) override;
  bool unscale_gradients(const nn::GradScaler& scaler) override;  // every unit's shard
  void step(double lr) override;
  nn::StateDict full_state_dict(ModelRunner& runner) override;
  // Every unit's shard: weights, AdamW's state, the f32 master (replicas over dp_replicate: HSDP).
  std::vector<LocalStateRun> local_state(ModelRunner& runner) override;
  std::vector<LocalGradientRun> local_gradients(ModelRunner& runner) override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;

 private:
  std::vector<NamedShard> shards() const;  // every unit's gradient shard

  std::shared_ptr<FullyShardedGPT> fsdp_;
  ModelRunner& runner_;
  const DeviceMesh& mesh_;
  MeshDims shard_dims_{MeshDim::dp_shard, MeshDim::cp};  // with experts: dp_shard x ep x cp
  std::unique_ptr<ExpertReplicas> experts_;              // null without
};

// FSDP (ZeRO-3) over `part`, the model part `runner` runs (the whole GPT, or what a cut leaves on
// this rank: a pipeline stage, a tp slice, a sequence shard): its parameters sharded unit by unit
// over mesh.group(MeshDim::dp_shard_cp) (torchtitan's dp_shard_cp: the cp ranks hold the same weights), the
// summed gradients divided by dp_shard alone (the cp ranks' parts of one replica's gradient add),
// and HSDP's all-reduce of each shard over dp_replicate when it is > 1. `options`: offload and the
// gradients' dtype (its gradient_divisor is set here). Collective over those groups. Load the
// part's weights (train --init-from) before: its parameters are freed into the shards.
// An expert-parallel part (ep > 1): the units leave the experts out (FsdpOptions::leave_out), the
// rest averaged over dp_shard x ep (the shard group spans ep: they are replicas there); the experts
// stay whole, averaged over expert_dp_cp and stepped by their own AdamW (expert_replicas.h).
std::unique_ptr<FsdpStrategy> fully_shard(nn::GPT& part, ModelRunner& runner, const DeviceMesh& mesh,
                                          const nn::AdamWOptions& adamw, FsdpOptions options = {});

}  // namespace sl::parallel
