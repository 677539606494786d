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
//   Mixed precision (16-bit weights and gradients, the f32 master beside the moments: K = 12 bytes of
//   optimizer state per element), the paper's table:   ZeRO-1 4Ψ + 12Ψ/N   ZeRO-2 2Ψ + 14Ψ/N   ZeRO-3 16Ψ/N
//
//   HSDP: FSDP within dp_shard = S ranks, an all-reduce of every gradient shard across dp_replicate
//   = R replicas (16Ψ/S per rank).
//
//   ZeRO-2 at the PEAK (backward), e bytes per gradient element (4 f32, 2 bf16/f16), P = Ψ padded per
//   bucket, B_max the largest bucket, Ψ_max the largest parameter:
//     held (between steps)  e·P/N                  the gradient shard
//     peak − held  ≤  (kBucketsInFlight + 1) · e · B_max  +  e · Ψ_max
//   the reduce-scatters launched and not yet waited (kBucketsInFlight = 2), the bucket being filled,
//   and one gradient that arrived before its bucket existed; a bucket closes at >= bucket_bytes, so
//   B_max < bucket_bytes/e + Ψ_max (+ N-1 padding). Tests: ZeroStage2.PeakAboveHeldIsAtMostTheBucketsInFlight.
//
//   Offload (ZeRO-Offload, Ren et al., 2021; FSDP's CPU offload), DeepSpeed's placement: the moments,
//   the f32 master shard and the f32 gradient shard live on the rank's host (ledger "offload", 16S
//   bytes, S = P/N) and AdamW runs there; what crosses the host link is in the model's dtype (e bytes:
//   16-bit under mixed precision, converted to and from f32 on the host). Per step per rank:
//     ZeRO-1/2   gradient shard down e·S, weight shard up e·S              (bf16: 2Ψ/N each)
//     FSDP       each unit's reduced gradient shard down e·S_u, its weight shard up before each of
//                its two all-gathers (forward, backward) 2·e·S_u
//   A rank on cuda:i offloads to cpu:i (the copies cross PCIe, Tensor::to records them); a rank on
//   cpu:r to cpu:r itself: the copies are memcpys and the ledger records the same bytes, so the formulas
//   are tested on the CPU (host_link.h).
//
//   Devices: everything here is tensor ops on the parameters' device (flat views, copy_, mul_, add_,
//   the collectives) and, for AdamW, nn::adamw_update on views of each shard piece: the CPU loop of
//   nn::AdamW or the CUDA kernels of tensor/cuda/optim.cu (mixed precision: the master kernel, which
//   writes the rounded 16-bit weight after the master in one pass). A rank on cuda:r keeps its flat
//   buffers, shards and (unless offloaded) optimizer state on cuda:r; on the CPU the results are the
//   CPU loop's bits.
//
//   ZeRO-1/2, one rank's step:   grads ──reduce-scatter──▶ my shard's average ──AdamW──▶ my weights'
//                                shard ──all-gather──▶ every rank's whole weights
//   FSDP, one unit's forward:    shards ──all-gather──▶ the unit, compute, free; backward gathers
//                                again and reduce-scatters the unit's gradients into the shards
//
// Read in this order:
//   flat_params.h       parameters laid end to end, padded, cut into N shards
//   sharded_adamw.h     nn::AdamW's update on one shard (every stage and offload share it)
//   host_link.h         offload's copies between a rank's device and its host, and their bytes
//   zero_adamw.h        ZeRO-1/2 and offload: reduce-scatter, clip over shards, step, all-gather
//   zero_reducer.h      ZeRO-2's gradient buckets, filled and reduce-scattered during backward
//   fsdp_unit.h         one FSDP unit: gather, free, reduce-scatter
//   fsdp.h              FullyShardedGPT: units, hooks, HSDP, offload
//   sharded_gradients.h a cut model's gradient sums and clip placements, applied to gradient shards
//   expert_replicas.h   an expert-parallel model's experts under ZeRO/FSDP: whole, averaged over expert_dp_cp
//   zero_strategies.h   ZeRO-1/2 and FSDP/HSDP as the Trainer's DataParallelStrategy; fully_shard, FSDP's one
//                       entry (any part: the whole model or a cut, over dp_shard x cp)
//
//   Lesson: lessons/07_zero.cpp
//   Tests: tests/parallel/zero/test_zero.cpp, tests/parallel/zero/test_fsdp.cpp, tests/parallel/train/test_grad_accumulation.cpp
#pragma once
#include "parallel/zero/expert_replicas.h"
#include "parallel/zero/flat_params.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/sharded_adamw.h"
#include "parallel/zero/sharded_gradients.h"
#include "parallel/zero/zero_adamw.h"
#include "parallel/zero/zero_strategies.h"
