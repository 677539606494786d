// planner — the planner's predicted step time against the step time measured on simulated links, for
// layouts of 1 to 8 thread ranks, and how many of them it predicts within 20% (on a quiet machine).
//
//   build/bench/planner [--steps 3] [--repeats 2] [--links SPEC] [--layouts ddp2,tp2,...] [--quick]
//
// The cluster is this machine seen through simulated links (parallel/comm/topology.h): 2 nodes of 4
// ranks (default 'intra=400MB/s,100us;inter=100MB/s,400us;gpus-per-node=4'), slow enough that a
// step's communication weighs like compute's. The planner's FLOP/s is measured, not assumed. Each
// rank is a thread with one GEMM thread, and W ranks share this machine's cores, so a "GPU" of a
// world of W computes at what W rank threads get: per W in {1, 2, 4, 8}, DDP over W ranks without
// links (its communication is a few memcpys) gives it, a rank's FLOPs (planner::stage_flops) over
// the measured step. One figure per world size, the same for every layout of that size.
//
// A message also costs the rank threads themselves: the receiver wakes from its sleep, takes the
// envelope, copies, releases the sender (tens of microseconds on 2 busy cores, against a GPU's
// microseconds of launch). The bench measures it, a ring step of 8 floats between 2 ranks under 1 us
// links, and adds it to both links' latency in the planner's cluster.
//
// Measured: rank 0's mean wall time per step over `steps` steps after one warm-up step, the fastest
// of `repeats` runs (neighbours' load only ever adds time). Predicted: planner::estimate_layout's
// step_time_s for the same plan, model and batch.
//
// One JSON line per layout: {"bench": "planner", "layout", "world", "measured_ms", "predicted_ms",
// "ratio" (predicted / measured), "compute_ms", "comm_ms", "exposed_comm_ms", "bubble", "links_ms"
// (what the links charged rank 0 per step)}, then a summary line {"within_20_percent", "layouts"}.
//
// --quick: layouts ddp2, pp2_1f1b_m4 and tp2, 1 step, 1 run each (calibration included, a couple of
// seconds; flags given beside it still apply). In every mode the output is checked
// (bench/bench_check.h), exiting 1 on a failure: one line per layout asked (a name that is not a
// layout fails), times and rates finite and positive, the prediction's parts consistent (exposed
// communication within the communication, the step no shorter than its compute), link charges
// positive (every layout communicates), and the predicted bubble equal to its formula derived here,
// bubble time over ideal time: (p-1)/m for GPipe and 1F1B, (p-1)/(v·m) interleaved, (p-1)/(3m)
// zero-bubble, 0 without a pipeline. The ratio is only required to be finite: how close it comes
// depends on the machine's load.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_check.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/planner/planner.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

using namespace sl;
using namespace sl::parallel;

static const nn::GPTConfig kConfig{.vocab_size = 64, .block_size = 32, .n_layer = 4, .n_head = 4, .n_embd = 64};
constexpr int64_t kBatch = 16, kT = 32;
constexpr uint64_t kSeed = 3;
static nn::AdamWOptions adamw() { return {.lr = 1e-3, .eps = 1e-6, .weight_decay = 0.1}; }

struct Layout {
  std::string name;
  TrainPlan plan;
};

static TrainPlan make_plan(ParallelismConfig par, DpStrategy dp = DpStrategy::ddp, int micro = 1) {
  TrainPlan plan;
  plan.parallelism = par;
  plan.dp_strategy = dp;
  plan.micro_batches = micro;
  return plan;
}

