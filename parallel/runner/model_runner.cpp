// model_runner.cpp — see model_runner.h: the uncut model's step, and the defaults every runner shares.
#include "parallel/runner/model_runner.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
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

void ModelRunner::finish_gradients() {
  const std::vector<GradientSum> sums = gradient_sums();
  if (sums.empty()) return;
  const nn::NamedTensors named = module().named_parameters();
  for (const GradientSum& sum : sums) {
    std::vector<Tensor> params;
    for (const std::string& name : sum.params) {
      auto it = std::find_if(named.begin(), named.end(), [&](const auto& entry) { return entry.first == name; });
      SL_ASSERT(it != named.end());
      params.push_back(it->second);
    }
    sum_gradients_over(params, *sum.group);
  }
}

std::vector<std::string> parameter_names(const nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& [name, param] : module.named_parameters()) out.push_back(name);
  return out;
}

std::vector<std::string> partial_over(const nn::Module& module, MeshDim dim) {
  std::vector<std::string> out;
  for (const auto& [parameter, placement] : module.named_placements())
    if (placement.partial_over == name(dim)) out.push_back(parameter);
  return out;
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
