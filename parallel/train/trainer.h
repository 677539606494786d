// trainer.h — one training step for every layout, over a DeviceMesh. The Trainer holds this rank's
// ModelRunner (what part of the model it computes: parallel/runner/model_runner.h) and a
// DataParallelStrategy beside it (how the replicas agree: parallel/runner/data_parallel_strategy.h);
// parallelize (parallel/nd/parallelize.h) builds both, and the mesh, from a TrainPlan's options:
//
//   plan.validate(ctx.world_size);
//   Trainer trainer(ctx, plan, parallelize(config, seed, ctx.world, plan.parallelize_options(adamw)));
//
// No chapter writes its own loop.
//
// One step, for every layout (Trainer::train_step):
//
//   global batch, B rows ──split over dp──▶ B/dp rows on this rank ──cut──▶ M micro-batches of B/(dp·M)
//   counted targets: c_m per micro-batch, C = Σ over every rank and micro-batch (one all-reduce)
//   strategy.zero_grad()
//   runner.forward_backward: for m in 0..M-1:  backward( loss_m · c_m · dp / C )
//     (parallel/runner/micro_batches.h; strategy.before_backward(last) before each: DDP's no_sync)
//   strategy.synchronize(), runner.finish_gradients()   the chapter's own sums (tied wte, SP, cp)
//   averaged over dp, the gradient is that of Σ loss_m · c_m / C, the serial loss: the mean over the
//   global batch's counted targets, however they fall on ranks and micro-batches (Megatron's rule)
//   fp16: strategy.unscale_gradients; an inf/NaN on any rank skips the step on every rank
//   strategy.clip_grad_norm (counting each element once: parallel/comm/grad_norm.h), strategy.step
//
// Invalid plans raise sl::Error before any communication, naming the values.
//
//   Tests: tests/parallel/train/test_trainer.cpp (every layout, with micro-batches, against a serial nn::GPT + nn::AdamW)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/nd/parallelize.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/model_runner.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel {

class Trainer {
 public:
  // Runs `parts`, what parallelize() built for `plan` on ctx.world (collective over it: a group for
  // the counts and the loss). Throws sl::Error naming the values unless the plan is valid, and
  // unless the part's weights have the plan's mixed-precision dtype.
  Trainer(RankContext& ctx, const TrainPlan& plan, Parallelized parts);
  ~Trainer();

  // One optimizer step on global batch `step` of `batch_rows` rows (this rank takes its share, cut
  // into the plan's micro-batches). grad_clip <= 0: no clipping. Returns the global batch's mean
  // loss, the same on every rank. Throws before any communication unless batch_rows divides by
  // dp x micro_batches, showing the arithmetic.
  double train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                    double grad_clip);

  nn::StateDict full_state_dict();  // collective: the whole model on every rank
  const DeviceMesh& mesh() const;
  // This rank's part of the model and how it runs (naive DP: the whole model, whose passes its
  // strategy runs): the pipeline's runner can be asked for more (its timeline for --trace).
  ModelRunner* runner() const;
  // How the replicas agree (the optimizer's state lives there: a checkpoint reads and writes it).
  DataParallelStrategy& strategy() const;

  // For tests: from the next train_step on, keep the gradient each step updates with (averaged over
  // the ranks, before clipping), whole on every rank, so it can be compared with a serial run's
  // .grad. Where gradients are sharded (ZeRO-2, FSDP, HSDP) keeping them costs an all-gather per
  // step, counted in communication(); naive DP's, on rank 0 only, are broadcast outside it.
  void keep_gradients();
  const nn::StateDict& full_gradients() const;  // by parameter name; empty before a kept step
  // For debugging tools (build/bin/diverge, parallel/train/divergence.h): called on this rank inside
  // every train_step from now on: after_backward after the backward passes and DDP's averages, before
  // the chapter's own sums (runner.finish_gradients); before_update when the gradients are final
  // (summed, averaged, unscaled), before clipping and the optimizer step. Naive DP runs its passes in
  // its strategy: only before_update is called there.
  struct StepHooks {
    std::function<void()> after_backward, before_update;
  };
  void set_step_hooks(StepHooks hooks);
  // The global gradient norm before clipping of the last step that clipped (grad_clip > 0), counted
  // over the mesh by the strategy: each logical element once. 0 before any.
  double last_grad_norm() const;
  // fp16 loss scaling (plan.precision.loss_scale): the scale, the steps skipped on an overflow.
  const nn::GradScaler& scaler() const;
  nn::GradScaler& scaler();  // a resumed run restores it (nn::GradScaler::restore)

  CommStats communication() const;  // this rank's calls and bytes in the technique's groups
  std::string communication_report() const;
  // For the run report (run_report.h): every group this rank talks on, by name ("dp", "dp_shard",
  // "dp_replicate", "naive:<exchange>", "pp", "cp", "tp", and "loss" for the counts and the loss),
  // with its ledger;
  // and the time spent inside train_step so far, and the part of it blocked in those groups.
  std::vector<std::pair<std::string, const CommLedger*>> ledgers() const;
  double step_seconds() const;
  double step_blocked_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sl::parallel
