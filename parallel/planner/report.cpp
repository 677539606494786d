// report.cpp — see report.h.
#include "parallel/planner/report.h"

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "parallel/planner/presets.h"

namespace sl::parallel::planner {

namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, fmt, a, b, c);
  return buffer;
}

double gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

std::string schedule_label(const TrainPlan& p) {
  if (p.parallelism.pp == 1) return "-";
  std::string s = schedule_name(p.schedule);
  return p.virtual_stages > 1 ? s + " v" + std::to_string(p.virtual_stages) : s;
}

}  // namespace

std::string layout_table(const std::vector<LayoutEstimate>& layouts, size_t first_rank, bool show_ep) {
  std::string out = std::string("rank  layout                              tp  pp  cp") + (show_ep ? "  ep" : "") +
                    "  dp(rxs)  zero  schedule        m   weights   grads   optim"
                    "     act   total GB  step s  exposed s  bubble  fits\n";
  for (size_t i = 0; i < layouts.size(); ++i) {
    const LayoutEstimate& e = layouts[i];
    const ParallelismConfig& c = e.plan.parallelism;
    char line[512];
    const std::string dp = std::to_string(c.dp_replicate) + "x" + std::to_string(c.dp_shard);
    const std::string ep = show_ep ? format(" %3.0f", c.ep) : "";
    std::snprintf(line, sizeof line,
                  "%4zu  %-34s %3d %3d %3d%s  %-8s %4d  %-14s %3d %9.2f %7.2f %7.2f %7.2f %10.2f %7.3f %10.3f %6.1f%%  %s\n",
                  first_rank + i, layout_name(e.plan).c_str(), c.tp, c.pp, c.cp, ep.c_str(), dp.c_str(), e.plan.zero(),
                  schedule_label(e.plan).c_str(), e.plan.micro_batches, gb(e.memory.weights), gb(e.memory.grads),
                  gb(e.memory.optimizer), gb(e.memory.activations), gb(e.memory.total()), e.step_time_s,
                  e.exposed_comm_s, 100 * e.bubble, e.fits ? "yes" : "no");
    out += line;
  }
  return out;
}

std::string layouts_json(const Workload& work, const Cluster& cluster, const std::vector<LayoutEstimate>& layouts,
                         int64_t considered, int64_t impossible) {
  using json = nlohmann::ordered_json;
  const ModelShape& m = work.model;
  json out;
  out["model"] = {{"n_layer", m.n_layer}, {"n_embd", m.n_embd},         {"n_head", m.n_head},
                  {"vocab_size", m.vocab_size}, {"block_size", m.block_size}, {"parameters", gpt_parameters(m)},
                  {"param_dtype", dtype_name(m.param_dtype)}, {"recompute", nn::recompute_name(m.recompute)}};
  if (m.has_experts()) {
    const ParameterCount count = model_parameters(m);
    out["model"]["parameters"] = count.total;
    out["model"]["active_parameters"] = count.active;
    out["model"]["experts"] = {{"routed", m.moe_experts}, {"top_k", m.moe_top_k}, {"shared", m.shared_experts},
                               {"width", m.expert_width()}, {"moe_layers", m.moe_layer_count()},
                               {"capacity_factor", m.moe_capacity_factor}};
  }
  out["batch"] = {{"batch_size", work.batch.batch_size}, {"seq_len", work.batch.seq_len}};
  out["cluster"] = {{"nodes", cluster.nodes},       {"gpus_per_node", cluster.gpus_per_node()},
                    {"gpu_memory_bytes", cluster.gpu_memory_bytes}, {"flops", cluster.flops},
                    {"links", cluster.topology.str()}};
  out["considered"] = considered;
  out["impossible"] = impossible;
  out["layouts"] = json::array();
  for (const LayoutEstimate& e : layouts) {
    const ParallelismConfig& c = e.plan.parallelism;
    json l = {{"name", layout_name(e.plan)}, {"pp", c.pp}, {"dp_replicate", c.dp_replicate}, {"dp_shard", c.dp_shard},
              {"cp", c.cp}, {"tp", c.tp}, {"sp", e.plan.sequence_parallel}, {"zero", e.plan.zero()},
              {"schedule", schedule_name(e.plan.schedule)}, {"virtual_stages", e.plan.virtual_stages},
              {"micro_batches", e.plan.micro_batches}};
    if (m.has_experts()) l["ep"] = c.ep;
    l["memory_bytes"] = {{"weights", e.memory.weights}, {"grads", e.memory.grads}, {"optimizer", e.memory.optimizer},
                         {"activations", e.memory.activations}, {"total", e.memory.total()},
                         {"host_offload", e.memory.host_offload}, {"rank", e.most_loaded_rank}};
    json groups = json::object();
    for (const GroupTime& g : e.groups)
      groups[g.traffic.group][comm_op_name(g.traffic.op)] = {
          {"calls", g.traffic.calls}, {"bytes_sent", g.traffic.bytes_sent},
          {"bytes_received", g.traffic.bytes_received}, {"members", g.traffic.members.size()},
          {"seconds", g.seconds}, {"exposed_seconds", g.exposed}, {"hides_behind", g.hides_behind}};
    l["bytes_per_step"] = groups;
    l["bytes_rank"] = e.slowest_rank;
    l["flops"] = e.flops;
    l["compute_s"] = e.compute_s;
    l["comm_s"] = e.comm_s;
    l["exposed_comm_s"] = e.exposed_comm_s;
    l["bubble"] = e.bubble;
    l["bubble_simulated"] = e.bubble_simulated;
    l["bubble_s"] = e.bubble_s;
    l["step_time_s"] = e.step_time_s;
    l["fits"] = e.fits;
    out["layouts"].push_back(l);
  }
  return out.dump(2) + "\n";
}

