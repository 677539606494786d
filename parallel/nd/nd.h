// nd.h — the composition chapter: every layout `train` runs, built by one function, parallelize,
// as torchtitan's parallelize_fn and picotron's train.py compose the chapters. The chapters below it
// never include each other; this folder is where they meet.
//
//   mesh [pp, dp_replicate, dp_shard, cp, tp] (TP innermost: its ranks are neighbours)
//
//   parallelize(config, seed, world, options):
//     1. pp   cut the GPT into this rank's chunks (GPTShardSpec layer ranges; pp 1: one chunk, all of it)
//     2. tp   build each chunk as this rank's tp slice; apply_tensor_parallel (parallel/tensor_parallel)
//     3. cp   apply_context_parallel: attention over this rank's sequence shard (parallel/context_parallel)
//     4.      one stage: the plain micro-batch loop (PartRunner, parallel/runner); several: the
//             pipeline's schedule (PipelineRunner, parallel/pipeline); each chunk run as NdParallelizer says
//     5. dp   the data-parallel strategy: DDP or naive (parallel/data_parallel), ZeRO-1/2 or
//             fully_shard, FSDP over dp_shard x cp and HSDP across dp_replicate (parallel/zero)
//   A chapter the layout does not use is left out (degree 1): the serial model is step 1 with one
//   chunk, then DDP over a mesh of one.
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
//   parallelize.h            parallelize: the one composition path, top to bottom in parallelize.cpp
//   parallelize_options.h    the layout it takes (ParallelizeOptions, DpStrategy) and its rules
//   nd_parallelizer.h        NdParallelizer: how a part cut over tp and cp runs (tokens, vocab-parallel
//                            embedding and loss, gradient sums, gathers); the rules of both at once
//
//   Lesson: lessons/14_nd_parallel.cpp   Tests: tests/parallel/nd/test_nd_parallel.cpp
#pragma once
#include "parallel/nd/nd_parallelizer.h"
#include "parallel/nd/parallelize.h"
#include "parallel/nd/parallelize_options.h"
