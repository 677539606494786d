// parallelize_options.h — a layout, as parallelize() (parallelize.h) takes it: the mesh, each
// chapter's options, the data-parallel strategy; and the rules that say which layouts can be built,
// checked before any communication. parallel/train's TrainPlan names the same layout for the train
// program (TrainPlan::parallelize_options).
//
//   parallelism (a ParallelismConfig)        dp_strategy   what runs on each rank
//   {.dp_replicate = N}                      ddp           DDP: bucketed all-reduce overlapped with backward
//   {.dp_replicate = N}                      naive         the classic DataParallel: rank 0 scatters, gathers, steps
//   {.dp_shard = N}                          zero1|zero2   ZeRO-1/2: sharded AdamW state (and gradients)
//   {.dp_shard = N}                          fsdp          FSDP: parameters sharded per Block
//   {.dp_replicate = R, .dp_shard = S}       fsdp          HSDP: FSDP within S ranks, all-reduce across R replicas
//   .offload with zero1|zero2|fsdp (no replicas, no cut): the optimizer state, master weights and update on the host
//   {.pp | .tp | .cp = K} x dp               ddp|zero1     a cut model (a stage, a tp slice, a sequence shard),
//                                                          DDP or ZeRO-1 over dp
//   {.tp | .cp = K, .dp_shard = N}           zero2         ZeRO-2 over a tp or cp cut (not pp: the tied wte)
//   {.pp, .tp, .cp, .dp_replicate, .dp_shard} fsdp         FSDP / HSDP over what the cut leaves on a rank,
//                                                          over dp_shard x cp
//   {.ep = E, .dp_replicate = N}             ddp           expert parallel: each rank E/ep experts, DDP over dp
//                                                          (replicas x ep) for the rest, over dp_replicate
//                                                          for the experts
//   {.ep = E, .dp_shard = N}                 zero1|zero2|  the rest sharded over dp_shard x ep, the experts
//                                            fsdp          whole, averaged over dp_shard
//   {.ep, .tp, .pp, .cp} x dp                ddp           ep with tp (experts replicated over tp, no SP),
//                                                          pp (a stage's MoE blocks) and cp (one MoE batch
//                                                          in the serial token order); tp also under ZeRO
//                                                          and FSDP (HSDP too); not with offload, 16-bit
#pragma once
#include <cstdint>

#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/cp_gpt.h"
#include "parallel/data_parallel/comm_hook.h"
#include "parallel/pipeline/pipeline_runner.h"

namespace sl::parallel {

// How the data-parallel replicas agree on one update (parallel/runner/data_parallel_strategy.h).
// train's --zero N picks ddp, zero1, zero2 or fsdp; --naive-dp picks naive.
enum class DpStrategy : uint8_t { ddp, naive, zero1, zero2, fsdp };
const char* dp_strategy_name(DpStrategy strategy);  // "ddp", "naive", "zero1", "zero2", "fsdp"
DpStrategy zero_stage_strategy(int stage);          // 0 -> ddp, 1, 2, 3 -> fsdp; throws naming others
int zero_stage(DpStrategy strategy);                // ddp, naive -> 0; zero1 -> 1; zero2 -> 2; fsdp -> 3

struct ParallelizeOptions {
  ParallelismConfig parallelism;
  DpStrategy dp_strategy = DpStrategy::ddp;
  bool offload = false;             // zero1, zero2, fsdp: optimizer state and update on the host
  PipelineOptions pipeline;         // pp: schedule, virtual stages, layers per stage
  bool sequence_parallel = false;   // tp: Megatron-SP
  ContextParallelOptions cp;        // cp: balance, variant, Ulysses degree
  nn::MixedPrecision precision{};   // 16-bit weights and gradients, f32 master weights in AdamW
  nn::AdamWOptions adamw{};
  // ddp: each bucket reduced by this hook instead of DDP's all-reduce (parallel/data_parallel/comm_hook.h).
  CommHookFactory ddp_comm_hook = {};

  bool cuts_model() const { return parallelism.pp > 1 || parallelism.cp > 1 || parallelism.tp > 1; }
};

// Which layouts can be built on `world_size` ranks (the mesh, the strategy and the cut together).
// Throws sl::Error naming the values.
void check_layout(const ParallelizeOptions& options, int world_size);
// The chapters' rules for this model: layers per stage and the schedule over `micro_batches` (pp),
// whole heads and SP's sequence (tp), the sequence over cp and both at once. Throws sl::Error
// naming the values.
void check_model_cut(const nn::GPTConfig& config, const ParallelizeOptions& options, int micro_batches);
// FSDP over a cut: one chunk per rank (no interleaving), not the zero-bubble schedule (its W actions
// would fill a unit's gradients after the unit's next forward), no offload.
void check_fsdp_cut(const ParallelismConfig& parallelism, const PipelineOptions& options, bool offload);

}  // namespace sl::parallel
