// model_runner.h — what parallel/nd/parallelize.h hands the Trainer: this rank's part of the GPT
// (the whole model, a pipeline stage, a tp slice, a sequence shard, any mix) and how one step runs
// on it. Two implementations: PartRunner (part_runner.h: the plain micro-batch loop over one part)
// and the pipeline's PipelineRunner (parallel/pipeline/pipeline_runner.h: stages run by a schedule).
//
//   Trainer::train_step (parallel/train)               a ModelRunner
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
  // The parameters the serial model computes no gradient for in this step (an expert that no row
  // reached: parallel/expert_parallel); none by default.
  virtual std::vector<Tensor> unused_parameters() { return {}; }
  // gradient_sums() applied to the parameters' .grad (a parameter without one gets zeros first),
  // then unused_parameters()' .grad dropped, so that AdamW skips them as it does serially (no weight
  // decay, no moment update), whatever zeros a replica's reduction left there.
  void finish_gradients();

  // Groups the runner made itself, beyond the mesh's (the pipeline's tied-wte pair), for the run
  // report: (name, ledger). None by default.
  virtual std::vector<std::pair<std::string, const CommLedger*>> own_groups() const { return {}; }

  // This rank's gradients with placements, for clip_grad_norm over the mesh.
  virtual std::vector<MeshGrad> mesh_grads() { return parallel::mesh_grads(module()); }

  // Collective over the chapter's groups: the whole model (or its gradients) under the serial names
  // and shapes, on every rank.
  virtual nn::StateDict full_state_dict() = 0;
  virtual nn::StateDict full_gradients() = 0;
  // The same from this rank's part given whole, by its parameters' names (FSDP gathers its shards
  // into them first: zero/zero_strategies.h).
  virtual nn::StateDict full_state_dict_from(const nn::StateDict& part) = 0;

  // Starts from the serial model's weights (train --init-from): each rank takes its part of `full`
  // (no communication): the serial tensor of the same name, or its slice where the cut slices it.
  virtual void load_full_state_dict(const nn::StateDict& full) = 0;
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
