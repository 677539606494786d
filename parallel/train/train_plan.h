// train_plan.h — a layout, typed: the mesh, the data-parallel strategy and each chapter's options.
// The train program, the benchmarks and the lessons switch layouts by changing a TrainPlan;
// parallelize (parallel/nd/parallelize.h) builds it, from parallelize_options(). Which layouts
// exist, and their rules: parallel/nd/parallelize_options.h.
//
//   TrainPlan::data_parallel(N, zero): DDP over N replicas (zero 0), or ZeRO-1/2 / FSDP over N shards.
//
// validate() raises sl::Error before any communication, naming the values; the rules that need the
// model's config (heads over tp, tokens over cp) are check_model_cut() (parallelize_options.h).
#pragma once
#include <string>
#include <vector>

#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/nd/parallelize_options.h"
#include "parallel/pipeline/schedule.h"

namespace sl::parallel {

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
  // scaling (nn/mixed_precision.h). The model's config must have precision.param_dtype.
  // Runs with DDP (and AdamW alone on a cut at dp 1); ZeRO's and FSDP's flat buffers are f32.
  nn::MixedPrecision precision{};
  // DDP: each bucket reduced by this hook instead of the all-reduce (parallel/data_parallel/comm_hook.h).
  CommHookFactory ddp_comm_hook = {};

  // Data parallelism over `world` ranks: dp_replicate for DDP (zero 0), dp_shard for ZeRO/FSDP.
  static TrainPlan data_parallel(int world, int zero = 0);
  // Throws sl::Error naming the values unless the plan can run on `world_size` ranks.
  void validate(int world_size) const;
  // What parallelize() takes: this plan with the optimizer's settings.
  ParallelizeOptions parallelize_options(const nn::AdamWOptions& adamw = {}) const;
  bool cuts_model() const { return parallelism.pp > 1 || parallelism.cp > 1 || parallelism.tp > 1; }
  int zero() const { return zero_stage(dp_strategy); }
  std::string name() const;  // "ddp", "naive", "zero1", "zero2+offload", "fsdp", "hsdp2x2"; "... x4 micro"
};

}  // namespace sl::parallel
