// dp_trainer.h — one training step for every data-parallel layout, picked by a small struct, so the
// train program, the data_parallel benchmark and the lessons switch layouts with a flag.
//
//   plan                     what runs (each rank: its rows of the global batch, same seed everywhere)
//   {}                       DDP: bucketed all-reduce overlapped with backward (parallel/data_parallel/ddp.h)
//   {.naive = true}          the classic DataParallel: rank 0 scatters, gathers, steps (naive_data_parallel.h)
//   {.zero = 1 | 2}          ZeRO-1/2: sharded AdamW state (and gradients) (parallel/zero/zero.h)
//   {.zero = 1|2, .offload}  ... with the optimizer state, master weights and update on the host
//   {.zero = 3}              FSDP: parameters sharded per Block (parallel/zero/fsdp.h)
//   {.zero = 3, .offload}    ... with every shard and the update on the host (FsdpOptions::offload)
//   {.replicate = R, .shard = S}   HSDP: FSDP within S ranks, all-reduce across R replicas
//
// Every layout returns the same number from train_step: the mean loss of the global batch (an
// all-reduce on a group of its own, so the technique's own ledger stays exact).
//
//   Tests: tests/test_dp_trainer.cpp (every layout against a serial nn::GPT + nn::AdamW run)
#pragma once
#include <memory>
#include <string>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"

namespace sl::parallel {

struct DataParallelPlan {
  int zero = 0;          // 0: DDP; 1, 2: ZeRO stage; 3: FSDP
  bool naive = false;    // the classic DataParallel instead of DDP
  bool offload = false;  // ZeRO-1/2/3: optimizer state and update on the host
  int replicate = 0;     // HSDP when > 0: dp_replicate x dp_shard (= world size)
  int shard = 0;
  std::string name() const;  // "ddp", "naive", "zero1", "zero2+offload", "fsdp", "hsdp2x2"
};

class DataParallelTrainer {
 public:
  // Collective over ctx.world. The model must be built with the same seed on every rank.
  DataParallelTrainer(nn::GPT& model, RankContext& ctx, const DataParallelPlan& plan,
                      const nn::AdamWOptions& adamw);
  ~DataParallelTrainer();

  // One optimizer step on global batch `step` of `batch_rows` rows (this rank takes its share).
  // grad_clip <= 0: no clipping. Returns the global mean loss, the same on every rank.
  double train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                    double grad_clip);

  nn::StateDict full_state_dict();  // collective: the whole model on every rank

  // For tests: from the next train_step on, keep the gradient each step updates with (averaged over
  // the ranks, before clipping), whole on every rank, so it can be compared with a serial run's
  // .grad. Where gradients are sharded (ZeRO-2, FSDP, HSDP) keeping them costs an all-gather per
  // step, counted in communication(); naive DP's, on rank 0 only, are broadcast outside it.
  void keep_gradients();
  const nn::StateDict& full_gradients() const;  // by parameter name; empty before a kept step

  CommStats communication() const;  // this rank's calls and bytes in the technique's groups
  std::string communication_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The bytes this rank holds now and at peak, per category, on its device: for the memory tables.
std::string memory_table_row(int rank, Device device);
std::string memory_table_header();

}  // namespace sl::parallel
