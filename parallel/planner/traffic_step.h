// traffic_step.h — the pieces estimate_traffic (traffic_model.cpp) adds up, each from one chapter's
// rules: data-parallel gradients and weights (data_parallel_traffic.cpp), the cuts' activations
// (traffic_model.cpp), expert parallelism's all-to-alls (expert_traffic.cpp). Each writes what one
// rank moves in one optimizer step into the Book (traffic_book.h).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/planner/cost_model.h"
#include "parallel/planner/rank_part.h"
#include "parallel/planner/traffic_book.h"

namespace sl::parallel::planner {

struct Step {
  const ModelShape& model;
  const TrainPlan& plan;
  const RankPart& part;
  Book& book;
  int64_t micro_rows, tokens;  // rows per micro-batch, tokens of a row on this rank (T / cp)
  int M;
  int64_t pes, ges;            // parameter and gradient element bytes
};

// DDP's bucketed all-reduce (when `replicate`: a cut at dp 1 has none), then the cuts' gradient sums
// and the clip's all-gather. Expert gradients go over the expert groups (ep left out).
void ddp_traffic(Step& s, bool replicate);
// ZeRO-1/2: reduce-scatters and all-gathers per bucket, over dp_shard x ep (experts: dp_shard).
void zero_traffic(Step& s);
// FSDP / HSDP: every unit gathered and reduce-scattered per micro-batch (experts' units without ep).
void fsdp_traffic(Step& s);
// Per MoE layer and micro-batch: the ep group's dispatch and combine all-to-alls, forward and
// backward, and the routing choices' all-gather over dp_cp. Nothing for a dense model.
void expert_traffic(Step& s);

}  // namespace sl::parallel::planner
