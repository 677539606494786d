// expert_parallel_moe.h — nn::MoE with its experts sharded over ep (the story: expert_parallel.h).
//
//   ExpertParallelMoE moe(serial, groups);   // this rank's experts of `serial`, its router replicated
//   y = moe(x);                              // x [B_l, T, C]: this rank's rows of the batch
//   ... backward; average the replicated gradients over groups.batch (DDP) ...
//   moe.sum_expert_gradients();              // experts: summed over groups.replicas
#pragma once
#include <memory>

#include "nn/moe.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

struct ExpertGroups {
  ProcessGroupPtr ep;        // the ranks the experts are sharded over (E/ep each)
  ProcessGroupPtr batch;     // the ranks that split the batch (dp × ep), ep innermost: rank = d·ep + ep rank
  ProcessGroupPtr replicas;  // the ranks holding the same experts (same ep rank, every dp rank)
};

class ExpertParallelMoE : public nn::UnaryModule {
 public:
  // Shares `serial`'s router and experts [r·E/ep, (r+1)·E/ep) (named experts.<e>, as in the serial
  // model). Throws sl::Error unless ep divides E and the groups fit (batch = replicas × ep).
  ExpertParallelMoE(const nn::MoE& serial, ExpertGroups groups);
  Tensor forward(const Tensor& x) override;  // [B_l, T, C] (or [N_l, C]) -> the same shape

  // Of the last forward: the global batch's routing (every rank the same), and this rank's share of
  // the auxiliary losses (their average over groups.batch is the serial loss).
  const nn::MoEStats& stats() const { return stats_; }
  Tensor aux_loss() const;
  // The experts' gradients summed over groups.replicas (collective there); call after backward.
  void sum_expert_gradients();

  int64_t first_expert() const { return first_; }
  int64_t local_experts() const { return static_cast<int64_t>(experts->size()); }

  std::shared_ptr<nn::Linear> router;
  std::shared_ptr<nn::ModuleList> experts;  // this rank's, named by their global index

 private:
  ExpertGroups groups_;
  int64_t num_experts_, first_, top_k_;
  double capacity_factor_, aux_weight_, z_weight_;
  nn::MoERouter order_;
  nn::MoEStats stats_;
  Tensor balance_, z_;
};

}  // namespace sl::parallel
