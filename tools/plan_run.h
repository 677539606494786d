// plan_run.h — what build/bin/plan does with its flags (tools/plan_cli.h): resolve them into a
// workload, a cluster and maybe one layout (sl::Error naming the value when they do not fit
// together), then evaluate that layout or search them all, as text or JSON. Tests call run_plan.
#pragma once
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "parallel/planner/planner.h"
#include "tools/plan_cli.h"

namespace sl {

namespace planner = parallel::planner;

struct PlanRequest {
  planner::Workload work;
  planner::Cluster cluster;
  std::optional<parallel::TrainPlan> layout;  // one layout to evaluate; none: search
  nn::MixedPrecision precision;
};

// The preset (or train's defaults: 2 layers, 4 heads, 128 wide, V 256, T 64) with the flags' overrides.
inline nn::GPTConfig plan_model(const PlanOptions& o, const nn::MixedPrecision& precision) {
  nn::GPTConfig m;
  if (!o.model.empty()) m = planner::preset_config(o.model);
  else m.n_layer = 2, m.n_head = 4, m.n_embd = 128, m.vocab_size = 256, m.block_size = 64;
  if (o.n_layer) m.n_layer = o.n_layer;
  if (o.n_head) m.n_head = o.n_head;
  if (o.n_embd) m.n_embd = o.n_embd;
  if (o.vocab_size) m.vocab_size = o.vocab_size;
  if (o.block_size) m.block_size = o.block_size;
  SL_CHECK(m.n_embd % m.n_head == 0, "--n-embd (", m.n_embd, ") must be divisible by --n-head (", m.n_head, ")");
  m.recompute = nn::parse_recompute(o.layout.recompute);
  m.param_dtype = precision.param_dtype;
  m.validate();
  return m;
}

// train's mapping from its flags to a TrainPlan (tools/train.cpp), and its combination checks.
inline parallel::TrainPlan plan_layout(Options o, int64_t batch_size, const nn::MixedPrecision& precision) {
  o.batch_size = batch_size;
  parallel::check_layout_options(o);
  parallel::TrainPlan plan = parallel::TrainPlan::data_parallel(static_cast<int>(o.data_parallel()),
                                                                static_cast<int>(o.zero));
  if (o.dp_replicate > 0) {  // HSDP: FSDP within the shards
    plan.parallelism = {.dp_replicate = static_cast<int>(o.dp_replicate), .dp_shard = static_cast<int>(o.dp_shard)};
    plan.dp_strategy = parallel::DpStrategy::fsdp;
  }
  plan.parallelism.pp = static_cast<int>(o.pp);
  plan.parallelism.tp = static_cast<int>(o.tp);
  plan.parallelism.cp = static_cast<int>(o.cp);
  plan.offload = o.offload;
  plan.micro_batches = static_cast<int>(o.micro_batches);
  plan.schedule = parallel::parse_schedule(o.schedule);
  plan.virtual_stages = static_cast<int>(o.virtual_stages);
  plan.sequence_parallel = o.sp;
  plan.cp_balance = parallel::parse_cp_balance(o.cp_balance);
  plan.cp_variant = parallel::parse_cp_variant(o.cp_variant);
  plan.ulysses_degree = static_cast<int>(o.ulysses_degree);
  plan.precision = precision;
  return plan;
}

// --cluster FILE, or the flags; without --nodes: enough nodes for `world` ranks (search: 1 node).
inline planner::Cluster plan_cluster(const PlanOptions& o, int64_t world) {
  if (!o.cluster_file.empty()) return planner::Cluster::load(o.cluster_file);
  planner::Cluster c;
  const bool spec_says = o.links.find("gpus-per-node") != std::string::npos;
  c.topology = parallel::Topology::parse_links(
      spec_says ? o.links : o.links + ";gpus-per-node=" + std::to_string(o.gpus_per_node));
  SL_CHECK(!spec_says || !o.cluster_flags.count("--gpus-per-node") || c.topology.gpus_per_node == o.gpus_per_node,
           "--links says gpus-per-node=", c.topology.gpus_per_node, " but --gpus-per-node is ", o.gpus_per_node);
  const int64_t per_node = c.topology.gpus_per_node;
  c.nodes = static_cast<int>(o.nodes ? o.nodes : std::max<int64_t>(1, (world + per_node - 1) / per_node));
  c.gpu_memory_bytes = parallel::parse_bytes(o.gpu_memory, "--gpu-memory");
  c.flops = parallel::parse_flops(o.flops, "--flops");
  c.validate();
  return c;
}

inline PlanRequest resolve_plan(const PlanOptions& o) {
  PlanRequest r;
  r.precision = nn::MixedPrecision::parse(o.layout.mixed_precision, o.grad_reduce_dtype);
  r.work.model = plan_model(o, r.precision);
  const int64_t layout_world = o.layout_given ? o.layout.world() : 0;
  r.cluster = plan_cluster(o, layout_world);
  SL_CHECK(layout_world <= r.cluster.world(), "the layout's ", layout_world, " ranks do not fit the cluster's ",
           r.cluster.world(), " GPUs (", r.cluster.nodes, " nodes x ", r.cluster.gpus_per_node(), ")");
  r.work.batch.batch_size = o.batch_size ? o.batch_size : (layout_world ? layout_world : r.cluster.world());
  r.work.batch.seq_len = o.seq_len ? o.seq_len : r.work.model.block_size;
  if (o.layout_given) {
    r.layout = plan_layout(o.layout, r.work.batch.batch_size, r.precision);
    planner::check_layout(r.work, *r.layout, static_cast<int>(layout_world));
  }
  return r;
}

// One layout: its row, where its time goes per group, as text.
inline std::string layout_text(const planner::LayoutEstimate& e) {
  std::string out = planner::layout_table({e});
  out += "\ngroup          op              calls   bytes (sent|recv)     seconds     exposed  hides behind\n";
  char line[256];
  for (const planner::GroupTime& g : e.groups) {
    std::snprintf(line, sizeof line, "%-14s %-14s %6lld %18lld %11.6f %11.6f  %s\n", g.traffic.group.c_str(),
                  parallel::comm_op_name(g.traffic.op), (long long)g.traffic.calls, (long long)std::max(g.traffic.bytes_sent, g.traffic.bytes_received),
                  g.seconds, g.exposed, g.hides_behind.empty() ? "-" : g.hides_behind.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "\ncompute %.4f s + exposed communication %.4f s + bubble %.4f s (%.1f%%, %s) = %.4f s\n",
                e.compute_s, e.exposed_comm_s, e.bubble_s, 100 * e.bubble, e.bubble_simulated ? "simulated" : "formula",
                e.step_time_s);
  return out + line;
}

inline std::string run_plan(const PlanOptions& o) {
  const PlanRequest r = resolve_plan(o);
  if (r.layout) {
    const planner::LayoutEstimate e = planner::estimate_layout(r.work, r.cluster, *r.layout);
    return o.json ? planner::layouts_json(r.work, r.cluster, {e}) : layout_text(e);
  }
  const planner::Ranking ranking = planner::search(r.work, r.cluster, {.precision = r.precision});
  const size_t shown = o.top == 0 ? ranking.layouts.size() : std::min<size_t>(o.top, ranking.layouts.size());
  const std::vector<planner::LayoutEstimate> top(ranking.layouts.begin(), ranking.layouts.begin() + shown);
  if (o.json) return planner::layouts_json(r.work, r.cluster, top, ranking.considered, ranking.impossible);
  char head[512];
  std::snprintf(head, sizeof head, "%s: %.3g parameters, batch %lld x %lld tokens on %s\n%lld layouts considered, "
                "%lld impossible, %d fit; the first %zu:\n\n", o.model.empty() ? "model" : o.model.c_str(),
                (double)planner::gpt_parameters(r.work.model), (long long)r.work.batch.batch_size,
                (long long)r.work.batch.seq_len, r.cluster.str().c_str(), (long long)ranking.considered,
                (long long)ranking.impossible, ranking.fitting(), shown);
  return head + planner::layout_table(top) + "\n" + planner::recommendation(ranking, r.work, r.cluster);
}

}  // namespace sl
