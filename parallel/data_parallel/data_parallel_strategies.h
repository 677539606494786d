// data_parallel_strategies.h — the chapter's two designs as the Trainer's data-parallel strategy
// (parallel/runner/data_parallel_strategy.h): what each does at each point of the one step.
//
//                      DdpStrategy (ddp.h)                    NaiveStrategy (naive_data_parallel.h)
//   zero_grad          zero .grad (every rank)                rank 0's .grad
//   the passes         the runner's, DDP's hooks all-reduce   run_step(): rank 0 scatters the batch,
//                      buckets during the last backward       gathers logits, scatters dloss, gathers grads
//   before_backward    no_sync() for all but the last         —
//   synchronize        wait for every bucket                  —
//   clip, step         every rank, on identical gradients     rank 0 alone, then its weights are
//                                                             replicated in the next step's exchange 2
//
// A model cut by another chapter (pp, tp, cp) at dp 1 has no replicas: DdpStrategy then holds only
// AdamW (no DDP, so no bucket rules for an interleaved stage, whose last backward covers one chunk).
#pragma once
#include <memory>
#include <optional>

#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "parallel/comm/mesh.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "parallel/runner/data_parallel_strategy.h"

namespace sl::parallel {

class DdpStrategy : public DataParallelStrategy {
 public:
  // DDP over mesh.group(MeshDim::dp) around runner.module() (collective: broadcasts the weights), unless
  // `replicate` is false (one replica: AdamW alone). Experts (is_expert_parameter) are left out of
  // it and get a DDP of their own over expert_dp_cp, when that has more than one rank. The runner and the mesh must outlive it.
  // Mixed precision (`precision`): the buckets in its grad_dtype, AdamW with f32 master weights.
  // `comm_hook`: reduces each bucket in place of DDP's all-reduce (comm_hook.h); unused with one replica.
  DdpStrategy(ModelRunner& runner, const DeviceMesh& mesh, bool replicate, const nn::AdamWOptions& adamw,
              const nn::MixedPrecision& precision = {}, const CommHookFactory& comm_hook = {});
  void zero_grad() override;
  void before_backward(bool last) override;
  void synchronize() override;
  nn::StateDict full_gradients(ModelRunner& runner) override { return runner.full_gradients(); }
  bool unscale_gradients(const nn::GradScaler& scaler) override;
  double clip_grad_norm(double max_norm) override;  // replicas: the norm moves no bytes over dp
  void step(double lr) override;
  // Every parameter whole, with AdamW's state: replicas over dp and cp (cp ranks hold the same weights).
  std::vector<LocalStateRun> local_state(ModelRunner& runner) override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;
  std::map<std::string, int64_t> parameters_behind() const override;
  int64_t most_optimizer_steps() const override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;

 private:
  ModelRunner& runner_;
  const DeviceMesh& mesh_;
  std::unique_ptr<DistributedDataParallel> ddp_;  // null with one replica
  std::unique_ptr<DistributedDataParallel> expert_ddp_;  // the experts' (null without experts or their replicas)
  std::vector<Tensor> experts_;                          // their parameters
  std::unique_ptr<nn::AdamW> adamw_;
  nn::MixedPrecision precision_;
  std::optional<DistributedDataParallel::NoSyncGuard> local_only_, experts_local_only_;  // between backward passes
};

class NaiveStrategy : public DataParallelStrategy {
 public:
  // Over world (the NaiveDataParallel's exchanges are made by its first step, for that batch shape).
  // `side` carries what only tests ask for (the kept gradients) outside the exchanges' ledgers.
  NaiveStrategy(nn::GPT& model, ProcessGroupPtr world, ProcessGroupPtr side, const nn::AdamWOptions& adamw);
  std::optional<double> run_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows,
                                 int64_t block_size) override;
  void zero_grad() override {}                                 // rank 0's, in run_step (before its exchanges)
  nn::StateDict full_gradients(ModelRunner& runner) override;  // rank 0's, broadcast on `side`
  double clip_grad_norm(double max_norm) override;
  void step(double lr) override;
  nn::StateDict full_state_dict(ModelRunner& runner) override;                     // replicates rank 0's weights first
  // Rank 0's weights and AdamW state (the others' weights are replicas of the last exchange).
  std::vector<LocalStateRun> local_state(ModelRunner& runner) override;
  int64_t optimizer_steps() const override;
  void set_optimizer_steps(int64_t steps) override;
  std::vector<std::pair<std::string, const CommLedger*>> groups() const override;  // "naive:<exchange>"

 private:
  bool root() const { return world_->rank() == NaiveDataParallel::kRoot; }
  nn::GPT& model_;
  ProcessGroupPtr world_, side_;
  nn::AdamWOptions adamw_options_;
  std::unique_ptr<NaiveDataParallel> naive_;
  std::unique_ptr<nn::AdamW> adamw_;  // rank 0 only
};

}  // namespace sl::parallel
