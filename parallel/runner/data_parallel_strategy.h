// data_parallel_strategy.h — what the Trainer holds beside the ModelRunner: how the replicas of this
// rank's part agree on one update. The runner computes gradients; the strategy averages them over
// the data-parallel ranks, clips them and steps the optimizer.
//
//   Trainer::train_step                                   a DataParallelStrategy
//   ───────────────────                                   ──────────────────────────────────────
//   strategy.zero_grad()                                  DDP: zero .grad; ZeRO: the flat buffer;
//   runner.forward_backward(..., hooks)                   FSDP: the gradient shards
//     hooks.before_backward(last) ───────────────────▶    DDP: no_sync() for all but the last
//                                                         ZeRO-2 / FSDP: shards add every backward
//   strategy.synchronize()                                DDP: wait for every bucket's all-reduce
//   strategy.finish_gradients(runner)                     the chapter's sums (runner.gradient_sums()):
//                                                         on .grad; ZeRO-2 / FSDP on the shards
//   strategy.full_gradients(runner)   (tests only)        the averaged gradient, whole
//   strategy.unscale_gradients(scaler)  (fp16)            ÷ the loss scale; the world agrees on a skip
//   strategy.clip_grad_norm(max)                          over the placements: each element once
//   strategy.step(lr)                                     AdamW: replicated, on shards, on the host
//
//   naive DP (parallel/data_parallel)  DDP (data_parallel)  ZeRO-1/2, FSDP, HSDP (parallel/zero)
//   parallel/nd/parallelize.cpp builds one for every layout (FSDP: zero/zero_strategies.h's fully_shard).
//
// The naive DataParallel is the one strategy that runs the step's passes itself (rank 0 scatters
// the batch): run_step() returns its loss where the others return nothing.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"
#include "nn/grad_scaler.h"
#include "parallel/comm/process_group.h"
#include "parallel/runner/model_runner.h"
#include "parallel/runner/state_pieces.h"

namespace sl::parallel {

// Expert parallelism's rule, which every strategy keeps: an expert's weight (placed sharded(0, "ep"):
// the stack of the E experts cut over ep, parallel/expert_parallel) lives on one ep rank, so it is
// not a replica over dp_cp as the other weights are. Its gradient is averaged over expert_dp_cp (the
// ranks that hold the same experts) and never over ep, which would mix different experts. An expert
// that no row reached in the step has no gradient in the serial model, and AdamW skips it there (no
// weight decay, no moment update): its .grad is dropped before the update here too, whatever zeros
// its replicas' reduction left (ModelRunner::unused_parameters, applied by finish_gradients).
bool is_expert_parameter(const nn::Placement& placement);

class DataParallelStrategy {
 public:
  virtual ~DataParallelStrategy() = default;

  virtual void zero_grad() = 0;
  // Before each of the runner's backward passes (BackwardHooks::before_backward).
  virtual void before_backward(bool last) { (void)last; }
  // After the runner's last backward, before its finish_gradients(): averages still in flight land.
  virtual void synchronize() {}
  // The runner's gradient sums (ModelRunner::gradient_sums) on wherever the averaged gradients
  // live: .grad by default; a strategy that shards gradients applies them to its shards.
  virtual void finish_gradients(ModelRunner& runner) { runner.finish_gradients(); }
  // For tests (Trainer::keep_gradients): the averaged gradient each parameter updates with, whole,
  // by serial name, before clipping. Collective over the strategy's groups and the runner's.
  virtual nn::StateDict full_gradients(ModelRunner& runner) = 0;
  // For debugging tools: this rank's final gradients as runs of its parameters' elements, where the
  // strategy keeps them (.grad by default; ZeRO's and FSDP's shards), read before clipping (Trainer's
  // before_update). No communication beyond finishing a reduction the step would do anyway.
  virtual std::vector<LocalGradientRun> local_gradients(ModelRunner& runner) { return whole_gradient_runs(runner.module()); }
  // fp16 loss scaling (nn/grad_scaler.h): divides this rank's averaged gradients by the scale in
  // place and says whether it found an inf or NaN among them (the Trainer agrees over the world).
  // A strategy whose gradients do not live in 16-bit-capable buffers refuses mixed precision in
  // TrainPlan::validate and never gets here.
  virtual bool unscale_gradients(const nn::GradScaler& scaler) {
    (void)scaler;
    throw Error("this data-parallel strategy does not run mixed precision");
  }
  // Clips the averaged gradient to max_norm (max_norm > 0), counting each logical element once.
  // Returns the norm before clipping (naive DP: on rank 0, which steps; 0 on the others).
  virtual double clip_grad_norm(double max_norm) = 0;
  virtual void step(double lr) = 0;
  // Collective: the whole model under serial names on every rank.
  virtual nn::StateDict full_state_dict(ModelRunner& runner) { return runner.full_state_dict(); }
  // Distributed checkpoints (parallel/checkpoint, train/checkpointing.h): the training state this
  // rank holds, as runs of its parameters' elements (state_pieces.h), each a view of the live state
  // so that a load writes it in place. AdamW's moments exist after this call even before the first
  // step (zeros), so a fresh run can load into them.
  virtual std::vector<LocalStateRun> local_state(ModelRunner& runner) = 0;
  // AdamW's step count (its bias correction): the same for every parameter, which all step together.
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t steps) = 0;
  // The parameters (serial names) whose AdamW step count is not the others': DDP's experts that
  // computed no row in some step, which AdamW skipped. Empty where every parameter steps together
  // (optimizer_steps() then holds for all; it throws while this is not empty). build/bin/diverge
  // carries these into its serial runs, which a checkpoint's single count cannot.
  virtual std::map<std::string, int64_t> parameters_behind() const { return {}; }
  // The most steps any of this rank's parameters took (optimizer_steps() when they step together).
  virtual int64_t most_optimizer_steps() const { return optimizer_steps(); }
  // The groups the strategy talks on, each under the printed name of what it spans ("dp", "dp_shard",
  // "dp_replicate": name(MeshDim)), as ledgers and reports show them.
  virtual std::vector<std::pair<std::string, const CommLedger*>> groups() const = 0;

  // A strategy that runs the forward and backward passes itself (naive DP) does so here and returns
  // the global batch's mean loss; the others return nothing and the runner runs them.
  virtual std::optional<double> run_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows,
                                         int64_t block_size) {
    (void)data, (void)step, (void)batch_rows, (void)block_size;
    return std::nullopt;
  }
};

}  // namespace sl::parallel
