// model_runner.h — what a chapter that cuts the model (pipeline stages, tensor-parallel shards,
// sequence shards) hands the Trainer: this rank's part of the GPT and how one step runs on it.
//
//   Trainer::train_step (parallel/train)               a ModelRunner (one per chapter)
//   ─────────────────────────────────                  ─────────────────────────────────────────
//   split the global batch over dp, cut micro-batches
//   C = counted targets of the whole global batch
//   strategy.zero_grad()  (data_parallel_strategy.h)
//                                          ─────────▶  forward_backward(micros, C, dp, hooks):
//                                                      every micro-batch's loss_m weighted by
//                                                      counted_m · dp / C; hooks.before_backward
//                                                      called before each backward it runs
//                                                      (micro_batches.h: the one loop)
//   strategy.synchronize()  (DDP's buckets done)
//   strategy.finish_gradients(runner) ─────▶  gradient_sums(): the chapter's own sums (tied wte
//                                             between stages, SP LayerNorms over tp, all over cp),
//                                             applied to .grad, or by ZeRO-2 / FSDP to the shards
//   strategy: clip over mesh_grads(), AdamW step
//
// The ranks of one data-parallel replica (its pp × cp × tp ranks) get the same micro-batches; the
// runner decides which part of them each rank computes (its stage, its heads, its sequence shard).
// After the data-parallel average over dp, every parameter's gradient must be the serial model's.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/mesh.h"

namespace sl::parallel {

class DataParallelStrategy;  // data_parallel_strategy.h

// One of a chapter's gradient sums: after the backward passes, the gradients of `params` (this rank's
// parameter names, module() order) are added over `group`'s ranks. A sum is linear, so it commutes
// with data parallelism's average: DDP applies it to .grad after the all-reduce, ZeRO-2 and FSDP to
// the pieces of their gradient shards that belong to `params` (the shard layouts of a group's ranks
// are equal). `over` names what the ranks span: a mesh dim (tp, cp), or none for a group of the
// runner's own (the pipeline's tied wte copies).
struct GradientSum {
  std::optional<MeshDim> over;
  ProcessGroupPtr group;
  std::vector<std::string> params;
};

struct BackwardHooks {
  // Called right before each backward pass the runner starts on this rank, in the order they run;
  // `last` is true for the rank's last one of the step. DDP runs all but the last under no_sync.
  std::function<void(bool last)> before_backward;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // This rank's parameters under the serial model's names ("h.3.mlp.c_fc.weight"), each with its
  // placement: DDP and ZeRO-1 wrap this module over the data-parallel group.
  virtual nn::Module& module() = 0;

  // Forward and backward over this rank's micro-batches (the same on every rank of the replica).
  // Returns this rank's share of the serial loss, Σ_m loss_m · counted_m / global_count, or 0 where
  // holds_loss() is false: summed over the ranks that hold it, the shares give the serial loss.
  virtual double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                                  const BackwardHooks& hooks) = 0;
  // Whether forward_backward's result counts on this rank (one rank per part of the loss: the last
  // pipeline stage, tp rank 0, every cp rank for its tokens).
  virtual bool holds_loss() const = 0;

  // The chapter's own gradient sums after the backward passes (the same list, in the same order, on
  // every rank of each group); none by default.
  virtual std::vector<GradientSum> gradient_sums() { return {}; }
  // gradient_sums() applied to the parameters' .grad (a parameter without one gets zeros first).
  void finish_gradients();

  // A runner that brings its own data-parallel strategy (FSDP over a pipeline stage, parallel/nd:
  // the sharding reaches into how the stage gathers and sums) returns it here; the Trainer asks
  // when the plan shards parameters. Null by default: the Trainer builds the strategy itself.
  virtual std::unique_ptr<DataParallelStrategy> own_strategy(const DeviceMesh& mesh, const nn::AdamWOptions& adamw);

  // Groups the runner made itself, beyond the mesh's (the pipeline's tied-wte pair), for the run
  // report: (name, ledger). None by default.
  virtual std::vector<std::pair<std::string, const CommLedger*>> own_groups() const { return {}; }

  // This rank's gradients with placements, for clip_grad_norm over the mesh.
  virtual std::vector<MeshGrad> mesh_grads() { return parallel::mesh_grads(module()); }

  // Collective over the chapter's groups: the whole model (or its gradients) under the serial names
  // and shapes, on every rank.
  virtual nn::StateDict full_state_dict() = 0;
  virtual nn::StateDict full_gradients() = 0;

  // Starts from the serial model's weights (train --init-from): each rank takes its part of `full`
  // (no communication). By default every local parameter is the serial one of the same name and
  // shape (a pipeline stage, a sequence shard's replica); a runner whose parameters are slices (a TP
  // shard) overrides this to cut them.
  virtual void load_full_state_dict(const nn::StateDict& full);
};

// The uncut model: data parallelism alone (DDP, ZeRO, FSDP) runs the whole GPT on every rank.
// `loss` computes one micro-batch's mean loss (FSDP's gathers its units around the model's forward).
class WholeModelRunner : public ModelRunner {
 public:
  using LossFn = std::function<Tensor(const Tensor& inputs, const Tensor& targets)>;
  WholeModelRunner(nn::Module& model, LossFn loss) : model_(model), loss_(std::move(loss)) {}
  nn::Module& module() override { return model_; }
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return true; }
  nn::StateDict full_state_dict() override;  // this rank's parameters: whole when they are replicas
  nn::StateDict full_gradients() override;   // this rank's .grad, zeros where there is none

 private:
  nn::Module& model_;
  LossFn loss_;
};

// A parameter's gradient, or zeros of its shape, dtype and device where backward left none (a
// parameter this rank did not use). Not a copy: clone it to keep it.
Tensor grad_or_zeros(const Tensor& param);
// Every parameter's gradient (or zeros), copied, by name: a replica's gradients, whole.
nn::StateDict gradients_of(const nn::Module& module);
// The names of module's parameters, all of them or those whose placement is partial over `dim`.
std::vector<std::string> parameter_names(const nn::Module& module);
std::vector<std::string> partial_over(const nn::Module& module, MeshDim dim);

}  // namespace sl::parallel
