// moe.h — a mixture-of-experts MLP: a router picks k of E expert MLPs for each token.
//
//   x [B, T, C] ─► [N, C] (N = B·T) ─router─► logits [N, E] ─route─► experts, weights [N, k]
//        plan: capacity = ceil(capacity_factor · N · k / E) (or none: dropless), who is dropped
//        dispatch [M, C] ─► expert e runs its kept_e rows: c_fc [4C, C] -> GELU -> c_proj [C, 4C]
//        combine ─► out [N, C] ─► [B, T, C]
//
// The steps are nn/moe_routing.h's, with the router orders and the drop order stated there. Each
// expert is the GPT's MLP, drawn as one; the router is a Linear [E, C] without bias. Parameters:
// router.weight, experts.0.c_fc.weight, ... Drawn in that order: E·C + E·8C² numbers.
//
// Every forward records its routing (tokens per expert before and after the capacity cut) and its
// auxiliary losses (moe_routing.h: Switch's load balance and the router z-loss, still differentiable);
// aux_loss() is their weighted sum, which the GPT adds to its loss. The load is over the tokens of
// one forward: a micro-batch, for the serial model.
#pragma once
#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "nn/moe_routing.h"

namespace sl::nn {

struct MoEStats {
  std::vector<int64_t> routed;  // [E] assignments routed to each expert
  std::vector<int64_t> kept;    // [E] those computed (routed minus the dropped)
  int64_t tokens = 0;           // N
  int64_t capacity = -1;        // per expert; -1 dropless
  int64_t dropped() const;
};

class MoE : public UnaryModule {
 public:
  MoE(const GPTConfig& config, const InitOptions& init);
  Tensor forward(const Tensor& x) override;  // [B, T, C] (or [N, C]) -> the same shape
  MLP& expert(int64_t e) const { return experts->at<MLP>(static_cast<size_t>(e)); }
  int64_t num_experts() const { return static_cast<int64_t>(experts->size()); }

  // Of the last forward (undefined tensors before the first):
  const MoEStats& stats() const { return stats_; }  // the last forward's routing
  // Every forward's routing added up since the last take (a step's micro-batches), then cleared: what
  // the run report logs as tokens per expert.
  MoEStats take_load();
  const Tensor& load_balancing_loss() const { return balance_; }  // E · Σ f_e P_e
  const Tensor& z_loss() const { return z_; }                      // mean logsumexp(logits)²
  Tensor aux_loss() const;  // aux_weight · load_balancing_loss + z_weight · z_loss (scalar)

  std::shared_ptr<Linear> router;
  std::shared_ptr<ModuleList> experts;
  int64_t top_k;
  double capacity_factor;  // 0: dropless
  MoERouter order;
  double aux_weight, z_weight;

 protected:
  // A MoE of `settings`' options around the given router and experts, drawing nothing: expert
  // parallelism's layer (parallel/expert_parallel) keeps the router and its rank's experts.
  MoE(const MoE& settings, std::shared_ptr<Linear> router, std::shared_ptr<ModuleList> experts);

  void record(MoEStats stats);  // stats_ = stats, and added to the load since the last take

  MoEStats stats_, load_;
  Tensor balance_, z_;
};

// Each MoE layer under `root` (by its name, "h.1.mlp") with its load since the last take, taken.
std::vector<std::pair<std::string, MoEStats>> take_moe_loads(Module& root);

}  // namespace sl::nn
