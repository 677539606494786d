// model_runner.cpp — see model_runner.h: what every runner shares.
#include "parallel/runner/model_runner.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

void ModelRunner::finish_gradients() {
  const std::vector<GradientSum> sums = gradient_sums();
  const nn::NamedTensors named = sums.empty() ? nn::NamedTensors{} : module().named_parameters();
  for (const GradientSum& sum : sums) {
    std::vector<Tensor> params;
    for (const std::string& name : sum.params) {
      auto it = std::find_if(named.begin(), named.end(), [&](const auto& entry) { return entry.first == name; });
      SL_ASSERT(it != named.end());
      params.push_back(it->second);
    }
    sum_gradients_over(params, *sum.group);
  }
  for (const Tensor& unused : unused_parameters()) unused.set_grad(Tensor());
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

bool is_expert_parameter(const nn::Placement& placement) {
  return placement.kind == nn::Placement::Kind::sharded && placement.mesh_dim == name(MeshDim::ep);
}

Tensor grad_or_zeros(const Tensor& param) {
  return param.grad().defined() ? param.grad() : zeros(param.shape(), TensorOptions(param.dtype(), param.device()));
}

nn::StateDict gradients_of(const nn::Module& module) {
  nn::StateDict out;
  for (const auto& [name, param] : module.named_parameters()) out[name] = grad_or_zeros(param).clone();
  return out;
}

}  // namespace sl::parallel
