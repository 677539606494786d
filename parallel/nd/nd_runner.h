// nd_runner.h — the composed runner: a PipelineRunner over mesh.group(MeshDim::pp) (one stage when pp is
// 1) whose chunks NdParallelizer (nd_parallelizer.h) cuts over tp and cp. Collective over pp (the tied wte's group).
// holds_loss: the last stage's tp rank 0, on every cp rank (each holds its tokens' share).
//
//   Tests: tests/parallel/nd/test_nd_parallel.cpp   Lesson: lessons/14_nd_parallel.cpp
#pragma once
#include "parallel/nd/nd_parallelizer.h"

namespace sl::parallel {

class NdRunner : public PipelineRunner {
 public:
  NdRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh, const NdOptions& options);
  bool holds_loss() const override { return PipelineRunner::holds_loss() && tp_rank_ == 0; }

 private:
  int tp_rank_;
};

}  // namespace sl::parallel