static std::vector<Layout> all_layouts() {
  using D = DpStrategy;
  std::vector<Layout> l = {
      {"ddp2", make_plan({.dp_replicate = 2})},
      {"ddp4", make_plan({.dp_replicate = 4})},
      {"ddp8", make_plan({.dp_replicate = 8})},
      {"naive2", make_plan({.dp_replicate = 2}, D::naive)},
      {"zero1_dp2", make_plan({.dp_shard = 2}, D::zero1)},
      {"zero1_dp4", make_plan({.dp_shard = 4}, D::zero1)},
      {"zero2_dp2", make_plan({.dp_shard = 2}, D::zero2)},
      {"zero2_dp8", make_plan({.dp_shard = 8}, D::zero2)},
      {"fsdp2", make_plan({.dp_shard = 2}, D::fsdp)},
      {"fsdp4", make_plan({.dp_shard = 4}, D::fsdp)},
      {"hsdp2x2", make_plan({.dp_replicate = 2, .dp_shard = 2}, D::fsdp)},
      {"hsdp2x4", make_plan({.dp_replicate = 2, .dp_shard = 4}, D::fsdp)},
      {"pp2_1f1b_m4", make_plan({.pp = 2}, D::ddp, 4)},
      {"pp4_1f1b_m4", make_plan({.pp = 4}, D::ddp, 4)},
      {"pp2_gpipe_m4", make_plan({.pp = 2}, D::ddp, 4)},
      {"pp2_interleaved_m4", make_plan({.pp = 2}, D::ddp, 4)},
      {"pp2_zero_bubble_m4", make_plan({.pp = 2}, D::ddp, 4)},
      {"tp2", make_plan({.tp = 2})},
      {"tp4", make_plan({.tp = 4})},
      {"tp2_sp", make_plan({.tp = 2})},
      {"cp2", make_plan({.cp = 2})},
      {"cp4", make_plan({.cp = 4})},
      {"dp2_tp2", make_plan({.dp_replicate = 2, .tp = 2})},
      {"pp2_tp2_m2", make_plan({.pp = 2, .tp = 2}, D::ddp, 2)},
      {"dp2_pp2_tp2_m2", make_plan({.dp_replicate = 2, .pp = 2, .tp = 2}, D::ddp, 2)},
      {"fsdp2_tp2", make_plan({.dp_shard = 2, .tp = 2}, D::fsdp)},
      {"hsdp2x2_tp2", make_plan({.dp_replicate = 2, .dp_shard = 2, .tp = 2}, D::fsdp)},
      {"dp2_cp2", make_plan({.dp_replicate = 2, .cp = 2})},
      {"fsdp2_cp2_tp2", make_plan({.dp_shard = 2, .cp = 2, .tp = 2}, D::fsdp)},
  };
  for (Layout& x : l) {
    if (x.name.find("gpipe") != std::string::npos) x.plan.schedule = ScheduleKind::gpipe;
    if (x.name.find("zero_bubble") != std::string::npos) x.plan.schedule = ScheduleKind::zero_bubble;
    if (x.name.find("interleaved") != std::string::npos)
      x.plan.schedule = ScheduleKind::interleaved, x.plan.virtual_stages = 2;
    if (x.name.find("_sp") != std::string::npos) x.plan.sequence_parallel = true;
  }
  return l;
}

static nn::TokenStream tokens() {
  nn::TokenStream s;
  s.vocab_size = kConfig.vocab_size;
  for (int i = 0; i < 20000; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 13) % kConfig.vocab_size);
  return s;
}

struct Measured {
  double step_ms = 0, links_ms = 0;
};

static Measured measure_once(const TrainPlan& plan, const Topology& topology, int steps) {
  static const nn::TokenStream data = tokens();
  const int world = plan.parallelism.world_size();
  LaunchOptions options;
  options.topology = topology;
  Measured m;
  launch(world, [&](RankContext& ctx) {
    std::unique_ptr<Trainer> trainer = std::make_unique<Trainer>(
        ctx, plan, parallelize(kConfig, kSeed, ctx.world, plan.parallelize_options(adamw())));
    trainer->train_step(data, 0, kBatch, kT, adamw().lr, 1.0);
    double links0 = 0;
    for (const auto& [name, group] : trainer->ledgers()) links0 += group->link_seconds();
    const auto start = std::chrono::steady_clock::now();
    for (int s = 1; s <= steps; ++s) trainer->train_step(data, s, kBatch, kT, adamw().lr, 1.0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ctx.rank != 0) return;
    double links = 0;
    for (const auto& [name, group] : trainer->ledgers()) links += group->link_seconds();
    m = {1e3 * seconds / steps, 1e3 * (links - links0) / steps};
  }, options);
  return m;
}

