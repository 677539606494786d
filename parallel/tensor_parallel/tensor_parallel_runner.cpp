// tensor_parallel_runner.cpp — see tensor_parallel_runner.h.
#include "parallel/tensor_parallel/tensor_parallel_runner.h"

#include "parallel/runner/micro_batches.h"

namespace sl::parallel {

TensorParallelRunner::TensorParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                           TensorParallelOptions options)
    : model_(config, seed, mesh.group(MeshDim::tp), options), tp_rank_(mesh.tp_rank()) {}

double TensorParallelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                              double global_count, int dp, const BackwardHooks& hooks) {
  const double share = run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    // mean over this micro-batch's targets
    return MicroBatchLoss{model_.loss(micro.batch.inputs, micro.batch.targets), static_cast<double>(micro.counted)};
  });
  return holds_loss() ? share : 0.0;
}

std::vector<GradientSum> TensorParallelRunner::gradient_sums() {
  if (!model_.sequence_parallel()) return {};
  return {{MeshDim::tp, model_.tp().group, partial_over(model_.gpt(), MeshDim::tp)}};
}

}  // namespace sl::parallel
