// moe.cpp — see moe.h.
#include "nn/moe.h"

#include <functional>
#include <utility>

namespace sl::nn {

int64_t MoEStats::dropped() const {
  int64_t total = 0;
  for (size_t e = 0; e < routed.size(); ++e) total += routed[e] - kept[e];
  return total;
}

MoE::MoE(const GPTConfig& config, const InitOptions& init)
    : top_k(config.moe_top_k),
      capacity_factor(config.moe_capacity_factor),
      order(config.moe_router),
      aux_weight(config.moe_aux_weight),
      z_weight(config.moe_z_weight) {
  SL_CHECK(config.moe_experts >= 1 && top_k >= 1 && top_k <= config.moe_experts, "MoE: top_k (", top_k,
           ") must be in [1, moe_experts = ", config.moe_experts, "]");
  router = register_module("router", std::make_shared<Linear>(config.n_embd, config.moe_experts, false, init));
  experts = register_module("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < config.moe_experts; ++e) experts->push_back(std::make_shared<MLP>(config, init));
}

MoE::MoE(const MoE& settings, std::shared_ptr<Linear> shared_router, std::shared_ptr<ModuleList> some_experts)
    : top_k(settings.top_k),
      capacity_factor(settings.capacity_factor),
      order(settings.order),
      aux_weight(settings.aux_weight),
      z_weight(settings.z_weight) {
  router = register_module("router", std::move(shared_router));
  experts = register_module("experts", std::move(some_experts));
}

Tensor MoE::forward(const Tensor& x) {
  SL_CHECK(x.dim() >= 2, "MoE: x must be [..., C], got ", x.shape());
  const int64_t C = x.size(-1), N = x.numel() / C, E = num_experts();
  Tensor tokens = x.reshape({N, C});                      // [N, C]
  Tensor logits = (*router)(tokens);                      // [N, E]
  Routing routing = route(logits, top_k, order);          // experts, weights [N, k]
  const int64_t capacity = expert_capacity(capacity_factor, N, top_k, E);
  DispatchPlan plan = plan_dispatch(routing.experts, E, capacity, x.device());
  record({plan.routed, plan.kept, N, capacity});
  balance_ = nn::load_balancing_loss(routing.probs, plan.routed, top_k);
  z_ = router_z_loss(logits);

  Tensor rows = dispatch(tokens, plan);  // [M, C], expert by expert
  std::vector<Tensor> outputs;           // each expert's [kept_e, 4C] -> [kept_e, C]
  int64_t first = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = plan.kept[static_cast<size_t>(e)];
    if (count > 0) outputs.push_back(expert(e)(rows.narrow(0, first, count)));
    first += count;
  }
  Tensor y = outputs.empty() ? rows : outputs.size() == 1 ? outputs[0] : cat(outputs, 0);  // [M, C]
  return combine(y, routing.weights, plan).reshape(x.shape());                             // [N, C] -> x's shape
}

void MoE::record(MoEStats stats) {
  if (load_.routed.size() != stats.routed.size()) load_ = {std::vector<int64_t>(stats.routed.size()),
                                                           std::vector<int64_t>(stats.routed.size()), 0, stats.capacity};
  for (size_t e = 0; e < stats.routed.size(); ++e) load_.routed[e] += stats.routed[e], load_.kept[e] += stats.kept[e];
  load_.tokens += stats.tokens;
  stats_ = std::move(stats);
}

MoEStats MoE::take_load() { return std::exchange(load_, MoEStats{}); }

std::vector<std::pair<std::string, MoEStats>> take_moe_loads(Module& root) {
  std::vector<std::pair<std::string, MoEStats>> out;
  std::function<void(Module&, const std::string&)> visit = [&](Module& m, const std::string& name) {
    if (auto* moe = dynamic_cast<MoE*>(&m)) out.emplace_back(name, moe->take_load());
    for (const auto& [child, module] : m.children()) visit(*module, name.empty() ? child : name + "." + child);
  };
  visit(root, "");
  return out;
}

Tensor MoE::aux_loss() const {
  SL_CHECK(balance_.defined(), "MoE::aux_loss: no forward has run yet");
  return add(mul(balance_, aux_weight), mul(z_, z_weight));
}

}  // namespace sl::nn
