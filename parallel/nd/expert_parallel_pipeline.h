// expert_parallel_pipeline.h — a pipeline stage whose MoE blocks are expert-parallel: the
// pipeline's runner (parallel/pipeline/pipeline_runner.h) with expert parallelism's step around its
// schedule (parallel/expert_parallel/expert_parallel_step.h). What parallelize.cpp builds when pp > 1
// and ep > 1; it lives here, in the composition path, because it joins two chapters.
//
//   forward_backward   begin: each MoE layer of the stage's chunks gets its MoE batches' aux weights;
//                      the schedule runs (each MoE forward attaches this rank's aux part to its
//                      output, so a stage before the last gets its aux gradient from the backward
//                      the next stage started); end: the stage's aux share of the logged loss
//   holds_loss         the last stage's (tp rank 0), and every stage holding MoE layers (tp rank 0)
//                      for its aux parts: summed over the world they are the serial loss
//   unused_parameters  the stage's experts no row reached in the step
//   full_state_dict    the pipeline's gather over pp, then every expert over ep
//
// One MoE batch is micro-batch m of every batch rank, as without the pipeline: each stage routes
// micro-batch m's rows of every dp rank together, the same rows in every MoE layer of every stage.
#pragma once
#include <memory>

#include "parallel/expert_parallel/expert_parallel_step.h"
#include "parallel/pipeline/pipeline_runner.h"

namespace sl::parallel {

class ExpertParallelPipelineRunner : public PipelineRunner {
 public:
  ExpertParallelPipelineRunner(Stage stage, const DeviceMesh& mesh, const PipelineOptions& options,
                               std::shared_ptr<const ChunkParallelizer> cut);
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return PipelineRunner::holds_loss() || step_.holds_aux(); }
  std::vector<Tensor> unused_parameters() override { return step_.unused_parameters(); }
  nn::StateDict full_state_dict() override { return step_.with_every_expert(PipelineRunner::full_state_dict()); }
  nn::StateDict full_gradients() override { return step_.with_every_expert(PipelineRunner::full_gradients()); }
  nn::StateDict full_state_dict_from(const nn::StateDict& part) override {
    return step_.with_every_expert(PipelineRunner::full_state_dict_from(part));
  }

 private:
  ExpertParallelStep step_;
};

}  // namespace sl::parallel