static double message_overhead_s() {
  LaunchOptions options;
  options.topology = Topology::parse_links("intra=1000GB/s,1us;gpus-per-node=2");
  constexpr int kWarmup = 50, kCalls = 400;
  double per_step = 0;
  launch(2, [&](RankContext& ctx) {
    Tensor x = full({8}, 1.0);
    for (int i = 0; i < kWarmup; ++i) ctx.world->all_reduce(x);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) ctx.world->all_reduce(x);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ctx.rank == 0) per_step = s / (2.0 * kCalls);  // an all-reduce over 2 ranks: 2 ring steps
  }, options);
  return std::max(0.0, per_step - 1e-6);
}

static Measured measure(const TrainPlan& plan, const Topology& topology, int steps, int repeats) {
  Measured best{1e300, 0};
  for (int r = 0; r < repeats; ++r) {
    Measured m = measure_once(plan, topology, steps);
    if (m.step_ms < best.step_ms) best = m;
  }
  return best;
}

// The predicted bubble over ideal for the plan's schedule, derived here (the planner may simulate it).
static double expected_bubble(const TrainPlan& plan) {
  const double p = plan.parallelism.pp, m = plan.micro_batches, v = plan.virtual_stages;
  if (plan.parallelism.pp == 1) return 0;
  if (plan.schedule == ScheduleKind::interleaved) return (p - 1) / (v * m);
  if (plan.schedule == ScheduleKind::zero_bubble) return (p - 1) / (3 * m);
  return (p - 1) / m;  // GPipe, 1F1B
}

// How many layouts a run asks for: every one, or the distinct names of ",a,b,".
static int64_t layouts_asked(const std::string& only) {
  if (only.empty()) return static_cast<int64_t>(all_layouts().size());
  std::set<std::string> names;
  std::stringstream list(only);
  for (std::string name; std::getline(list, name, ',');)
    if (!name.empty()) names.insert(name);
  return static_cast<int64_t>(names.size());
}

