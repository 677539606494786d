// model_runner.cpp — see model_runner.h: the uncut model's step, and the defaults every runner shares.
#include "parallel/runner/model_runner.h"

#include "autograd/grad_mode.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

double WholeModelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count,
                                          int dp, const BackwardHooks& hooks) {
  return run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    return MicroBatchLoss{loss_(micro.batch.inputs, micro.batch.targets), static_cast<double>(micro.counted)};
  });
}

std::unique_ptr<DataParallelStrategy> ModelRunner::own_strategy(const DeviceMesh& mesh, const nn::AdamWOptions& adamw) {
  (void)mesh;
  (void)adamw;
  return nullptr;
}

void ModelRunner::load_full_state_dict(const nn::StateDict& full) {
  NoGradGuard no_grad;
  for (const auto& [name, param] : module().named_parameters()) {
    auto it = full.find(name);
    SL_CHECK(it != full.end(), "ModelRunner::load_full_state_dict: the serial weights have no '", name, "'");
    SL_CHECK(it->second.shape() == param.shape(), "ModelRunner::load_full_state_dict: '", name, "' is ",
             it->second.shape().str(), " in the serial weights but ", param.shape().str(),
             " on this rank: a runner that slices parameters must cut them itself");
    param.copy_(it->second);
  }
}

nn::StateDict WholeModelRunner::full_state_dict() { return model_.state_dict(); }
nn::StateDict WholeModelRunner::full_gradients() { return gradients_of(model_); }

Tensor grad_or_zeros(const Tensor& param) {
  return param.grad().defined() ? param.grad() : zeros(param.shape(), TensorOptions(param.dtype(), param.device()));
}

nn::StateDict gradients_of(const nn::Module& module) {
  nn::StateDict out;
  for (const auto& [name, param] : module.named_parameters()) out[name] = grad_or_zeros(param).clone();
  return out;
}

}  // namespace sl::parallel
