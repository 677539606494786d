// trainer.h — one training step for every layout, over a DeviceMesh. The train program, the
// benchmarks and the lessons switch layouts by changing a TrainPlan; the chapters plug their pieces
// in here instead of writing their own loop.
//
//   plan.parallelism (a ParallelismConfig)   zero  what runs on each rank
//   {.dp_replicate = N}                      0     DDP: bucketed all-reduce overlapped with backward
//   {.dp_replicate = N}, .naive              0     the classic DataParallel: rank 0 scatters, gathers, steps
//   {.dp_shard = N}                          1|2   ZeRO-1/2: sharded AdamW state (and gradients)
//   {.dp_shard = N}                          3     FSDP: parameters sharded per Block
//   {.dp_replicate = R, .dp_shard = S}       3     HSDP: FSDP within S ranks, all-reduce across R replicas
//   .offload with zero 1|2|3 (no replicas):  the optimizer state, master weights and update on the host
//   {.pp | .tp | .cp = K} x dp               0|1   a chapter cuts the model (a ModelRunner: stage, TP
//                                                  shard, sequence shard), DDP or ZeRO-1 over dp
//   {.pp = K, .dp_shard = N}                 3     FSDP over each pipeline stage's chunk (ModelRunner::
//                                                  shard_parameters; tp = cp = 1, naive/gpipe/1f1b)
//   TrainPlan::data_parallel(N, zero) gives the first rows' meshes.
//
// One step, for every layout (Trainer::train_step):
//
//   global batch, B rows ──split over dp──▶ B/dp rows on this rank ──cut──▶ M micro-batches of B/(dp·M)
//   counted targets: c_m per micro-batch, C = Σ over every rank and micro-batch (one all-reduce)
//   for m in 0..M-1:  backward( loss_m · c_m · dp / C )     gradient sync only after the last one
//   (the ModelRunner runs them: model_runner.h)
//                     (DDP: no_sync; ZeRO-1: the flat buffer adds; ZeRO-2/FSDP: shards add)
//   averaged over dp, the gradient is that of Σ loss_m · c_m / C, the serial loss: the mean over the
//   global batch's counted targets, however they fall on ranks and micro-batches (Megatron's rule)
//   clip (nn::clip_grad_norm, counting each element once: parallel/comm/grad_norm.h), AdamW step
//
// Invalid plans raise sl::Error before any communication, naming the values.
//
//   Tests: tests/test_trainer.cpp (every layout, with micro-batches, against a serial nn::GPT + nn::AdamW)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/train/model_runner.h"

namespace sl::parallel {

struct TrainPlan {
  ParallelismConfig parallelism;  // dp_replicate x dp_shard, or one of pp, cp, tp with DDP / ZeRO-1
  int zero = 0;                   // 0: DDP (or naive); 1, 2: ZeRO stage; 3: FSDP / HSDP
  bool naive = false;             // the classic DataParallel instead of DDP
  bool offload = false;           // ZeRO-1/2/3: optimizer state and update on the host
  int micro_batches = 1;          // gradient accumulation steps per optimizer step (pipelines: per stage)
  // The chapters' own choices (used when pp, tp or cp > 1: parallel/train/runners.h builds the runner).
  std::string schedule = "1f1b";  // pp: naive | gpipe | 1f1b | interleaved
  int virtual_stages = 1;         // pp interleaved: model chunks per stage
  std::vector<int> stage_layers = {};  // pp: layers per stage; empty: balanced by count
  bool sequence_parallel = false; // tp: Megatron-SP
  std::string cp_balance = "zigzag", cp_variant = "ring";  // cp: zigzag | none, ring | allgather

  // Data parallelism over `world` ranks: dp_replicate for DDP, dp_shard for ZeRO/FSDP.
  static TrainPlan data_parallel(int world, int zero = 0);
  // Throws sl::Error naming the values unless the plan can run on `world_size` ranks.
  void validate(int world_size) const;
  bool cuts_model() const { return parallelism.pp > 1 || parallelism.cp > 1 || parallelism.tp > 1; }
  std::string name() const;  // "ddp", "naive", "zero1", "zero2+offload", "fsdp", "hsdp2x2"; "... x4 micro"
};

// Builds this rank's part of the model on the mesh (a pipeline stage, a TP shard, ...).
using RunnerFactory = std::function<std::unique_ptr<ModelRunner>(const DeviceMesh& mesh)>;

class Trainer {
 public:
  // Collective over ctx.world (builds the mesh). The model must be built with the same seed on every rank.
  Trainer(nn::GPT& model, RankContext& ctx, const TrainPlan& plan, const nn::AdamWOptions& adamw);
  // When the plan cuts the model (pp, cp or tp > 1): `make_runner` builds this rank's part, which
  // DDP (zero 0) or ZeRO-1 (zero 1) then wraps over the data-parallel group.
  Trainer(RankContext& ctx, const TrainPlan& plan, const RunnerFactory& make_runner, const nn::AdamWOptions& adamw);
  ~Trainer();

  // One optimizer step on global batch `step` of `batch_rows` rows (this rank takes its share, cut
  // into the plan's micro-batches). grad_clip <= 0: no clipping. Returns the global batch's mean
  // loss, the same on every rank. Throws before any communication unless batch_rows divides by
  // dp x micro_batches, showing the arithmetic.
  double train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                    double grad_clip);

  nn::StateDict full_state_dict();  // collective: the whole model on every rank
  const DeviceMesh& mesh() const;
  // This rank's part of the model and how it runs (null for naive DP): a chapter's runner can be
  // asked for more (the pipeline's timeline for --trace).
  ModelRunner* runner() const;

  // For tests: from the next train_step on, keep the gradient each step updates with (averaged over
  // the ranks, before clipping), whole on every rank, so it can be compared with a serial run's
  // .grad. Where gradients are sharded (ZeRO-2, FSDP, HSDP) keeping them costs an all-gather per
  // step, counted in communication(); naive DP's, on rank 0 only, are broadcast outside it.
  void keep_gradients();
  const nn::StateDict& full_gradients() const;  // by parameter name; empty before a kept step

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
