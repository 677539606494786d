// apply_expert_parallel.h — expert parallelism applied to a model part (parallelize.cpp calls it
// when ep > 1; a lesson or a test may call it alone): every mixture-of-experts block's nn::MoE is
// replaced by an ExpertParallelMoE holding this rank's E/ep experts, and every expert weight is
// placed sharded(0, "ep"): the stack of the E experts' tensors cut over ep, each rank holding its
// experts whole. The strategies read that placement (parallel/runner/data_parallel_strategy.h:
// is_expert_parameter) and average an expert's gradient over expert_dp_cp, not dp_cp.
#pragma once
#include <string>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/expert_parallel/expert_parallel_moe.h"

namespace sl::parallel {

// Each cp rank's global token positions for a sequence of T (the context-parallel cut's shards).
using TokenPositions = std::function<std::vector<int64_t>(int cp_rank, int64_t T)>;

// The ranks whose tokens form one MoE batch (dp, which holds ep; dp_cp under cp), the ep group, and
// the ranks that hold the same experts (expert_dp_cp) of this rank of `mesh`. Under cp `positions`
// must say where each cp rank's tokens sit (parallelize.cpp passes the cut's sequence shards).
ExpertGroups expert_groups(const DeviceMesh& mesh, TokenPositions positions = {});

// What expert parallelism supports here, before any communication: ep divides every MoE's E, and
// the model has experts at all. Throws sl::Error naming the values.
void check_expert_parallel(const nn::GPTConfig& config, int ep);

// Replaces the part's MoE blocks (no communication). ep 1 changes nothing.
void apply_expert_parallel(nn::GPT& part, const DeviceMesh& mesh, TokenPositions positions = {});

// The MoE layers of a part after apply_expert_parallel, by global layer index (empty: none).
std::vector<std::pair<int64_t, ExpertParallelMoE*>> expert_parallel_layers(const nn::GPT& part);

}  // namespace sl::parallel
