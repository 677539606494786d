// plan_request.cpp — see plan_request.h.
#include "parallel/planner/plan_request.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "parallel/planner/planner.h"
#include "parallel/train/plan_of_options.h"

namespace sl::parallel::planner {

// The preset (or train's defaults: 2 layers, 4 heads, 128 wide, V 256, T 64) with the flags' overrides.
ModelShape plan_model(const PlanOptions& o, const nn::MixedPrecision& precision) {
  ModelShape m;
  if (!o.model.empty()) m = preset_config(o.model);
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

// train's mapping from its flags to a TrainPlan (parallel/train/plan_of_options.h), after its
// combination checks, with the batch the planner was given.
TrainPlan plan_layout(TrainOptions o, int64_t batch_size, const nn::MixedPrecision& precision) {
  o.batch_size = batch_size;
  check_layout_options(o);
  return plan_of_options(o, precision);
}

// --cluster FILE, or the flags; without --nodes: enough nodes for `world` ranks (search: 1 node).
Cluster plan_cluster(const PlanOptions& o, int64_t world) {
  if (!o.cluster_file.empty()) return Cluster::load(o.cluster_file);
  Cluster c;
  const bool spec_says = o.links.find("gpus-per-node") != std::string::npos;
  c.topology = Topology::parse_links(
      spec_says ? o.links : o.links + ";gpus-per-node=" + std::to_string(o.gpus_per_node));
  SL_CHECK(!spec_says || !o.cluster_flags.count("--gpus-per-node") || c.topology.gpus_per_node == o.gpus_per_node,
           "--links says gpus-per-node=", c.topology.gpus_per_node, " but --gpus-per-node is ", o.gpus_per_node);
  const int64_t per_node = c.topology.gpus_per_node;
  c.nodes = static_cast<int>(o.nodes ? o.nodes : std::max<int64_t>(1, (world + per_node - 1) / per_node));
  c.gpu_memory_bytes = parse_bytes(o.gpu_memory, "--gpu-memory");
  c.flops = parse_flops(o.flops, "--flops");
  c.validate();
  return c;
}

PlanRequest resolve_plan(const PlanOptions& o) {
  PlanRequest r;
  r.precision = nn::MixedPrecision::parse(o.layout.mixed_precision, o.grad_reduce_dtype);
  r.work.model = plan_model(o, r.precision);
  SL_CHECK(!r.work.model.has_experts() || !r.precision.enabled(), "--mixed-precision ", o.layout.mixed_precision,
           " with a mixture of experts: train runs one in f32 only (it refuses --moe-experts with ",
           "--mixed-precision), so no layout would be trainable; drop --mixed-precision");
  const int64_t layout_world = o.layout_given ? o.layout.world() : 0;
  r.cluster = plan_cluster(o, layout_world);
  SL_CHECK(layout_world <= r.cluster.world(), "the layout's ", layout_world, " ranks do not fit the cluster's ",
           r.cluster.world(), " GPUs (", r.cluster.nodes, " nodes x ", r.cluster.gpus_per_node(), ")");
  r.work.batch.batch_size = o.batch_size ? o.batch_size : (layout_world ? layout_world : r.cluster.world());
  r.work.batch.seq_len = o.seq_len ? o.seq_len : r.work.model.block_size;
  if (o.layout_given) {
    r.layout = plan_layout(o.layout, r.work.batch.batch_size, r.precision);
    check_layout(r.work, *r.layout, static_cast<int>(layout_world));
  }
  return r;
}

// One layout: its row, where its time goes per group, as text.
std::string layout_text(const LayoutEstimate& e, bool show_ep) {
  std::string out = layout_table({e}, 1, show_ep);
  out += "\ngroup          op              calls   bytes (sent|recv)     seconds     exposed  hides behind\n";
  char line[256];
  for (const GroupTime& g : e.groups) {
    std::snprintf(line, sizeof line, "%-14s %-14s %6lld %18lld %11.6f %11.6f  %s\n", g.traffic.group.c_str(),
                  comm_op_name(g.traffic.op), (long long)g.traffic.calls, (long long)std::max(g.traffic.bytes_sent, g.traffic.bytes_received),
                  g.seconds, g.exposed, g.hides_behind.empty() ? "-" : g.hides_behind.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "\ncompute %.4f s + exposed communication %.4f s + bubble %.4f s (%.1f%%, %s) = %.4f s\n",
                e.compute_s, e.exposed_comm_s, e.bubble_s, 100 * e.bubble, e.bubble_simulated ? "simulated" : "formula",
                e.step_time_s);
  return out + line;
}

std::string run_plan(const PlanOptions& o) {
  const PlanRequest r = resolve_plan(o);
  if (r.layout) {
    const LayoutEstimate e = estimate_layout(r.work, r.cluster, *r.layout);
    return o.json ? layouts_json(r.work, r.cluster, {e}) : layout_text(e, r.work.model.has_experts());
  }
  const Ranking ranking = search(r.work, r.cluster, {.precision = r.precision});
  const size_t shown = o.top == 0 ? ranking.layouts.size() : std::min<size_t>(o.top, ranking.layouts.size());
  const std::vector<LayoutEstimate> top(ranking.layouts.begin(), ranking.layouts.begin() + shown);
  if (o.json) return layouts_json(r.work, r.cluster, top, ranking.considered, ranking.impossible);
  char head[512], active[64] = "";
  const ModelShape& m = r.work.model;
  const ParameterCount count = model_parameters(m);
  if (m.has_experts())
    std::snprintf(active, sizeof active, " (%.3g active: %lld of %lld experts a token)", (double)count.active,
                  (long long)(m.moe_top_k + m.shared_experts), (long long)(m.moe_experts + m.shared_experts));
  std::snprintf(head, sizeof head, "%s: %.3g parameters%s, batch %lld x %lld tokens on %s\n%lld layouts considered, "
                "%lld impossible, %d fit; the first %zu:\n\n", o.model.empty() ? "model" : o.model.c_str(),
                m.has_experts() ? (double)count.total : (double)gpt_parameters(m), active, (long long)r.work.batch.batch_size,
                (long long)r.work.batch.seq_len, r.cluster.str().c_str(), (long long)ranking.considered,
                (long long)ranking.impossible, ranking.fitting(), shown);
  return head + layout_table(top, 1, m.has_experts()) + "\n" + recommendation(ranking, r.work, r.cluster);
}

}  // namespace sl::parallel::planner
