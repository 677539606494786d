// expert_parallel_step.cpp — see expert_parallel_step.h.
#include "parallel/expert_parallel/expert_parallel_step.h"

#include "autograd/grad_mode.h"
#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "tensor/ops.h"

namespace sl::parallel {

ExpertParallelStep::ExpertParallelStep(std::vector<std::shared_ptr<nn::GPT>> parts, const DeviceMesh& mesh)
    : parts_(std::move(parts)), mesh_(mesh) {}

std::vector<ExpertParallelMoE*> ExpertParallelStep::layers() const {
  std::vector<ExpertParallelMoE*> out;
  for (const auto& part : parts_)
    for (const auto& [layer, moe] : expert_parallel_layers(*part)) out.push_back(moe);
  return out;
}

void ExpertParallelStep::begin(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp) {
  // G_m: micro-batch m's counted targets over every batch rank (its MoE batch). Every stage holds
  // the micro-batches' targets, so every rank of the dp group takes part, layers or not.
  std::vector<double> counts;
  for (const auto& micro : micros) counts.push_back(static_cast<double>(micro.counted));
  Tensor group_counts = from_vector(counts, {static_cast<int64_t>(counts.size())}, DType::f64);
  mesh_.group(MeshDim::dp)->all_reduce(group_counts, ReduceOp::sum);
  std::vector<ExpertParallelMoE::AuxWeight> weights;
  for (double g : group_counts.to_vector()) weights.push_back({.gradient = g * dp / global_count, .share = g / global_count});
  for (ExpertParallelMoE* moe : layers()) moe->begin_step(weights);
}

double ExpertParallelStep::end() {
  double share = 0;
  for (ExpertParallelMoE* moe : layers()) share += moe->end_step();
  return holds_aux() ? share : 0.0;
}

bool ExpertParallelStep::holds_aux() const {
  return mesh_.coordinate(MeshDim::tp) == 0 && !layers().empty();
}

std::vector<Tensor> ExpertParallelStep::unused_parameters() const {
  std::vector<Tensor> out;
  for (ExpertParallelMoE* moe : layers())
    for (int64_t j = 0; j < moe->local_experts(); ++j)
      if (moe->served().at(static_cast<size_t>(j)) == 0)
        for (const Tensor& param : moe->expert(j).parameters()) out.push_back(param);
  return out;
}

nn::StateDict ExpertParallelStep::with_every_expert(nn::StateDict whole) const {
  NoGradGuard no_grad;
  const nn::GPTConfig& config = parts_.at(0)->config();
  ProcessGroup& ep = *mesh_.group(MeshDim::ep);
  const int64_t per_rank = config.moe_experts / ep.size();
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    if (!config.is_moe_layer(layer)) continue;
    const std::string experts = "h." + std::to_string(layer) + ".mlp.experts.";
    for (int64_t j = 0; j < per_rank; ++j) {
      const std::string mine = experts + std::to_string(ep.rank() * per_rank + j) + ".";
      std::vector<std::pair<std::string, Tensor>> pieces;  // (suffix, this rank's tensor), in name order
      for (auto it = whole.lower_bound(mine); it != whole.end() && it->first.rfind(mine, 0) == 0; ++it)
        pieces.emplace_back(it->first.substr(mine.size()), it->second);
      SL_CHECK(!pieces.empty(), "expert parallel: the gathered state has no '", mine, "*' (this ep rank's expert)");
      for (const auto& [suffix, piece] : pieces) {
        const Tensor flat = piece.reshape({1, piece.numel()});
        Tensor all = Tensor::empty({ep.size(), piece.numel()}, piece.options());  // [ep, numel]
        ep.all_gather(all, flat);
        for (int r = 0; r < ep.size(); ++r)
          whole[experts + std::to_string(r * per_rank + j) + "." + suffix] = all.narrow(0, r, 1).reshape(piece.shape()).clone();
      }
    }
  }
  return whole;
}

}  // namespace sl::parallel