namespace {

// The best layout (fitting first) among those `differs` picks: an alternative to the winner.
std::optional<LayoutEstimate> best_other(const Ranking& r, const std::function<bool(const LayoutEstimate&)>& differs) {
  for (const LayoutEstimate& e : r.layouts)  // sorted: the first match is the best
    if (differs(e)) return e;
  return std::nullopt;
}

// "with tp 4 the best layout (name) takes 1.52 s (+23%)" or "... needs 96.1 GB of 80 GB".
std::string against(const LayoutEstimate& best, const std::optional<LayoutEstimate>& other, const std::string& what,
                    const Cluster& cluster) {
  if (!other) return "no layout with another " + what + " can run here";
  const std::string name = layout_name(other->plan);
  if (!other->fits)
    return "no layout with another " + what + " fits: the best, " + name + ", needs " +
           format("%.1f GB of %.0f GB", gb(other->memory.total()), cluster.gpu_memory_bytes / 1e9);
  return "the best with another " + what + ", " + name + ", takes " +
         format("%.3f s (%+.1f%%)", other->step_time_s, 100 * (other->step_time_s / best.step_time_s - 1));
}

std::string placement(const Cluster& cluster, const ParallelismConfig& c, MeshDim dim) {
  const bool crosses = cluster.topology.crosses_nodes(DeviceMesh::group_members(c, {dim}, 0));
  return crosses ? "across nodes (" + cluster.topology.inter.str() + ")"
                 : "inside a node (" + cluster.topology.intra.str() + ")";
}

}  // namespace

std::string recommendation(const Ranking& r, const Workload& work, const Cluster& cluster) {
  if (r.layouts.empty()) return "No layout divides this model and batch over " + std::to_string(cluster.world()) +
                                " GPUs (check the heads, layers, sequence length and batch size).\n";
  const LayoutEstimate& best = r.layouts.front();
  const double h = static_cast<double>(work.model.n_embd);
  const ModelShape& m = work.model;
  const std::string layer =
      m.has_experts()
          ? format("one MoE layer's weights, gradients and Adam state take %.1f GB (16 bytes x (4h^2 + %.0f experts "
                   "of 2hF)), %.1f GB of them the experts'",
                   16 * (4 * h * h + static_cast<double>((m.moe_experts + m.shared_experts) * m.expert_numel())) / 1e9,
                   static_cast<double>(m.moe_experts + m.shared_experts),
                   16 * static_cast<double>(m.moe_experts * m.expert_numel()) / 1e9)
          : format("one layer's weights, gradients and Adam state take %.1f GB (16 bytes x 12h^2)", 16 * 12 * h * h / 1e9);
  if (!best.fits)
    return "Nothing fits in " + format("%.0f GB", cluster.gpu_memory_bytes / 1e9) + ": the least any layout needs is " +
           format("%.1f GB", gb(best.memory.total())) + " (" + layout_name(best.plan) + "); " + layer +
           ". Add GPUs, shorten the sequence or the batch, or recompute activations.\n";
  const ParallelismConfig& c = best.plan.parallelism;
  std::string out = "Recommended: " + layout_name(best.plan) +
                    format(": %.3f s a step (compute %.3f s, exposed communication %.3f s", best.step_time_s,
                           best.compute_s, best.exposed_comm_s) +
                    format(", bubble %.1f%%), %.1f GB", 100 * best.bubble, gb(best.memory.total())) +
                    format(" of %.0f GB per GPU.\n", cluster.gpu_memory_bytes / 1e9);
  auto dim = [&](const char* label, int value, MeshDim mesh_dim, auto get) {
    const auto other = best_other(r, [&](const LayoutEstimate& e) { return get(e.plan.parallelism) != value; });
    out += "  " + std::string(label) + " " + std::to_string(value) +
           (value > 1 ? " " + placement(cluster, c, mesh_dim) : std::string()) + ": " +
           against(best, other, std::string(name(mesh_dim)) + " degree", cluster) + ".\n";
  };
  dim("TP", c.tp, MeshDim::tp, [](const ParallelismConfig& p) { return p.tp; });
  dim("PP", c.pp, MeshDim::pp, [](const ParallelismConfig& p) { return p.pp; });
  dim("CP", c.cp, MeshDim::cp, [](const ParallelismConfig& p) { return p.cp; });
  if (work.model.has_experts()) dim("EP", c.ep, MeshDim::ep, [](const ParallelismConfig& p) { return p.ep; });
  const auto stage = best_other(r, [&](const LayoutEstimate& e) { return e.plan.zero() != best.plan.zero(); });
  out += "  ZeRO " + std::to_string(best.plan.zero()) + " over dp " + std::to_string(c.dp_replicate * c.dp_shard) +
         (c.ep > 1 ? " x ep " + std::to_string(c.ep) : "") + ": " + against(best, stage, "ZeRO stage", cluster) + ".\n";
  out += "  For scale: " + layer + format(" (%.0f GB per GPU).\n", cluster.gpu_memory_bytes / 1e9);
  return out;
}

}  // namespace sl::parallel::planner
