// expert_parallel_runner.cpp — see expert_parallel_runner.h.
#include "parallel/expert_parallel/expert_parallel_runner.h"

#include "parallel/runner/micro_batches.h"

namespace sl::parallel {

ExpertParallelRunner::ExpertParallelRunner(std::shared_ptr<nn::GPT> part, std::shared_ptr<const ChunkParallelizer> cut,
                                           const DeviceMesh& mesh)
    : PartRunner(part, std::move(cut)), step_({part}, mesh) {}

double ExpertParallelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                             double global_count, int dp, const BackwardHooks& hooks) {
  step_.begin(micros, global_count, dp);
  // The loop's own: cross-entropy only; the MoE layers attach their aux parts to their outputs.
  const double share = run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    return cut().loss(cut().forward(part(), micro.batch.inputs), micro);
  });
  const double aux = step_.end();
  return (holds_loss() ? share : 0.0) + aux;
}

nn::StateDict ExpertParallelRunner::full_state_dict() { return step_.with_every_expert(PartRunner::full_state_dict()); }
nn::StateDict ExpertParallelRunner::full_gradients() { return step_.with_every_expert(PartRunner::full_gradients()); }
nn::StateDict ExpertParallelRunner::full_state_dict_from(const nn::StateDict& part) {
  return step_.with_every_expert(PartRunner::full_state_dict_from(part));
}

}  // namespace sl::parallel
