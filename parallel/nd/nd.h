// nd.h — the composition chapter: several cuts of one model at once, as torchtitan's
// parallelize_fn and picotron's train.py compose them. The chapters below it never include each
// other; this folder is where they meet.
//
//   mesh [pp, dp_replicate, dp_shard, cp, tp] (TP innermost: its ranks are neighbours)
//
//   pp   the pipeline's stages, schedule and engine (parallel/pipeline)
//   tp   each stage's chunk sliced over tp (parallel/tensor_parallel), with or without SP
//   cp   each chunk's attention over sequence shards (parallel/context_parallel)
//   dp   the Trainer's data-parallel strategy around it all (parallel/data_parallel, parallel/zero);
//        FSDP / HSDP over a cut reaches into the part, so it is built here too, over dp_shard x cp
//
//   Bytes per step per rank (one layer, B rows, T tokens, C channels, f32):
//     tp: 4 all-reduces of B·T/cp·C (2 forward, 2 backward; SP: gathers + reduce-scatters, same bytes)
//     cp: (cp-1)/cp of K and V per layer and pass
//     pp: the boundary activation [B, T/cp(/tp under SP), C] each way per micro-batch
//     dp: the gradients of this rank's part (Ψ/(pp·tp)): DDP's all-reduce or ZeRO's reduce-scatter
//   Memory per rank: 16Ψ/(pp·tp) of model states (f32 AdamW) under DDP; FSDP over the cut divides
//   it by dp_shard·cp: 16Ψ/(tp·dp_shard·cp) for an uncut stage.
//
// Read in this order:
//   nd_parallelizer.h        NdParallelizer: a pipeline chunk cut over tp and cp; the rules of both at once
//   nd_runner.h              NdRunner: the pipeline over such chunks
//   fsdp_nd_runner.h         FsdpNdRunner: FSDP / HSDP over any of them (dp_shard × cp shards)
//
//   Lesson: lessons/14_nd_parallel.cpp   Tests: tests/parallel/nd/test_nd_parallel.cpp
#pragma once
#include "parallel/nd/fsdp_nd_runner.h"
#include "parallel/nd/nd_parallelizer.h"
#include "parallel/nd/nd_runner.h"
