// data_parallel_traffic.cpp — the data-parallel strategies' traffic (traffic_step.h): what DDP,
// ZeRO-1/2 and FSDP move for one rank in one step, with the cuts' gradient sums and the clip.
//
//   DDP       one all-reduce per bucket (in the gradients' dtype), once a step, over dp
//   ZeRO-1/2  one reduce-scatter per bucket (ZeRO-2: per backward), one all-gather per bucket of the
//             updated weights, over dp_shard; clip: all-gather of one f64
//   FSDP      per micro-batch: each unit gathered in forward and in backward and its gradients
//             reduce-scattered, over dp_shard (dp_shard_cp over a cut); HSDP: each shard all-reduced
//             over the replicas
//   with ep > 1 the groups above include ep for every weight but the routed experts, which are
//   averaged over expert_dp_cp (mesh_dim.h): DDP's own buckets there; under ZeRO and FSDP, outside
//   the flat buffers and units, one all-reduce per expert tensor (parallel/zero/expert_replicas.h);
//   the clip's norm spans ep (each ep rank holds other experts).
#include <algorithm>

#include "parallel/planner/traffic_step.h"

namespace sl::parallel::planner {

namespace {

// The dims the clip's all-gather spans (grad_norm.h): pp, ep, tp and `split_over`, those of degree > 1.
MeshDims clip_dims(const TrainPlan& plan, const MeshDims& split_over) {
  const ParallelismConfig& c = plan.parallelism;
  auto splits = [&](MeshDim d) { return std::find(split_over.begin(), split_over.end(), d) != split_over.end(); };
  MeshDims dims;
  if (c.pp > 1) dims.push_back(MeshDim::pp);
  if (splits(MeshDim::dp_shard) && c.dp_shard > 1) dims.push_back(MeshDim::dp_shard);
  if (c.ep > 1) dims.push_back(MeshDim::ep);
  if (splits(MeshDim::cp) && c.cp > 1) dims.push_back(MeshDim::cp);
  if (c.tp > 1) dims.push_back(MeshDim::tp);
  return dims;
}

// The gradient sums a cut adds once a step (ModelRunner::gradient_sums): SP's partials over tp, the
// whole part over cp, the tied wte over {first, last} stage. `elements` says what one sum moves.
void gradient_sums(Step& s, bool skip_cp, const std::function<int64_t(const std::vector<bool>&)>& elements,
                   int64_t es) {
  const ParallelismConfig& c = s.plan.parallelism;
  const size_t n = s.part.params.size();
  if (c.tp > 1 && s.plan.sequence_parallel) {
    std::vector<bool> wanted(n);
    for (size_t i = 0; i < n; ++i) wanted[i] = s.part.params[i].tp_partial;
    s.book.all_reduce({MeshDim::tp}, elements(wanted), es);
  }
  if (c.cp > 1 && !skip_cp) s.book.all_reduce({MeshDim::cp}, elements(std::vector<bool>(n, true)), es);
  if (c.pp > 1 && (s.part.first_stage || s.part.last_stage)) {
    std::vector<bool> wanted(n);
    for (size_t i = 0; i < n; ++i) wanted[i] = s.part.params[i].name == "wte.weight";
    s.book.own_all_reduce("pp_tied_wte", 2, s.part.first_stage ? 0 : 1, elements(wanted), es);
  }
}

int64_t numel_of(const RankPart& part, const std::vector<bool>& wanted) {
  int64_t total = 0;
  for (size_t i = 0; i < part.params.size(); ++i)
    if (wanted[i]) total += part.params[i].numel;
  return total;
}

// The replicated weights' data-parallel group under ZeRO: dp_shard with ep.
const MeshDims kShardWithEp = {MeshDim::dp_shard, MeshDim::ep};

// ExpertReplicas under ZeRO and FSDP: one all-reduce per expert tensor over expert_dp_cp (RankPart
// stacks an ep rank's E/ep experts in one tensor per weight; the model holds one per expert).
void expert_replica_traffic(Step& s) {
  if (s.book.size({MeshDim::expert_dp_cp}) == 1) return;
  const int64_t experts = s.model.moe_experts / s.plan.parallelism.ep;
  for (size_t i : params_where(s.part, true))
    s.book.all_reduce({MeshDim::expert_dp_cp}, s.part.params[i].numel / experts, s.ges, experts);
}

}  // namespace

void ddp_traffic(Step& s, bool replicate) {
  for (bool expert : {false, true}) {
    const std::vector<size_t> params = params_where(s.part, expert);
    const MeshDims group = expert ? MeshDims{MeshDim::expert_dp_cp} : MeshDims{MeshDim::dp};
    if (!replicate || params.empty() || (expert && s.book.size(group) == 1)) continue;
    std::vector<int64_t> bytes;
    for (size_t i : params) bytes.push_back(s.part.params[i].numel * s.ges);
    for (const auto& bucket : reverse_buckets(bytes, kBucketBytes)) {
      int64_t numel = 0;
      for (size_t k : bucket) numel += s.part.params[params[k]].numel;
      s.book.all_reduce(group, numel, s.ges);
    }
  }
  gradient_sums(s, false, [&](const std::vector<bool>& w) { return numel_of(s.part, w); }, 4);
  if (const MeshDims cut = clip_dims(s.plan, {}); !cut.empty()) s.book.all_gather(cut, 8);
}

void zero_traffic(Step& s) {
  const int64_t reduces = s.plan.dp_strategy == DpStrategy::zero2 ? s.M : 1;
  const std::vector<FlatBucketShape> buckets =
      flat_buckets(s.part, params_where(s.part, false), s.book.size(kShardWithEp), kBucketBytes, s.pes, false);
  for (const FlatBucketShape& b : buckets) {
    s.book.reduce_scatter(kShardWithEp, b.chunk * s.ges, reduces);
    s.book.all_gather(kShardWithEp, b.chunk * s.pes);
  }
  expert_replica_traffic(s);
  if (s.plan.dp_strategy == DpStrategy::zero2) {
    const int r = s.book.rank_in(kShardWithEp);
    gradient_sums(s, false, [&](const std::vector<bool>& w) { return shard_elements_of(s.part, buckets, r, w); },
                  s.ges);
  } else {
    gradient_sums(s, false, [&](const std::vector<bool>& w) { return numel_of(s.part, w); }, 4);
  }
  const bool cut = s.plan.cuts_model();
  if (!cut) s.book.all_gather(kShardWithEp, 8);
  else if (const MeshDims dims = clip_dims(s.plan, {MeshDim::dp_shard}); !dims.empty()) s.book.all_gather(dims, 8);
}

void fsdp_traffic(Step& s) {
  const ParallelismConfig& c = s.plan.parallelism;
  const bool cut = s.plan.cuts_model();
  // dp_shard_cp includes ep; off a cut cp is 1, so {dp_shard, ep} is the same set
  const MeshDims shard = {cut ? MeshDim::dp_shard_cp : MeshDim::dp_shard, MeshDim::ep};
  std::vector<FlatBucketShape> units;
  for (const UnitShape& unit : s.part.units) {
    const FlatBucketShape b = flat_buckets(s.part, unit.params, s.book.size(shard), kBucketBytes, s.pes, true)[0];
    units.push_back(b);
    s.book.all_gather(shard, b.chunk * s.pes, 2 * s.M);  // forward and backward, every micro-batch
    s.book.reduce_scatter(shard, b.chunk * s.ges, s.M);
    if (c.dp_replicate > 1) s.book.all_reduce({MeshDim::dp_replicate}, b.chunk, s.ges, s.M);
  }
  expert_replica_traffic(s);
  if (!cut) {
    s.book.all_gather(shard, 8);
    return;
  }
  const int r = s.book.rank_in(shard);
  gradient_sums(s, true, [&](const std::vector<bool>& w) { return shard_elements_of(s.part, units, r, w); }, s.ges);
  if (const MeshDims dims = clip_dims(s.plan, {MeshDim::dp_shard, MeshDim::cp}); !dims.empty())
    s.book.all_gather(dims, 8);
}

}  // namespace sl::parallel::planner
