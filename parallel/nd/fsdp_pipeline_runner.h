// fsdp_pipeline_runner.h — FSDP (ZeRO-3) over each pipeline stage: torchtitan's pp × dp_shard, where
// pp is outer and every stage's chunk is sharded over the dp_shard ranks that hold that stage.
//
//   pp rank 0 (stage 0)                         pp rank 1 (stage 1)
//   ┌─ dp_shard 0 ─┐ ┌─ dp_shard 1 ─┐           ┌─ dp_shard 0 ─┐ ┌─ dp_shard 1 ─┐
//   │ ½ wte, wpe,  │ │ ½ wte, wpe,  │  ═ acts ═▶ │ ½ h.1, ln_f, │ │ ½ h.1, ln_f, │
//   │ ½ h.0        │ │ ½ h.0        │           │ ½ wte (tied) │ │ ½ wte (tied) │
//   └──────────────┘ └──────────────┘           └──────────────┘ └──────────────┘
//
//   The pipeline (parallel/pipeline) runs the stage as always; a FullyShardedGPT (parallel/zero) over
//   the stage's chunk hooks the chunk's forward_part and blocks as the engine calls them, so each
//   micro-batch's forward and backward gather a unit and its backward reduce-scatters into the
//   shards, which add up over the micro-batches until the step.
//
//   The tied wte: the first stage's wte unit and the last stage's copy have equal layouts over
//   dp_shard (rank j of one holds the same elements as rank j of the other), so after the schedule
//   finish_gradients() sums the two gradient SHARDS between pp ranks {0, p-1}, as the plain pipeline
//   sums whole gradients (inside the schedule the two ranks would wait on each other's 1F1B order).
//   The clip counts the last stage's copy out (FullyShardedGPT::clip_grad_norm with the pp group).
//
//   Memory per rank: 16/dp_shard of its stage's parameters (f32 AdamW) between steps, plus one
//   gathered unit (and the chunk's root) while it computes.
//
//   Rules (check_fsdp_pipeline): one chunk per rank (no interleaving), the plain chunks (tp = cp = 1),
//   not the zero-bubble schedule (its W actions would fill a unit's gradients after the unit's next
//   forward), dp_replicate 1 (no HSDP) and no offload.
//
//   Tests: tests/test_nd_parallel.cpp (pp2_fsdp2, pp3_fsdp2, ...)
#pragma once
#include <memory>

#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/zero/fsdp.h"

namespace sl::parallel {

// Throws sl::Error naming the values unless FSDP can shard the stages of this pipeline on `mesh`'s
// config (pp, tp, cp, dp_replicate) with `options`; offload: whether --offload was asked for.
void check_fsdp_pipeline(const ParallelismConfig& parallelism, const PipelineOptions& options, bool offload);

class FsdpPipelineRunner : public PipelineRunner {
 public:
  // Collective over pp (the tied wte's group). The stage is sharded by own_strategy(), after
  // load_full_state_dict (train --init-from) has given it its weights.
  FsdpPipelineRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                     const PipelineOptions& options);

  // Shards the stage's chunk over mesh.group("dp_shard") with AdamW on the shards; the strategy
  // clips over pp too. Once.
  std::unique_ptr<DataParallelStrategy> own_strategy(const DeviceMesh& mesh, const nn::AdamWOptions& adamw) override;
  void finish_gradients() override;          // the tied wte's gradient shards summed over {0, p-1}
  nn::StateDict full_state_dict() override;  // collective over dp_shard and pp
  nn::StateDict full_gradients() override;
  void load_full_state_dict(const nn::StateDict& full) override;  // before own_strategy()

  FullyShardedGPT* fsdp() const { return fsdp_.get(); }

 private:
  std::shared_ptr<FullyShardedGPT> fsdp_;
};

}  // namespace sl::parallel
