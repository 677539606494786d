// tensor_parallel_runner.cpp — see tensor_parallel_runner.h.
#include "parallel/tensor_parallel/tensor_parallel_runner.h"

namespace sl::parallel {

TensorParallelRunner::TensorParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                           tp::TensorParallelOptions options)
    : model_(config, seed, mesh.group("tp"), options), tp_rank_(mesh.tp_rank()) {}

double TensorParallelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                              double global_count, int dp, const BackwardHooks& hooks) {
  double share = 0;
  for (size_t m = 0; m < micros.size(); ++m) {
    const nn::TokenStream::MicroBatch& micro = micros[m];
    Tensor loss = model_.loss(micro.batch.inputs, micro.batch.targets);  // mean over this micro-batch's targets
    const double weight = static_cast<double>(micro.counted) / global_count;
    share += loss.item() * weight;
    if (hooks.before_backward) hooks.before_backward(m + 1 == micros.size());
    mul(loss, weight * dp).backward();  // averaged over dp afterwards: the serial gradient
  }
  return holds_loss() ? share : 0.0;
}

}  // namespace sl::parallel
