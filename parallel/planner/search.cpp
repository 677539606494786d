// search.cpp — see search.h.
#include "parallel/planner/search.h"

#include <algorithm>
#include <map>
#include <optional>

#include "parallel/nd/parallelize_options.h"
#include "tensor/error.h"

namespace sl::parallel::planner {

void check_workload(const Workload& work) {
  work.model.validate();
  SL_CHECK(work.batch.seq_len >= 1 && work.batch.seq_len <= work.model.block_size, "the sequence length ",
           work.batch.seq_len, " must be in 1..block_size ", work.model.block_size);
  SL_CHECK(work.batch.batch_size >= 1, "the batch size must be >= 1 (got ", work.batch.batch_size, ")");
}

void check_layout(const Workload& work, const TrainPlan& plan, int world) {
  const ModelShape& m = work.model;
  const ParallelismConfig& c = plan.parallelism;
  check_workload(work);
  check_trainable(m, plan, world);
  SL_CHECK(m.n_head % c.tp == 0, "tp ", c.tp, " does not divide the ", m.n_head, " heads");
  SL_CHECK(m.n_layer % (static_cast<int64_t>(c.pp) * plan.virtual_stages) == 0, "pp ", c.pp,
           " x virtual stages ", plan.virtual_stages, " does not divide the ", m.n_layer, " layers");
  SL_CHECK(work.batch.seq_len % c.cp == 0, "cp ", c.cp, " does not divide the sequence length ",
           work.batch.seq_len);
  check_experts(m, c);
  const int64_t split = static_cast<int64_t>(c.dp_replicate) * c.dp_shard * c.ep * plan.micro_batches;
  SL_CHECK(work.batch.batch_size >= 1 && work.batch.batch_size % split == 0, "the global batch of ",
           work.batch.batch_size, " rows does not split into dp_replicate ", c.dp_replicate, " x dp_shard ",
           c.dp_shard, c.ep > 1 ? " x ep " + std::to_string(c.ep) : std::string(), " x ", plan.micro_batches,
           " micro-batches");
  check_model_cut(m, plan.parallelize_options(), plan.micro_batches);
}

int Ranking::fitting() const {
  return static_cast<int>(std::count_if(layouts.begin(), layouts.end(), [](const auto& l) { return l.fits; }));
}

std::string layout_name(const TrainPlan& plan) {
  const ParallelismConfig& c = plan.parallelism;
  if (c.ep == 1) return plan.name();
  TrainPlan named = plan;  // DDP over the ep ranks alone: name it as over dp > 1 ("pp8 ddp", not "pp8")
  if (plan.zero() == 0 && c.dp_replicate * c.dp_shard == 1) named.parallelism.dp_replicate = 2;
  return "ep" + std::to_string(c.ep) + " " + named.name();
}

bool ranks_before(const LayoutEstimate& a, const LayoutEstimate& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits && a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
  if (!a.fits && a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
  return layout_name(a.plan) < layout_name(b.plan);
}

namespace {

std::vector<int> divisors(int n, int limit) {
  std::vector<int> out;
  for (int d = 1; d <= n && d <= limit; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The data-parallel choices over dp ranks: DDP, ZeRO-1/2, FSDP, HSDP sharded within a node. With ep > 1
// the ep ranks are data-parallel ranks for every weight but the experts: ZeRO has something to shard
// even at dp 1.
std::vector<TrainPlan> data_parallel_choices(TrainPlan cut, int dp, int shard_in_node) {
  std::vector<TrainPlan> out;
  for (int zero = 0; zero <= (dp * cut.parallelism.ep > 1 ? 3 : 0); ++zero) {
    TrainPlan p = cut;
    p.dp_strategy = zero_stage_strategy(zero);
    (zero == 0 ? p.parallelism.dp_replicate : p.parallelism.dp_shard) = dp;
    out.push_back(p);
  }
  if (shard_in_node > 1 && shard_in_node < dp && dp % shard_in_node == 0) {
    TrainPlan p = cut;
    p.dp_strategy = DpStrategy::fsdp;
    p.parallelism.dp_replicate = dp / shard_in_node;
    p.parallelism.dp_shard = shard_in_node;
    out.push_back(p);
  }
  return out;
}

// A plan's pipeline choices: (schedule, virtual stages), and the micro-batch counts to try.
std::vector<std::pair<ScheduleKind, int>> schedules(int pp) {
  if (pp == 1) return {{ScheduleKind::one_f_one_b, 1}};
  return {{ScheduleKind::one_f_one_b, 1},
          {ScheduleKind::gpipe, 1},
          {ScheduleKind::interleaved, 2},
          {ScheduleKind::zero_bubble, 1}};
}

std::vector<int> micro_batch_counts(int pp, int64_t rows_per_rank) {
  std::vector<int> out;
  for (int64_t m = pp == 1 ? 1 : pp; m <= rows_per_rank && out.size() < (pp == 1 ? 12u : 4u); m *= 2)
    if (rows_per_rank % m == 0) out.push_back(static_cast<int>(m));
  return out;
}

struct Searcher {
  const Workload& work;
  const Cluster& cluster;
  BubbleCache bubbles;
  Ranking ranking;

  // Tries m = counts in order; keeps the best fitting one (pp = 1: the first that fits).
  void try_micro_batches(TrainPlan plan, const std::vector<int>& counts) {
    std::optional<LayoutEstimate> best;
    for (int m : counts) {
      plan.micro_batches = m;
      ++ranking.considered;
      try {
        check_layout(work, plan, cluster.world());
      } catch (const Error&) {
        ++ranking.impossible;
        continue;
      }
      LayoutEstimate e = estimate_layout(work, cluster, plan, &bubbles);
      const bool stop = e.fits && plan.parallelism.pp == 1;
      if (!best || ranks_before(e, *best)) best = std::move(e);
      if (stop) break;
    }
    if (best) ranking.layouts.push_back(std::move(*best));
  }
};

}  // namespace

Ranking search(const Workload& work, const Cluster& cluster, const SearchOptions& options) {
  cluster.validate();
  check_workload(work);
  Searcher s{work, cluster, {}, {}};
  const int world = cluster.world();
  const ModelShape& m = work.model;
  for (int tp : divisors(world, world))
    for (int cp : divisors(world / tp, options.max_cp))
      for (int pp : divisors(world / (tp * cp), world)) {
        if (m.n_head % tp || m.n_layer % pp || work.batch.seq_len % cp) continue;  // counted by check_layout otherwise
        const int data = world / (tp * cp * pp);  // the ranks that read other rows: dp x ep
        if (work.batch.batch_size % data) continue;
        for (int ep : divisors(data, m.has_experts() ? data : 1)) {
          if (m.has_experts() && m.moe_experts % ep) continue;
          const int dp = data / ep;
          TrainPlan cut;
          cut.precision = options.precision;
          cut.parallelism = {.dp_replicate = 1, .dp_shard = 1, .pp = pp, .cp = cp, .tp = tp, .ep = ep};
          cut.sequence_parallel = options.sequence_parallel && tp > 1;
          const int shard_in_node = std::max(1, cluster.gpus_per_node() / (tp * cp * ep));
          for (const TrainPlan& strategy : data_parallel_choices(cut, dp, shard_in_node))
            for (auto [kind, v] : schedules(pp)) {
              TrainPlan plan = strategy;
              plan.schedule = kind;
              plan.virtual_stages = v;
              s.try_micro_batches(plan, micro_batch_counts(pp, work.batch.batch_size / data));
            }
        }
      }
  std::sort(s.ranking.layouts.begin(), s.ranking.layouts.end(), ranks_before);
  return std::move(s.ranking);
}

}  // namespace sl::parallel::planner
