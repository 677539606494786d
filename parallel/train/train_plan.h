// train_plan.h — a layout, typed: the mesh, the data-parallel strategy and each chapter's options.
// The train program, the benchmarks and the lessons switch layouts by changing a TrainPlan; the
// factory (factory.h) turns it into this rank's ModelRunner and DataParallelStrategy.
//
//   parallelism (a ParallelismConfig)        dp_strategy   what runs on each rank
//   {.dp_replicate = N}                      ddp           DDP: bucketed all-reduce overlapped with backward
//   {.dp_replicate = N}                      naive         the classic DataParallel: rank 0 scatters, gathers, steps
//   {.dp_shard = N}                          zero1|zero2   ZeRO-1/2: sharded AdamW state (and gradients)
//   {.dp_shard = N}                          fsdp          FSDP: parameters sharded per Block
//   {.dp_replicate = R, .dp_shard = S}       fsdp          HSDP: FSDP within S ranks, all-reduce across R replicas
//   .offload with zero1|zero2|fsdp (no replicas): the optimizer state, master weights and update on the host
//   {.pp | .tp | .cp = K} x dp               ddp|zero1     a chapter cuts the model (a ModelRunner: stage, TP
//                                                          shard, sequence shard), DDP or ZeRO-1 over dp
//   {.tp | .cp = K, .dp_shard = N}           zero2         ZeRO-2 over a tp or cp cut (not pp: the tied wte)
//   {.pp, .tp, .cp, .dp_replicate, .dp_shard} fsdp         FSDP / HSDP over what the cut leaves on a rank,
//                                                          over dp_shard x cp (parallel/nd/fsdp_nd_runner.h)
//   TrainPlan::data_parallel(N, zero) gives the first rows' plans.
//
// validate() raises sl::Error before any communication, naming the values; the rules that need the
// model's config (heads over tp, tokens over cp) are the factory's check_model_runner().
#pragma once
#include <string>
#include <vector>

#include "nn/mixed_precision.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/pipeline/schedule.h"

namespace sl::parallel {

// How the data-parallel replicas agree on one update (parallel/runner/data_parallel_strategy.h).
// train's --zero N picks ddp, zero1, zero2 or fsdp; --naive-dp picks naive.
enum class DpStrategy : uint8_t { ddp, naive, zero1, zero2, fsdp };
const char* dp_strategy_name(DpStrategy strategy);  // "ddp", "naive", "zero1", "zero2", "fsdp"
DpStrategy zero_stage_strategy(int stage);          // 0 -> ddp, 1, 2, 3 -> fsdp; throws naming others
int zero_stage(DpStrategy strategy);                // ddp, naive -> 0; zero1 -> 1; zero2 -> 2; fsdp -> 3

struct TrainPlan {
  ParallelismConfig parallelism;
  DpStrategy dp_strategy = DpStrategy::ddp;
  bool offload = false;   // zero1, zero2, fsdp: optimizer state and update on the host
  int micro_batches = 1;  // gradient accumulation steps per optimizer step (pipelines: per stage)
  // The chapters' own choices (used when pp, tp or cp > 1).
  ScheduleKind schedule = ScheduleKind::one_f_one_b;  // pp
  int virtual_stages = 1;                                                 // pp interleaved: model chunks per stage
  std::vector<int> stage_layers = {};  // pp: layers per stage; empty: balanced by count
  bool sequence_parallel = false;      // tp: Megatron-SP
  CpBalance cp_balance = CpBalance::zigzag;
  CpVariant cp_variant = CpVariant::ring;
  int ulysses_degree = 0;  // cp hybrid: U (cp = U x R)
  // 16-bit weights, gradients in precision.grad_dtype, f32 master weights in AdamW, fp16 loss
  // scaling (nn/mixed_precision.h). The models the runners build must have precision.param_dtype.
  // Runs with DDP (and AdamW alone on a cut at dp 1); ZeRO's and FSDP's flat buffers are f32.
  nn::MixedPrecision precision{};

  // Data parallelism over `world` ranks: dp_replicate for DDP (zero 0), dp_shard for ZeRO/FSDP.
  static TrainPlan data_parallel(int world, int zero = 0);
  // Throws sl::Error naming the values unless the plan can run on `world_size` ranks.
  void validate(int world_size) const;
  bool cuts_model() const { return parallelism.pp > 1 || parallelism.cp > 1 || parallelism.tp > 1; }
  int zero() const { return zero_stage(dp_strategy); }
  std::string name() const;  // "ddp", "naive", "zero1", "zero2+offload", "fsdp", "hsdp2x2"; "... x4 micro"
};

}  // namespace sl::parallel
