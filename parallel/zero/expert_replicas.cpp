// expert_replicas.cpp — see expert_replicas.h.
#include "parallel/zero/expert_replicas.h"

#include <algorithm>

#include "autograd/grad_mode.h"

namespace sl::parallel {

ExpertReplicas::ExpertReplicas(std::vector<Tensor> experts, std::vector<nn::Placement> placements,
                               const DeviceMesh& mesh, const nn::AdamWOptions& adamw)
    : experts_(std::move(experts)), placements_(std::move(placements)) {
  SL_CHECK(experts_.size() == placements_.size(), "ExpertReplicas: ", experts_.size(), " experts and ",
           placements_.size(), " placements");
  if (mesh.size(MeshDim::expert_dp_cp) > 1) {
    group_ = mesh.group(MeshDim::expert_dp_cp);
    NoGradGuard no_grad;
    for (const Tensor& expert : experts_) group_->broadcast(expert, 0);  // the replicas start equal, as DDP's
  }
  adamw_ = std::make_unique<nn::AdamW>(experts_, adamw);
}

void ExpertReplicas::zero_grad() {
  for (const Tensor& expert : experts_) expert.set_grad(Tensor());
}

void ExpertReplicas::finish_gradients(ModelRunner& runner) {
  NoGradGuard no_grad;
  for (const Tensor& expert : experts_) {
    Tensor grad = grad_or_zeros(expert);
    if (!expert.grad().defined()) expert.set_grad(grad);
    if (!group_) continue;
    group_->all_reduce(grad, ReduceOp::sum);
    grad.mul_(1.0 / group_->size());
  }
  for (const Tensor& unused : runner.unused_parameters()) {
    SL_CHECK(std::any_of(experts_.begin(), experts_.end(), [&](const Tensor& e) { return e.is_same(unused); }),
             "ExpertReplicas: an unused parameter that is not an expert: the flat buffers cannot skip it");
    unused.set_grad(Tensor());
  }
}

std::vector<MeshGrad> ExpertReplicas::mesh_grads() const {
  std::vector<MeshGrad> pieces;
  for (size_t i = 0; i < experts_.size(); ++i) pieces.push_back({experts_[i].grad(), placements_[i], {}});
  return pieces;
}

void ExpertReplicas::step(double lr) {
  adamw_->lr = lr;
  adamw_->step();  // skips the experts whose .grad was dropped
}

int64_t ExpertReplicas::optimizer_steps() const {
  int64_t most = 0;
  for (size_t i = 0; i < experts_.size(); ++i) most = std::max(most, adamw_->state(i).step);
  return most;
}

void ExpertReplicas::set_optimizer_steps(int64_t steps) {
  for (size_t i = 0; i < experts_.size(); ++i) adamw_->state(i).step = steps;
}

}  // namespace sl::parallel
