// step_time.h — one layout's step on a cluster: FLOPs over FLOP/s, every group's collectives over
// the links they cross, what overlaps what, and the pipeline's bubble.
//
//   compute     FLOPs of the busiest pp stage's rank / the GPU's FLOP/s. Per layer and sequence of s
//               tokens, forward: 24sh² (matmuls) + 2s²h (causal attention: QKᵀ and AV, half the
//               square, as FlashAttention skips the masked blocks), both / (tp·cp); the last stage
//               adds the logits' 2shV / (tp·cp). Backward = 2 forwards; recompute full reruns the
//               layers' forward, selective only the attention core. Rows: B / dp per rank.
//   a link      latency + bytes / bandwidth (topology.h), intra-node or inter-node by world_rank /
//               gpus_per_node; a ring step lasts as long as its slowest hop.
//   collectives from estimate_traffic's (calls, bytes sent, members), n = members:
//                 all-reduce        2(n-1) steps of S/n per call   (ring: reduce-scatter + all-gather)
//                 all-gather,
//                 reduce-scatter    n-1 steps of S/n per call
//                 send / recv       one message per call; a stage sends and receives at once
//                                   (batch_isend_irecv), so the pair costs the larger of the two
//   overlap     as shardlab's chapters do it. DDP's bucketed all-reduce and ZeRO-2's bucketed
//               reduce-scatter go async from the gradient hooks during the last micro-batch's backward
//               (earlier ones accumulate locally) and hide behind it, except the last bucket, which
//               fills when backward ends. Ring attention's K/V pass hides behind the attention core.
//               Everything else is on the critical path: TP and SP collectives, all-to-alls (ep's
//               dispatch and combine, Ulysses's swaps: n-1 steps of S/n), pipeline sends and
//               receives (a pair's two directions at once: the longer counts), ZeRO-1's reduce-scatter,
//               every all-gather, FSDP's gathers and reduce-scatters (shardlab's FSDP gathers a unit
//               when it is needed, without prefetching: PyTorch's prefetches the next unit and would
//               hide most of them), HSDP's replica all-reduce, the tied wte's all-reduce, the loss.
//   pipeline    stage time = compute + TP + all-to-alls + exposed CP + p2p; bubble = stage time × bubble over ideal
//               (formulas.h, simulated from the action lists when cheap); the data-parallel
//               exposure and the tied-wte all-reduce come after.
//
//   step = stage time × (1 + bubble) + exposed data-parallel communication + tied wte all-reduce
//
//   Assumptions: FLOP/s does not depend on the micro-batch size (real GPUs slow down on small
//   ones, so more micro-batches always look better here); links are not shared between groups
//   talking at once; no compute slows down because communication runs beside it.
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/planner/cluster.h"
#include "parallel/planner/cost_model.h"

namespace sl::parallel::planner {

// What the planner plans for: the model (param_dtype and recompute set) and the batch.
struct Workload {
  ModelShape model;
  BatchShape batch;
};

// Seconds of one (group, op)'s calls on the links its members cross, alone.
double traffic_seconds(const GroupTraffic& traffic, const Topology& topology);

struct GroupTime {
  GroupTraffic traffic;
  double seconds = 0;  // on the links, alone
  double exposed = 0;  // on the critical path after overlap
  std::string hides_behind;  // "backward", "last backward", "attention", "" (nothing)
};

// FLOPs of one rank of pp stage `stage` in one optimizer step (forward, backward, recompute).
struct StageFlops {
  double total = 0, backward = 0, attention = 0;  // attention: the core's share (forward, rerun and backward)
};
StageFlops stage_flops(const Workload& work, const TrainPlan& plan, int stage);

struct LayoutEstimate {
  TrainPlan plan;
  MemoryEstimate memory;         // the most loaded rank (max over ranks of distinct pp stages)
  int most_loaded_rank = 0;
  int slowest_rank = 0;          // the rank whose step is longest; `groups` are its traffic
  std::vector<GroupTime> groups;
  double flops = 0;              // the slowest rank's FLOPs per step
  double compute_s = 0, comm_s = 0, exposed_comm_s = 0;
  double bubble = 0;             // bubble time over ideal time (0 without pp)
  bool bubble_simulated = false; // from the action lists (else the formula)
  double bubble_s = 0, step_time_s = 0;
  bool fits = false;             // memory.total() <= the GPU's memory
};

// Bubbles already worked out, by (schedule, p, m, v): a search asks for the same ones many times.
struct BubbleCache {
  std::map<std::tuple<int, int, int, int>, std::pair<double, bool>> known;  // -> (bubble, simulated)
};
// The bubble over ideal of the plan's pipeline: simulated when cheap_to_simulate, else the formula.
std::pair<double, bool> pipeline_bubble(const TrainPlan& plan, BubbleCache* cache = nullptr);

// The layout's memory and step time. The plan must be valid (search.h: check_layout).
LayoutEstimate estimate_layout(const Workload& work, const Cluster& cluster, const TrainPlan& plan,
                               BubbleCache* cache = nullptr);

}  // namespace sl::parallel::planner
