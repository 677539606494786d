// apply_expert_parallel.cpp — see apply_expert_parallel.h.
#include "parallel/expert_parallel/apply_expert_parallel.h"

namespace sl::parallel {

ExpertGroups expert_groups(const DeviceMesh& mesh, TokenPositions positions) {
  const int cp = mesh.size(MeshDim::cp);
  SL_CHECK(cp == 1 || positions, "expert parallel: cp ", cp, " needs the sequence shards' token positions");
  return {.ep = mesh.group(MeshDim::ep),
          .batch = mesh.group(cp > 1 ? MeshDim::dp_cp : MeshDim::dp),
          .replicas = mesh.group(MeshDim::expert_dp_cp),
          .cp = cp,
          .positions = std::move(positions)};
}

void check_expert_parallel(const nn::GPTConfig& config, int ep) {
  if (ep == 1) return;
  SL_CHECK(config.moe_experts > 0, "expert parallel: ep ", ep, " needs a mixture of experts (--moe-experts E, ",
           "E divisible by ep); this model has none");
  SL_CHECK(config.moe_experts % ep == 0, "expert parallel: ", config.moe_experts, " experts do not split over ep ", ep,
           " (E % ep = ", config.moe_experts % ep, ")");
}

void apply_expert_parallel(nn::GPT& part, const DeviceMesh& mesh, TokenPositions positions) {
  const int ep = mesh.size(MeshDim::ep);
  if (ep == 1) return;
  check_expert_parallel(part.config(), ep);
  const ExpertGroups groups = expert_groups(mesh, std::move(positions));
  const nn::GPTShardSpec range = part.spec().resolved(part.config());
  for (int64_t layer = range.layer_begin; layer < range.layer_end; ++layer) {
    nn::Block& block = part.block(layer);
    if (!block.moe) continue;
    auto sharded = std::make_shared<ExpertParallelMoE>(*block.moe, groups);
    block.moe = block.replace_module("mlp", sharded);
  }
  const nn::Placement over_ep = nn::Placement::sharded(0, name(MeshDim::ep));
  for (const auto& [parameter, placement] : part.named_placements())
    if (parameter.find(".mlp.experts.") != std::string::npos) part.set_placement(parameter, over_ep);
}

std::vector<std::pair<int64_t, ExpertParallelMoE*>> expert_parallel_layers(const nn::GPT& part) {
  std::vector<std::pair<int64_t, ExpertParallelMoE*>> out;
  const nn::GPTShardSpec range = part.spec().resolved(part.config());
  for (int64_t layer = range.layer_begin; layer < range.layer_end; ++layer)
    if (auto* moe = dynamic_cast<ExpertParallelMoE*>(part.block(layer).moe.get())) out.emplace_back(layer, moe);
  return out;
}

}  // namespace sl::parallel
