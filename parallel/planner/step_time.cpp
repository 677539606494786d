// step_time.cpp — see step_time.h.
#include "parallel/planner/step_time.h"

#include <algorithm>
#include <cmath>

#include "parallel/comm/mesh.h"
#include "parallel/planner/formulas.h"

namespace sl::parallel::planner {

double traffic_seconds(const GroupTraffic& t, const Topology& topology) {
  const int n = static_cast<int>(t.members.size());
  if (n <= 1 || t.calls == 0) return 0;
  const double calls = static_cast<double>(t.calls);
  // One ring step of `chunk` bytes (a rank's share of a call), its slowest hop.
  auto step = [&](double chunk) { return topology.ring_step_seconds(t.members, std::llround(chunk)); };
  switch (t.op) {
    case CommOp::all_reduce:  // a rank sends 2(n-1)/n · S: 2(n-1) chunks of S/n
      return calls * 2 * (n - 1) * step(t.bytes_sent / (calls * 2 * (n - 1)));
    case CommOp::all_gather:
    case CommOp::reduce_scatter:
    case CommOp::broadcast:  // a chain, pipelined in n-1 pieces
      return calls * (n - 1) * step(std::max(t.bytes_sent, t.bytes_received) / (calls * (n - 1)));
    case CommOp::all_to_all:  // pairwise: n-1 steps, each a chunk of S/n to one peer and one from another
      return calls * (n - 1) * step(std::max(t.bytes_sent, t.bytes_received) / (calls * (n - 1)));
    case CommOp::send:
      return calls * step(t.bytes_sent / calls);
    case CommOp::recv:
      return calls * step(t.bytes_received / calls);
    default:  // barrier: latency only
      return calls * 2 * (n - 1) * step(0);
  }
}

namespace {

// Weights one token multiplies by in one layer, averaged over the layers, as {those tp cuts, those it
// does not}: attention's 4h², then the dense MLP's 8h² (cut), or an MoE's router Eh and the
// (k·kept + S) expert MLPs it runs (2hF each), whole on every tp rank; kept the share of assignments
// a capacity factor below 1 leaves.
std::pair<double, double> mean_layer_matmul_weights(const ModelShape& m) {
  const double h = static_cast<double>(m.n_embd), F = static_cast<double>(m.expert_width());
  const double cf = m.moe_capacity_factor, kept = cf > 0 ? std::min(1.0, cf) : 1.0;
  const double moe = static_cast<double>(m.moe_experts) * h + (m.moe_top_k * kept + m.shared_experts) * 2 * h * F;
  const double moe_layers = static_cast<double>(m.moe_layer_count()), L = static_cast<double>(m.n_layer);
  return {4 * h * h + (L - moe_layers) * 8 * h * h / L, moe_layers * moe / L};
}

}  // namespace

StageFlops stage_flops(const Workload& work, const TrainPlan& plan, int stage) {
  const ModelShape& m = work.model;
  const ParallelismConfig& c = plan.parallelism;
  const double rows = static_cast<double>(work.batch.batch_size) / (c.dp_replicate * c.dp_shard * c.ep);
  const double s = static_cast<double>(work.batch.seq_len), h = static_cast<double>(m.n_embd);
  const double cut = static_cast<double>(c.tp) * c.cp;  // each rank computes 1/(tp·cp) of every matmul
  const double layers = static_cast<double>(m.n_layer) / c.pp;
  // One forward over this rank's rows, per layer: matmuls 24sh² (2 FLOPs per weight and token: 12h²
  // of them; with experts the active weights), causal attention 2s²h.
  // An MoE block is whole on every tp rank: its expert work is tp's redundant rows, cut by cp only.
  const auto [cut_weights, whole_weights] = m.has_experts() ? mean_layer_matmul_weights(m) : std::pair{0.0, 0.0};
  const double matmul = m.has_experts() ? rows * layers * 2 * s * (cut_weights / cut + whole_weights / c.cp)
                                        : rows * layers * 24 * s * h * h / cut;
  const double attention = rows * layers * 2 * s * s * h / cut;
  const double logits = stage == c.pp - 1 ? rows * 2 * s * h * static_cast<double>(m.vocab_size) / cut : 0;
  const double rerun = m.recompute == nn::Recompute::full        ? matmul + attention
                       : m.recompute == nn::Recompute::selective ? attention
                                                                 : 0;
  StageFlops f;
  f.backward = 2 * (matmul + attention + logits) + rerun;  // the rerun runs inside the backward
  f.total = matmul + attention + logits + f.backward;
  f.attention = 3 * attention + (m.recompute == nn::Recompute::none ? 0 : attention);
  return f;
}

std::pair<double, bool> pipeline_bubble(const TrainPlan& plan, BubbleCache* cache) {
  const int p = plan.parallelism.pp, m = plan.micro_batches, v = plan.virtual_stages;
  if (p == 1) return {0.0, false};
  const auto key = std::make_tuple(static_cast<int>(plan.schedule), p, m, v);
  if (cache && cache->known.count(key)) return cache->known.at(key);
  const bool simulate = cheap_to_simulate(p, m, v);
  const std::pair<double, bool> bubble{
      simulate ? simulated_bubble(plan.schedule, p, m, v) : bubble_over_ideal(plan.schedule, p, m, v), simulate};
  if (cache) cache->known[key] = bubble;
  return bubble;
}

namespace {

// The ranks whose pp stage differs: the first, one in the middle and the last (balanced stages:
// every middle stage is alike). Rank of stage s with every other coordinate 0: s · world / pp.
std::vector<int> representative_ranks(const ParallelismConfig& c) {
  const int per_stage = c.world_size() / c.pp;
  std::vector<int> stages{0};
  if (c.pp > 2) stages.push_back(1);
  if (c.pp > 1) stages.push_back(c.pp - 1);
  for (int& s : stages) s *= per_stage;
  return stages;
}

// Data parallel: a group named first by a data-parallel dim (dp, dp_shard, dp_replicate, dp_shard_cp,
// dp_cp), alone or leading an unnamed set ("dp_shard+tp").
bool is_data_parallel(const GroupTraffic& t) {
  if (t.dims.empty()) return false;
  switch (t.dims.front()) {
    case MeshDim::dp_replicate:
    case MeshDim::dp_shard:
    case MeshDim::dp:
    case MeshDim::dp_shard_cp:
    case MeshDim::dp_cp:
    case MeshDim::expert_dp_cp:
    case MeshDim::expert_dp_shard_cp: return true;
    default: return false;
  }
}

// Whether the group is the mesh's group over `dim` alone, as the trainer names it.
bool is_group_of(const GroupTraffic& t, MeshDim dim) { return t.dims == MeshDims{dim}; }

// The runner's own groups come without members: the tied wte's pair is the first and the last
// stage's rank at this rank's other coordinates; a CP hybrid's groups split this rank's cp group
// (cp rank i·U + u: Ulysses over the U ranks of one i, the ring over the R ranks of one u); the
// loss's all-reduce spans the world.
std::vector<int> own_group_members(const GroupTraffic& t, const TrainPlan& plan, int rank) {
  const ParallelismConfig& c = plan.parallelism;
  const int per_stage = c.world_size() / c.pp, other = rank % per_stage;
  if (t.group == "pp_tied_wte") return {other, (c.pp - 1) * per_stage + other};
  if (t.group == "cp_ulysses" || t.group == "cp_ring") {
    const std::vector<int> cp = DeviceMesh::group_members(c, {MeshDim::cp}, rank);
    const int U = plan.ulysses_degree, me = static_cast<int>(std::find(cp.begin(), cp.end(), rank) - cp.begin());
    std::vector<int> out;
    for (int j = 0; j < static_cast<int>(cp.size()); ++j)
      if (t.group == "cp_ulysses" ? j / U == me / U : j % U == me % U) out.push_back(cp[j]);
    return out;
  }
  std::vector<int> world(c.world_size());
  for (int r = 0; r < c.world_size(); ++r) world[r] = r;
  return world;
}

// The groups' times and what is left of them after overlap, for one rank.
struct RankTime {
  std::vector<GroupTime> groups;
  double stage_s = 0, after_s = 0, comm_s = 0;  // stage_s: compute + per-micro-batch comm
};

RankTime rank_time(const Workload& work, const Cluster& cluster, const TrainPlan& plan, int rank) {
  const StageFlops flops = stage_flops(work, plan, rank / (plan.parallelism.world_size() / plan.parallelism.pp));
  const double compute = flops.total / cluster.flops, backward = flops.backward / cluster.flops;
  const int zero = plan.zero();
  RankTime out;
  out.stage_s = compute;
  double overlappable = 0, window = backward / plan.micro_batches, send = 0, recv = 0, cp_send = 0, cp_recv = 0;
  for (GroupTraffic t : estimate_traffic(work.model, plan, work.batch, rank)) {
    if (t.members.empty()) t.members = own_group_members(t, plan, rank);
    GroupTime g{t, traffic_seconds(t, cluster.topology), 0, ""};
    out.comm_s += g.seconds;
    const bool p2p = t.op == CommOp::send || t.op == CommOp::recv;
    if (t.op == CommOp::all_to_all) {  // ep's dispatch and combine, Ulysses's swaps: the layer waits on them
      out.stage_s += g.exposed = g.seconds;
    } else if (is_data_parallel(t)) {
      // shardlab overlaps DDP's all-reduce and ZeRO-2's reduce-scatter with backward: each bucket
      // goes async from the gradient hooks as it fills, during the last micro-batch's backward
      // (the others accumulate locally). The last bucket fills when backward ends: it cannot hide.
      // Everything else waits: ZeRO-1's reduce-scatter, every all-gather, FSDP's gathers (it does
      // not prefetch: each unit gathers when it is needed) and HSDP's replica all-reduce.
      const bool bucketed = (zero == 0 && t.op == CommOp::all_reduce) || (zero == 2 && t.op == CommOp::reduce_scatter);
      if (bucketed && t.calls > 0) {
        g.hides_behind = "last backward";
        const double last_bucket = g.seconds / static_cast<double>(t.calls);
        overlappable += g.seconds - last_bucket;
        out.after_s += last_bucket;
      } else {
        out.after_s += g.exposed = g.seconds;
      }
    } else if (is_group_of(t, MeshDim::pp) && p2p) {
      (t.op == CommOp::send ? send : recv) += g.seconds;
    } else if (is_group_of(t, MeshDim::cp) && p2p) {  // ring attention: K/V in flight while a block computes
      g.hides_behind = "attention";
      (t.op == CommOp::send ? cp_send : cp_recv) += g.seconds;
    } else if (is_group_of(t, MeshDim::tp) || is_group_of(t, MeshDim::cp)) {
      out.stage_s += g.exposed = g.seconds;
    } else {  // the tied wte's all-reduce, naive DP's exchanges, the loss: after the last backward
      out.after_s += g.exposed = g.seconds;
    }
    out.groups.push_back(g);
  }
  // A pair sends and receives at once: the longer direction is the time. What hides is exposed in
  // proportion to its share of the overflow.
  const double cp_ring = std::max(cp_send, cp_recv);
  const double dp_left = std::max(0.0, overlappable - window);
  const double cp_left = std::max(0.0, cp_ring - flops.attention / cluster.flops);
  for (GroupTime& g : out.groups) {
    const bool sends = g.traffic.op == CommOp::send;
    if (g.hides_behind == "attention")
      g.exposed = (sends ? cp_send >= cp_recv : cp_recv > cp_send) && cp_ring > 0 ? g.seconds * cp_left / cp_ring : 0;
    else if (!g.hides_behind.empty())
      g.exposed = g.seconds / static_cast<double>(g.traffic.calls) +
                  (overlappable > 0 ? (g.seconds - g.seconds / static_cast<double>(g.traffic.calls)) * dp_left / overlappable : 0);
    else if (is_group_of(g.traffic, MeshDim::pp) && sends) g.exposed = g.seconds;
    else if (is_group_of(g.traffic, MeshDim::pp)) g.exposed = std::max(0.0, recv - send) * (recv > 0 ? g.seconds / recv : 0);
  }
  out.stage_s += cp_left + std::max(send, recv);
  out.after_s += dp_left;
  return out;
}

}  // namespace

LayoutEstimate estimate_layout(const Workload& work, const Cluster& cluster, const TrainPlan& plan,
                               BubbleCache* cache) {
  LayoutEstimate e;
  e.plan = plan;
  std::tie(e.bubble, e.bubble_simulated) = pipeline_bubble(plan, cache);
  const int per_stage = plan.parallelism.world_size() / plan.parallelism.pp;
  bool first = true;
  for (int rank : representative_ranks(plan.parallelism)) {
    const MemoryEstimate memory = estimate_memory(work.model, plan, work.batch, rank);
    if (first || memory.total() > e.memory.total()) {
      e.memory = memory;
      e.most_loaded_rank = rank;
    }
    RankTime t = rank_time(work, cluster, plan, rank);
    const double step = t.stage_s * (1 + e.bubble) + t.after_s;
    if (first || step > e.step_time_s) {
      e.step_time_s = step;
      e.slowest_rank = rank;
      e.flops = stage_flops(work, plan, rank / per_stage).total;
      e.compute_s = e.flops / cluster.flops;
      e.bubble_s = t.stage_s * e.bubble;
      e.comm_s = t.comm_s;
      e.exposed_comm_s = step - e.compute_s - e.bubble_s;
      e.groups = std::move(t.groups);
    }
    first = false;
  }
  e.fits = static_cast<double>(e.memory.total()) <= cluster.gpu_memory_bytes;
  return e;
}

}  // namespace sl::parallel::planner
