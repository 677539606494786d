// parallelize.h — the one composition path: every layout `train` runs, serial included, is built
// here, by applying the chapters to the GPT one after another, as torchtitan's parallelize_fn and
// picotron's train.py do:
//
//   1. pipeline   cut the GPT into this rank's chunks (GPTShardSpec layer ranges; pp 1: one chunk, all of it)
//   2. tp         build each chunk as this rank's tp slice of the serial draw; apply_tensor_parallel
//   3. cp         apply_context_parallel: attention over this rank's sequence shard
//      ep         apply_expert_parallel: each MoE block keeps this rank's E/ep experts (ep > 1)
//   4. schedule   one stage: the plain micro-batch loop (PartRunner; ExpertParallelRunner under ep);
//                 several: the pipeline's schedule (PipelineRunner; ExpertParallelPipelineRunner under ep)
//   5. dp         the data-parallel strategy around it: DDP, naive, ZeRO-1/2, or fully_shard (FSDP over
//                 dp_shard x cp; HSDP across dp_replicate)
//
// A chapter the layout does not use is left out (its degree is 1): the serial model is a single
// chunk, no tp, no cp, DDP over a mesh of one. parallelize.cpp reads top to bottom.
//
//   Tests: tests/parallel/nd/test_nd_parallel.cpp, tests/parallel/train/test_trainer.cpp
//   Lesson: lessons/14_nd_parallel.cpp
#pragma once
#include <memory>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/nd/parallelize_options.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

// What the Trainer (parallel/train/trainer.h) runs: the mesh, this rank's part of the model and how
// a step runs on it, and how the replicas agree. Destroyed in reverse: the strategy refers to the
// runner's part and to the mesh.
struct Parallelized {
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<DataParallelStrategy> strategy;
};

// Collective over `world` (every rank calls it with the same arguments). Builds this rank's part of
// the GPT from `seed` (the serial model's draw, slice by slice), then takes its part of `initial`
// when that is not empty (train --init-from: the serial weights). Throws sl::Error naming the values
// before any communication when the layout cannot be built (check_layout).
Parallelized parallelize(const nn::GPTConfig& config, uint64_t seed, ProcessGroupPtr world,
                         const ParallelizeOptions& options, const nn::StateDict& initial = {});

// Steps 1 to 4 alone, on `mesh`: this rank's part of the model and how a step runs on it, without a
// data-parallel strategy (a lesson or a test wraps it in its own). No communication but the groups
// the cut makes (a hybrid cp's, the pipeline's tied-wte pair).
std::unique_ptr<ModelRunner> parallelize_model(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                               const ParallelizeOptions& options, const nn::StateDict& initial = {});

}  // namespace sl::parallel
