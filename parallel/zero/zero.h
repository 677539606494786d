// zero.h — the ZeRO chapter (Rajbhandari et al., 2020): data parallelism that stops replicating.
// DDP keeps on every rank the whole model's weights, gradients and optimizer state; ZeRO cuts them
// into N shards, one per data-parallel rank, stage by stage.
//
//   per rank, f32 AdamW (weights 4Ψ, gradients 4Ψ, exp_avg + exp_avg_sq 8Ψ), N data-parallel ranks
//
//                 weights   gradients   optimizer   total          what moves per step (ring, bytes sent)
//   DDP           4Ψ        4Ψ          8Ψ          16Ψ            all-reduce            2(N-1)/N · 4Ψ
//   ZeRO-1        4Ψ        4Ψ          8Ψ/N        8Ψ + 8Ψ/N      reduce-scatter + all-gather  the same
//   ZeRO-2        4Ψ        4Ψ/N        8Ψ/N        4Ψ + 12Ψ/N     the same (per bucket, during backward)
//   ZeRO-3 / FSDP 4Ψ/N      4Ψ/N        8Ψ/N        16Ψ/N          all-gather ×2 + reduce-scatter 3(N-1)/N · 4Ψ
//   (+ one gathered unit and its gradient while it computes)
//
//   HSDP: FSDP within dp_shard = S ranks, an all-reduce of every gradient shard across dp_replicate
//   = R replicas (16Ψ/S per rank). Offload: the optimizer state, master shard and update on the
//   host (ZeRO-Offload).
//
//   ZeRO-1/2, one rank's step:   grads ──reduce-scatter──▶ my shard's average ──AdamW──▶ my weights'
//                                shard ──all-gather──▶ every rank's whole weights
//   FSDP, one unit's forward:    shards ──all-gather──▶ the unit, compute, free; backward gathers
//                                again and reduce-scatters the unit's gradients into the shards
//
// Read in this order:
//   flat_params.h       parameters laid end to end, padded, cut into N shards
//   sharded_adamw.h     nn::AdamW's update on one shard (every stage and offload share it)
//   zero_adamw.h        ZeRO-1/2 and offload: reduce-scatter, clip over shards, step, all-gather
//   zero_reducer.h      ZeRO-2's gradient buckets, filled and reduce-scattered during backward
//   fsdp_unit.h         one FSDP unit: gather, free, reduce-scatter
//   fsdp.h              FullyShardedGPT: units, hooks, HSDP, offload
//   sharded_gradients.h a cut model's gradient sums and clip placements, applied to gradient shards
//   zero_strategies.h   ZeRO-1/2 and FSDP/HSDP as the Trainer's DataParallelStrategy; fully_shard, FSDP's one
//                       entry (any part: the whole model or a cut, over dp_shard x cp)
//
//   Lesson: lessons/07_zero.cpp
//   Tests: tests/parallel/zero/test_zero.cpp, tests/parallel/zero/test_fsdp.cpp, tests/parallel/train/test_grad_accumulation.cpp
#pragma once
#include "parallel/zero/flat_params.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/sharded_adamw.h"
#include "parallel/zero/sharded_gradients.h"
#include "parallel/zero/zero_adamw.h"
#include "parallel/zero/zero_strategies.h"
