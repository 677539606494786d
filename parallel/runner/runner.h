// runner.h — the runner interface: what every chapter plugs into, and the one training step's
// arithmetic they share. It sits between the communication layer (parallel/comm) and the chapters;
// it knows no technique.
//
//   parallel/train   Trainer ── holds ──▶ ModelRunner            (what part of the model this rank
//                       │                  PartRunner here,               computes, and how)
//                       │                  PipelineRunner (pipeline/)
//                       └──── holds ──▶ DataParallelStrategy   (how the replicas agree: average,
//                                          data_parallel/, zero/          clip, step)
//
//   One step:  split the global batch over dp, cut micro-batches (micro_batches.h) ─▶
//              strategy.zero_grad ─▶ runner.forward_backward (the one micro-batch loop, each
//              backward weighted c_m · dp / C) ─▶ strategy.synchronize ─▶ runner.finish_gradients ─▶
//              strategy.clip_grad_norm ─▶ strategy.step
//
// Read in this order:
//   micro_batches.h             the row split, the micro-batch weights, the one loop
//   model_runner.h              ModelRunner
//   chunk_parallelizer.h        ChunkParallelizer: how a part runs (forward, loss, sums, gathers); zero_loss
//   part_runner.h               PartRunner: the plain micro-batch loop over one part
//   data_parallel_strategy.h    DataParallelStrategy
//
// parallel/nd/parallelize.h builds both for every layout. A technique that changes a model part
// offers an apply function; one that changes how replicas agree writes a DataParallelStrategy;
// either is one line in parallel/nd/parallelize.cpp.
#pragma once
#include "parallel/runner/chunk_parallelizer.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/micro_batches.h"
#include "parallel/runner/model_runner.h"
#include "parallel/runner/part_runner.h"