static void check_layout(bench::Checks& checks, const Layout& layout, const planner::LayoutEstimate& predicted,
                         const Measured& measured) {
  const std::string where = bench::Checks::label(layout.name, ": ");
  const double predicted_ms = 1e3 * predicted.step_time_s;
  checks.positive(measured.step_ms, where, "measured_ms");
  checks.positive(predicted_ms, where, "predicted_ms");
  checks.finite(predicted_ms / measured.step_ms, where, "ratio");
  checks.positive(predicted.compute_s, where, "compute_ms");
  checks.within(predicted.comm_s, 0, 1e9, where, "comm_ms");
  // 1e-9: the same seconds summed in another order
  checks.within(predicted.exposed_comm_s, 0, predicted.comm_s * (1 + 1e-9), where, "exposed_comm_ms (within comm_ms)");
  checks.that(predicted.step_time_s >= predicted.compute_s * (1 - 1e-9), where, "predicted_ms ", predicted_ms,
              " below its compute_ms ", 1e3 * predicted.compute_s);
  checks.positive(measured.links_ms, where, "links_ms (every layout sends messages)");
  checks.equal(predicted.bubble, expected_bubble(layout.plan), 1e-9, where, "bubble (over ideal)");
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int steps = 3, repeats = 2;
  std::string links = "intra=400MB/s,100us;inter=100MB/s,400us;gpus-per-node=4", layouts;
  if (quick) steps = 1, repeats = 1, layouts = "ddp2,pp2_1f1b_m4,tp2";  // the flags below still override them
  cli::Parser flags("planner", "planner: the planner's predicted step times against measured ones, per layout");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per measurement");
  flags.integer("--repeats", repeats, 1, 1 << 20, "measurements per layout (the fastest counts)");
  flags.text("--links", links, "SPEC", "the simulated links");
  flags.text("--layouts", layouts, "a,b,...", "which layouts, comma-separated (default: all)");
  bench::parse_flags(flags, argc, argv);
  const std::string only = layouts.empty() ? "" : "," + layouts + ",";
  set_num_threads(1);  // one GEMM thread per rank: the ranks are the parallelism
  const Topology topology = Topology::parse_links(links);
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  planner::Workload work{kConfig, {kBatch, kT}};
  const double overhead = message_overhead_s();
  Topology priced = topology;  // what the planner is told: the links plus the threads' own cost
  priced.intra.latency_s += overhead;
  priced.inter.latency_s += overhead;
  std::printf("{\"bench\": \"planner\", \"calibration\": {\"message_overhead_us\": %.2f}}\n", overhead * 1e6);
  bench::Checks checks("planner");
  checks.within(overhead, 0, 1, "calibration: message_overhead (s)");
  // A rank's FLOP/s when W ranks share the machine: DDP over W without links.
  std::map<int, double> rank_flops;
  for (int w : {1, 2, 4, 8}) {
    const TrainPlan ddp = make_plan({.dp_replicate = w});
    const double ms = measure(ddp, {}, steps, repeats).step_ms;
    rank_flops[w] = planner::stage_flops(work, ddp, 0).total / (ms * 1e-3);
    checks.positive(ms, "calibration: world ", w, ": ddp_ms_without_links");
    checks.positive(rank_flops[w], "calibration: world ", w, ": gflops_per_rank");
    std::printf("{\"bench\": \"planner\", \"calibration\": {\"world\": %d, \"ddp_ms_without_links\": %.3f, "
                "\"gflops_per_rank\": %.3f, \"cores\": %d, \"links\": \"%s\"}}\n",
                w, ms, rank_flops[w] / 1e9, cores, links.c_str());
  }
  int within = 0, count = 0;
  for (const Layout& layout : all_layouts()) {
    if (!only.empty() && only.find("," + layout.name + ",") == std::string::npos) continue;
    const int world = layout.plan.parallelism.world_size();
    planner::Cluster cluster;
    cluster.topology = priced;
    cluster.nodes = std::max(1, (world + topology.gpus_per_node - 1) / topology.gpus_per_node);
    cluster.gpu_memory_bytes = 1e12;
    cluster.flops = rank_flops.at(world);
    planner::check_layout(work, layout.plan, world);
    const planner::LayoutEstimate predicted = planner::estimate_layout(work, cluster, layout.plan);
    const Measured measured = measure(layout.plan, topology, steps, repeats);
    const double predicted_ms = 1e3 * predicted.step_time_s, ratio = predicted_ms / measured.step_ms;
    check_layout(checks, layout, predicted, measured);
    ++count;
    if (std::abs(ratio - 1) <= 0.2) ++within;
    std::printf("{\"bench\": \"planner\", \"layout\": \"%s\", \"world\": %d, \"measured_ms\": %.3f, \"predicted_ms\": %.3f, "
                "\"ratio\": %.3f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, \"exposed_comm_ms\": %.3f, \"bubble\": %.3f, "
                "\"links_ms\": %.3f}\n",
                layout.name.c_str(), world, measured.step_ms, predicted_ms, ratio, 1e3 * predicted.compute_s,
                1e3 * predicted.comm_s, 1e3 * predicted.exposed_comm_s, predicted.bubble, measured.links_ms);
    std::fflush(stdout);
  }
  std::printf("{\"bench\": \"planner\", \"within_20_percent\": %d, \"layouts\": %d}\n", within, count);
  checks.count(count, layouts_asked(only), "layouts run (one per layout asked; see all_layouts for the names)");
  return checks.finish();
}
