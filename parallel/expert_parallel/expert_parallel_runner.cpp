// expert_parallel_runner.cpp — see expert_parallel_runner.h.
#include "parallel/expert_parallel/expert_parallel_runner.h"

#include "autograd/grad_mode.h"
#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

ExpertParallelRunner::ExpertParallelRunner(std::shared_ptr<nn::GPT> part, std::shared_ptr<const ChunkParallelizer> cut,
                                           const DeviceMesh& mesh)
    : PartRunner(std::move(part), std::move(cut)), mesh_(mesh) {}

double ExpertParallelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                             double global_count, int dp, const BackwardHooks& hooks) {
  // G_m: micro-batch m's counted targets over every batch rank (its MoE batch).
  std::vector<double> counts;
  for (const auto& micro : micros) counts.push_back(static_cast<double>(micro.counted));
  Tensor group_counts = from_vector(counts, {static_cast<int64_t>(counts.size())}, DType::f64);
  mesh_.group(MeshDim::dp)->all_reduce(group_counts, ReduceOp::sum);
  const std::vector<double> group = group_counts.to_vector();
  size_t m = 0;
  served_.clear();
  const double share = run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    MicroBatchLoss loss = cut().loss(cut().forward(part(), micro.batch.inputs), micro);
    count_served_rows();
    const double group_count = group[m++];
    if (const Tensor aux = part().moe_loss(); aux.defined())
      loss.mean = add(loss.mean, mul(aux, group_count / loss.counted));  // a_d · G_m / c_d
    return loss;
  });
  return holds_loss() ? share : 0.0;
}

void ExpertParallelRunner::count_served_rows() {
  const auto layers = expert_parallel_layers(part());
  served_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const ExpertParallelMoE& moe = *layers[l].second;
    served_[l].resize(static_cast<size_t>(moe.local_experts()), 0);
    for (int64_t j = 0; j < moe.local_experts(); ++j)  // stats(): the global plan's, every rank the same
      served_[l][static_cast<size_t>(j)] += moe.stats().kept.at(static_cast<size_t>(moe.first_expert() + j));
  }
}

std::vector<Tensor> ExpertParallelRunner::unused_parameters() {
  std::vector<Tensor> out;
  const auto layers = expert_parallel_layers(part());
  for (size_t l = 0; l < served_.size() && l < layers.size(); ++l)
    for (int64_t j = 0; j < layers[l].second->local_experts(); ++j)
      if (served_[l][static_cast<size_t>(j)] == 0)
        for (const Tensor& param : layers[l].second->expert(j).parameters()) out.push_back(param);
  return out;
}

// `local` (this rank's parameters under serial names) with every other ep rank's experts added.
nn::StateDict ExpertParallelRunner::with_every_expert(nn::StateDict local, bool gradients) {
  NoGradGuard no_grad;
  for (const auto& [layer, moe] : expert_parallel_layers(part())) {
    ProcessGroup& ep = *moe->groups().ep;
    const int64_t per_rank = moe->local_experts();
    for (int64_t j = 0; j < per_rank; ++j)
      for (const auto& [suffix, param] : moe->expert(j).named_parameters()) {
        const Tensor piece = (gradients ? grad_or_zeros(param) : param).detach();  // contiguous, as every tensor
        Tensor all = Tensor::empty({ep.size(), piece.numel()}, piece.options());  // [ep, numel]
        ep.all_gather(all, piece.reshape({1, piece.numel()}));
        for (int r = 0; r < ep.size(); ++r) {
          const std::string name = "h." + std::to_string(layer) + ".mlp.experts." + std::to_string(r * per_rank + j) + "." + suffix;
          local[name] = all.narrow(0, r, 1).reshape(piece.shape()).clone();
        }
      }
  }
  return local;
}

nn::StateDict ExpertParallelRunner::full_state_dict() { return with_every_expert(PartRunner::full_state_dict(), false); }
nn::StateDict ExpertParallelRunner::full_gradients() { return with_every_expert(PartRunner::full_gradients(), true); }

}  // namespace sl::parallel
