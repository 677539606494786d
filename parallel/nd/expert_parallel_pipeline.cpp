// expert_parallel_pipeline.cpp — see expert_parallel_pipeline.h.
#include "parallel/nd/expert_parallel_pipeline.h"

namespace sl::parallel {

ExpertParallelPipelineRunner::ExpertParallelPipelineRunner(Stage stage, const DeviceMesh& mesh,
                                                           const PipelineOptions& options,
                                                           std::shared_ptr<const ChunkParallelizer> cut)
    : PipelineRunner(std::move(stage), mesh, options, std::move(cut)), step_(this->stage().parts, mesh) {}

double ExpertParallelPipelineRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                                      double global_count, int dp, const BackwardHooks& hooks) {
  step_.begin(micros, global_count, dp);
  const double loss = PipelineRunner::forward_backward(micros, global_count, dp, hooks);  // 0 off the loss's ranks
  return loss + step_.end();
}

}  // namespace sl::parallel
