// Lesson 15 — choosing a strategy: the rules of thumb in milliseconds, on a cluster simulated on a laptop.
//
// What you will learn
//   * the decision rules of Hugging Face's multi-GPU training guide ("the guide" below) as the
//     planner's rules (parallel/planner/planner.h, build/bin/plan):
//     for each of the guide's scenarios the planner ranks every layout the cluster can run, from
//     memory, bytes and links, and the lesson checks that its winner agrees with the guide's advice:
//        the model fits on one GPU                  -> DDP (or ZeRO)
//        it does not                                -> ZeRO, PP or TP
//        its largest layer does not                 -> TP (or ZeRO-3)
//        slow links between nodes                   -> PP across them, TP inside a node
//        long sequences                             -> CP
//   * a cluster in three numbers per link: the alpha-beta model, latency + bytes / bandwidth, between
//     ranks on one node (NVLink-class) or on two (InfiniBand- or PCIe-class). The threads backend
//     charges every message its link (train --links, parallel/comm/topology.h); compute stays real.
//   * scaling a GPU cluster down to a CPU: a CPU core computes ~1000x slower than a GPU, so the links
//     are slowed by the same factor, measured here (this machine's FLOP/s against the GPU's). What
//     decides a strategy is the ratio of compute to communication, and that ratio is kept.
//   * the guide's DP against DDP, with and without NVLink (2 TITAN RTX: DP 110 s, DDP 101 s, DDP
//     without NVLink 131 s), reproduced in direction and explained in bytes:
//         naive DP sends 8Ψ per step (replicate + gather), not overlapped; DDP 2(n-1)/n·4Ψ = 4Ψ, overlapped
//   * TP inside a node against TP across two nodes, measured (the same layout, another placement)
//   * the guide's case 2 with links: PP, ZeRO-3 and TP on two nodes are close when the link between
//     them is fast; when it is slow PP wins, because it sends one activation per micro-batch where TP
//     sends 4 per layer and ZeRO-3 the whole model three times
//   * lesson 14's rules of thumb, checked again in milliseconds instead of bytes
//
// Run:    make lesson N=15   (about 20 s: 15 short runs on up to 4 thread ranks)
// Try:    build/lessons/15_choosing_a_strategy --slow-link-gbs 0.5 --svg /tmp/svg_15   (step times drawn)
//         build/lessons/15_choosing_a_strategy --gpu-tflops 30;  --break-unscaled (GPU links on a CPU)
// Prints: each section's measured step times beside the bytes that explain them, the checks, and
//         "lesson 15: OK".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/topology.h"
#include "parallel/planner/planner.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;
using namespace sl::parallel;

static bool ok = true;
static void check(bool condition, const std::string& what) {
  std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
  ok = ok && condition;
}
static void section(const char* title) { std::printf("\n--- %s\n", title); }

// ---- the model, the data and one measured run ------------------------------------------------------------
// B·T large against C, as in real LLMs (B·T in the thousands per rank, C in the thousands): TP's
// activations then outweigh DP's gradients, which is what makes placement matter.
static const nn::GPTConfig kConfig{.vocab_size = 64, .block_size = 32, .n_layer = 4, .n_head = 4, .n_embd = 64};
constexpr int64_t kBatch = 16, kT = 32;
constexpr int kSteps = 6;  // the first step warms up; the time is the fastest of the other five
constexpr uint64_t kSeed = 5;
static nn::AdamWOptions adamw() { return {.lr = 1e-3, .eps = 1e-6, .weight_decay = 0.1}; }

static nn::TokenStream tokens() {
  nn::TokenStream s;
  s.vocab_size = kConfig.vocab_size;
  for (int i = 0; i < 20000; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 13) % kConfig.vocab_size);
  return s;
}

static TrainPlan plan_of(ParallelismConfig par, DpStrategy strategy = DpStrategy::ddp, int micro = 1) {
  TrainPlan plan;
  plan.parallelism = par;
  plan.dp_strategy = strategy;
  plan.micro_batches = micro;
  return plan;
}

struct Measured {
  double predicted_ms = 0;  // the planner's step time for the same plan on the same links
  double step_ms = 0;    // rank 0's wall time for its fastest step
  double links_ms = 0;   // what the links charged rank 0 per step, summed over its groups
  double sent_kib = 0;   // bytes rank 0 sent per step, over every group
};

static Measured run_once(const TrainPlan& plan, const Topology& topology) {
  const int world = plan.parallelism.world_size();
  plan.validate(world);
  check_model_cut(kConfig, plan.parallelize_options(), plan.micro_batches);
  static const nn::TokenStream data = tokens();
  LaunchOptions options;
  options.topology = topology;
  Measured m;
  launch(world, [&](RankContext& ctx) {
    std::unique_ptr<Trainer> trainer = std::make_unique<Trainer>(
        ctx, plan, parallelize(kConfig, kSeed, ctx.world, plan.parallelize_options(adamw())));
    trainer->train_step(data, 0, kBatch, kT, adamw().lr, 0.0);  // warm-up: allocations, first touches
    auto totals = [&] {
      CommStats sum;
      for (const auto& [name, group] : trainer->ledgers()) {
        const CommStats s = group->total();
        sum.bytes_sent += s.bytes_sent;
        sum.link_s += s.link_s;
      }
      return sum;
    };
    const CommStats before = totals();
    double fastest_s = 1e30;
    for (int s = 1; s < kSteps; ++s) {
      const auto start = std::chrono::steady_clock::now();
      trainer->train_step(data, s, kBatch, kT, adamw().lr, 0.0);
      fastest_s = std::min(fastest_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (ctx.rank != 0) return;
    const CommStats after = totals();
    m.step_ms = 1e3 * fastest_s;
    m.links_ms = 1e3 * (after.link_s - before.link_s) / (kSteps - 1);
    m.sent_kib = (after.bytes_sent - before.bytes_sent) / 1024.0 / (kSteps - 1);
  }, options);
  return m;
}

// A cluster's links: ranks fill nodes of gpus_per_node in order.
static Topology links(int gpus_per_node, Link intra, Link inter = {}) {
  Topology t;
  t.gpus_per_node = gpus_per_node;
  t.intra = intra;
  t.inter = inter;
  return t;
}

// This CPU against a GPU (section 2 measures it): its FLOP/s on one core (W rank threads share its
// cores; 0 before it is measured, and then no prediction is made), and the factor the GPU's links
// are scaled by.
struct Machine {
  double flops = 0;
  double link_scale = 1;
};

static double predicted_ms(const TrainPlan& plan, const Topology& topology, double machine_flops) {
  const int world = plan.parallelism.world_size(), cores = std::max(1u, std::thread::hardware_concurrency());
  planner::Cluster c;
  c.topology = topology.enabled() ? topology : links(1, {});
  c.nodes = std::max(1, (world + c.topology.gpus_per_node - 1) / c.topology.gpus_per_node);
  c.gpu_memory_bytes = 1e12;
  c.flops = machine_flops * std::min(1.0, static_cast<double>(cores) / world);
  return 1e3 * planner::estimate_layout({kConfig, {kBatch, kT}}, c, plan).step_time_s;
}

// The faster of two runs, each timed by its fastest step: 2 cores shared by up to 4 rank threads (and
// whatever else runs) make any one step's compute noisy, and noise only ever adds time; the links'
// charges, which are sleeps, are not noisy.
static Measured run(const TrainPlan& plan, const Topology& topology, const Machine& machine) {
  Measured a = run_once(plan, topology), b = run_once(plan, topology);
  Measured& best = a.step_ms <= b.step_ms ? a : b;
  if (machine.flops > 0) best.predicted_ms = predicted_ms(plan, topology, machine.flops);
  return best;
}

// Every measured row also becomes a bar of the step-time picture, the planner's prediction its mark.
static void print_row(const char* name, const Measured& m, lesson::BarChart& chart) {
  chart.bar(name, m.step_ms, m.predicted_ms);
  std::printf("  %-36s %7.1f ms per step (planner: %6.1f)   links %6.1f ms   rank 0 sends %7.1f KiB\n", name,
              m.step_ms, m.predicted_ms, m.links_ms, m.sent_kib);
}

// ---- scaling a GPU's links to this CPU ---------------------------------------------------------------------
// The serial step's FLOPs, 6 per parameter and token (2 forward, 4 backward) plus attention's, over
// its measured time: this machine's achieved FLOP/s. A link keeps its GPU-world ratio to compute when
// scaled by (this CPU's achieved FLOP/s) / (the GPU's achieved FLOP/s), the GPU's taken as 40% of its
// peak (a typical model FLOPs utilisation in training).
// What a student may change: the GPU the links are scaled against (its f32 peak and the share of
// it a training run achieves), the slow inter-node link of section 5, and the scaling mistake.
struct Config {
  double gpu_tflops = 16.3, utilisation = 0.4;  // TITAN RTX f32 peak; a typical model FLOPs utilisation
  double slow_link_gbs = 1.25;                  // Ethernet-class, GB/s
  bool unscaled = false;  // the mistake: GPU-world links on a CPU that computes ~1000x slower
  std::string svg_dir;
};
static double cpu_flops() {
  const double params = static_cast<double>(nn::GPT(kConfig, kSeed).num_parameters());
  const double tokens_per_step = static_cast<double>(kBatch * kT);
  const double attention = 12.0 * kConfig.n_layer * kT * kConfig.n_embd;  // QK^T and AV, forward and backward
  const double flops = (6.0 * params + attention) * tokens_per_step;
  const Measured serial = run(plan_of({}), {}, Machine{});
  return flops / (serial.step_ms * 1e-3);
}

static Link scaled(double gpu_bytes_per_s, double latency_s, double scale) {
  return {gpu_bytes_per_s * scale, latency_s / scale};
}

// ---- 3. DP against DDP, with and without NVLink --------------------------------------------------------
static void dp_against_ddp(const Machine& machine, lesson::BarChart& chart) {
  section("3. the guide's benchmark: DP against DDP, with and without NVLink (2 GPUs in one box)");
  // TITAN RTX: 16.3 TFLOP/s f32. NV2 NVLink: 2 links of 25 GB/s each way. Without it
  // (NCCL_P2P_DISABLE=1) every byte goes through the host over PCIe 3.0 x16: about 10 GB/s.
  const double scale = machine.link_scale;
  Topology nvlink = links(2, scaled(50e9, 2e-6, scale));
  Topology no_nvlink = links(2, scaled(10e9, 10e-6, scale));
  std::printf("  scaled by %.2e: NVLink %.1f MB/s, PCIe through the host %.1f MB/s on this machine\n", scale,
              nvlink.intra.bytes_per_s / 1e6, no_nvlink.intra.bytes_per_s / 1e6);
  const ParallelismConfig two{.dp_replicate = 2};
  const Measured dp = run(plan_of(two, DpStrategy::naive), nvlink, machine), ddp = run(plan_of(two), nvlink, machine),
                 ddp_slow = run(plan_of(two), no_nvlink, machine);
  print_row("DP (naive), NVLink", dp, chart);
  print_row("DDP, NVLink", ddp, chart);
  print_row("DDP, no NVLink", ddp_slow, chart);
  const double psi = static_cast<double>(nn::GPT(kConfig, kSeed).num_parameters());
  std::printf(
      "  Ψ = %.0f: DP's rank 0 sends the model out and gathers the gradients, 8Ψ = %.0f KiB a step on the\n"
      "  critical path; DDP all-reduces 2(n-1)/n·4Ψ = %.0f KiB, overlapped with backward. The guide measured\n"
      "  DP 110 s, DDP 101 s, DDP without NVLink 131 s: DP is ~10%% slower than DDP, and faster than DDP\n"
      "  over a link 5x slower, because DP's extra bytes cost less than DDP's bytes on the slow link.\n",
      psi, 8 * psi / 1024, 4 * psi / 1024);
  check(ddp.step_ms < dp.step_ms, "with NVLink DDP is faster than DP (the guide: 101 s < 110 s)");
  check(dp.step_ms < ddp_slow.step_ms, "DP with NVLink is faster than DDP without (the guide: 110 s < 131 s)");
}

// ---- 4. TP inside a node, or across two ----------------------------------------------------------------------
// dp 2 x tp 2 on 2 nodes of 2. The mesh puts tp innermost: ranks {0,1} and {2,3} are tp pairs. The
// default placement (ranks fill nodes in order) keeps each pair on one node and sends DP's gradients
// between the nodes; placement=0,1,0,1 does the opposite.
static std::pair<Measured, Measured> tp_inside_or_across(const Machine& machine, lesson::BarChart& chart) {
  section("4. TP inside a node against TP across two nodes (dp 2 x tp 2, 2 nodes of 2, NVLink and InfiniBand)");
  const double scale = machine.link_scale;
  Topology inside = links(2, scaled(300e9, 1e-6, scale), scaled(25e9, 5e-6, scale));
  Topology across = inside;
  across.placement = {0, 1, 0, 1};
  const TrainPlan plan = plan_of({.dp_replicate = 2, .tp = 2});
  const Measured a = run(plan, inside, machine), b = run(plan, across, machine);
  print_row("tp pairs inside a node, dp across", a, chart);
  print_row("tp pairs across nodes, dp inside", b, chart);
  const double btc = kBatch / 2.0 * kT * kConfig.n_embd * 4;  // one rank's activations [B/dp, T, C], f32
  std::printf(
      "  TP all-reduces [B/dp, T, C] = %.0f KiB 4 times per layer (2 forward, 2 backward), on the critical path:\n"
      "  %d of them per step. DP all-reduces the gradients once, overlapped with backward.\n",
      btc / 1024, 4 * static_cast<int>(kConfig.n_layer));
  check(a.predicted_ms < b.predicted_ms, "the planner predicts it too (" + std::to_string(a.predicted_ms) + " < " +
                                             std::to_string(b.predicted_ms) + " ms)");
  check(a.step_ms < b.step_ms, "TP inside the node is faster than TP across nodes (" + std::to_string(a.step_ms) +
                                   " < " + std::to_string(b.step_ms) + " ms)");
  return {a, b};
}

// ---- 5. the guide's case 2 on two nodes ------------------------------------------------------------------------
// One GPU per node, so every byte crosses the inter-node link: PP 2 (4 micro-batches, 1F1B), ZeRO-3
// over 2, TP 2. The guide: "With very fast inter-node connectivity all three should be mostly on
// par; without, PP will be faster than TP or ZeRO."
static std::vector<double> pp_zero_tp(const Machine& machine, double slow_bytes_per_s, lesson::BarChart& chart) {  // slow link's ms
  section("5. the guide's case 2: PP, ZeRO-3 and TP over 2 nodes, on a fast and on a slow link");
  const std::vector<std::pair<const char*, TrainPlan>> layouts = {
      {"PP 2 (1F1B, 4 micro-batches)", plan_of({.pp = 2}, DpStrategy::ddp, 4)},
      {"ZeRO-3 over 2", plan_of({.dp_shard = 2}, DpStrategy::fsdp)},
      {"TP 2", plan_of({.tp = 2})}};
  std::vector<double> fast_ms, slow_ms, slow_predicted;
  char slow_label[64];
  std::snprintf(slow_label, sizeof slow_label, "Ethernet-class, %g GB/s", slow_bytes_per_s / 1e9);
  for (const auto& [label, link] : {std::pair<const char*, double>{"NVSwitch-class, 300 GB/s", 300e9}, {slow_label, slow_bytes_per_s}}) {
    Topology t = links(1, {}, scaled(link, 5e-6, machine.link_scale));
    std::printf("  between the nodes: %s (%.1f MB/s here)\n", label, t.inter.bytes_per_s / 1e6);
    for (const auto& [name, plan] : layouts) {
      const Measured m = run(plan, t, machine);
      print_row((std::string(name) + (link > 1e10 ? ", fast" : ", slow")).c_str(), m, chart);
      (link > 1e10 ? fast_ms : slow_ms).push_back(m.step_ms);
      if (link < 1e10) slow_predicted.push_back(m.predicted_ms);
    }
  }
  auto spread = [](const std::vector<double>& ms) {
    return *std::max_element(ms.begin(), ms.end()) / *std::min_element(ms.begin(), ms.end());
  };
  check(slow_ms[0] < slow_ms[1] && slow_ms[0] < slow_ms[2], "on the slow link PP is the fastest of the three");
  check(slow_predicted[0] < slow_predicted[1] && slow_predicted[0] < slow_predicted[2],
        "the planner ranks them so too (PP " + std::to_string(slow_predicted[0]) + " ms)");
  check(spread(fast_ms) < spread(slow_ms), "a fast link brings the three closer: the slowest takes " +
                                               std::to_string(spread(fast_ms)) + "x the fastest's time, against " +
                                               std::to_string(spread(slow_ms)) + "x on the slow link");
  // Why not on par: TP's messages each pay the link's latency, and this model computes little between them.
  const Topology fast = links(1, {}, scaled(300e9, 5e-6, machine.link_scale));
  const int tp_messages = 4 * static_cast<int>(kConfig.n_layer) * 2;  // 4 all-reduces per layer, 2 ring steps each
  std::printf(
      "  Not on par here, though: TP 2 sends at least %d messages a step (4 all-reduces per layer of 2 ring steps),\n"
      "  each paying the scaled latency of %.2f ms: %.1f ms before a byte moves. A real layer (C in the thousands)\n"
      "  computes for milliseconds between two messages; this one (C = %lld) for well under one. On par needs\n"
      "  compute per message >> latency, which is the guide's premise.\n",
      tp_messages, fast.inter.latency_s * 1e3, tp_messages * fast.inter.latency_s * 1e3, (long long)kConfig.n_embd);
  return slow_ms;
}

// ---- 1. the guide's guide, as the planner's ranking -------------------------------------------------------------

static planner::Cluster cluster(int nodes, double gpu_gb, double tflops, const std::string& links) {
  planner::Cluster c;
  c.nodes = nodes;
  c.topology = Topology::parse_links(links);
  c.gpu_memory_bytes = gpu_gb * 1e9;
  c.flops = tflops * 1e12;
  return c;
}

static nn::GPTConfig shape(int64_t layers, int64_t width, int64_t heads, int64_t vocab, int64_t block) {
  nn::GPTConfig c{.vocab_size = vocab, .block_size = block, .n_layer = layers, .n_head = heads, .n_embd = width};
  return c;
}

// Ranks every layout, prints the first three and the planner's reasons; returns the ranking.
static planner::Ranking rank_layouts(const char* scenario, const nn::GPTConfig& model, int64_t batch, int64_t seq,
                                  const planner::Cluster& c, bool bf16) {
  planner::Workload work{model, {batch, seq}};
  planner::SearchOptions options;
  if (bf16) options.precision = nn::MixedPrecision::parse("bf16");
  work.model.param_dtype = options.precision.param_dtype;
  planner::Ranking r = planner::search(work, c, options);
  std::printf("\n  %s\n  %s; %lld layouts considered, %lld impossible, %d fit\n", scenario, c.str().c_str(),
              (long long)r.considered, (long long)r.impossible, r.fitting());
  std::vector<planner::LayoutEstimate> top(r.layouts.begin(), r.layouts.begin() + std::min<size_t>(3, r.layouts.size()));
  std::printf("%s", planner::layout_table(top).c_str());
  std::printf("%s", planner::recommendation(r, work, c).c_str());
  return r;
}

static bool any_fitting(const planner::Ranking& r, const std::function<bool(const TrainPlan&)>& which) {
  return std::any_of(r.layouts.begin(), r.layouts.end(), [&](const planner::LayoutEstimate& e) { return e.fits && which(e.plan); });
}
static bool uncut(const TrainPlan& p) { return !p.cuts_model(); }

static void the_guide_as_rankings() {
  section("1. the guide's decision guide, as the planner's ranking");
  const std::string nvlink = "intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=8";
  // 8 GPUs of 24 GB in one box (the guide's TITAN RTX class), 16 TFLOP/s each.
  const planner::Cluster box = cluster(1, 24, 16, "intra=50GB/s,2us;inter=12.5GB/s,10us;gpus-per-node=8");
  planner::Ranking fits = rank_layouts("case 1: GPT-2 (124M) fits on one GPU", planner::preset_config("gpt2"), 64, 1024, box, false);
  const TrainPlan& w1 = fits.layouts.front().plan;
  check(fits.layouts.front().fits && uncut(w1), "case 1: the winner is data parallel (" + w1.name() + "), as the guide says: DDP or ZeRO");

  planner::Ranking big = rank_layouts("case 2: GPT-2 XL (1.56B: 16 bytes a parameter = 25 GB) does not fit on one GPU",
                                   planner::preset_config("gpt2-xl"), 64, 1024, box, false);
  const TrainPlan& w2 = big.layouts.front().plan;
  check(big.layouts.front().fits && (w2.zero() > 0 || w2.cuts_model()) &&
            !any_fitting(big, [](const TrainPlan& p) { return uncut(p) && p.zero() == 0; }),
        "case 2: plain DDP fits nowhere; the winner (" + w2.name() + ") uses ZeRO, PP or TP, as the guide says");

  // One layer of h = 20480 holds 16 x 12h² = 80.5 GB of model state: more than a GPU.
  const planner::Cluster node = cluster(1, 80, 312, nvlink);
  planner::Ranking wide = rank_layouts("case 3: the largest layer does not fit (h 20480: one layer's model state is 80.5 GB)",
                                    shape(4, 20480, 128, 51200, 2048), 8, 2048, node, true);
  const TrainPlan& w3 = wide.layouts.front().plan;
  check(wide.layouts.front().fits && !any_fitting(wide, [](const TrainPlan& p) { return p.parallelism.tp == 1 && p.zero() == 0; }),
        "case 3: without ZeRO nothing fits unless TP cuts the layer (the guide: PP alone cannot); the winner: " + w3.name());
  check(w3.parallelism.tp <= node.gpus_per_node(), "case 3: TP stays inside the node (tp " +
                                                      std::to_string(w3.parallelism.tp) + " <= 8 GPUs per node)");

  // The ZeRO paper's 7.5B over 4 nodes of 8 GPUs of 40 GB: fast and slow links between the nodes.
  std::vector<double> zero_only_penalty;
  std::vector<TrainPlan> winners;
  for (const auto& [what, inter] : {std::pair{"InfiniBand, 25 GB/s", "25GB/s,5us"}, std::pair{"Ethernet, 1.25 GB/s", "1.25GB/s,20us"}}) {
    const planner::Cluster four = cluster(4, 40, 312, "intra=300GB/s,1us;gpus-per-node=8;inter=" + std::string(inter));
    planner::Ranking r = rank_layouts((std::string("case 4: ZeRO's 7.5B on 4 nodes of 8, between them ") + what).c_str(),
                                   planner::preset_config("zero-7.5b"), 128, 1024, four, true);
    const planner::LayoutEstimate& best = r.layouts.front();
    auto zero_only = std::find_if(r.layouts.begin(), r.layouts.end(), [](const planner::LayoutEstimate& e) {
      return e.fits && !e.plan.cuts_model();
    });
    zero_only_penalty.push_back(zero_only == r.layouts.end() ? 1e9 : zero_only->step_time_s / best.step_time_s);
    if (zero_only != r.layouts.end())
      std::printf("  the best layout that does not cut the model: %s, %.3f s (%.2fx the winner's)\n",
                  zero_only->plan.name().c_str(), zero_only->step_time_s, zero_only_penalty.back());
    winners.push_back(best.plan);
    check(best.plan.parallelism.tp <= four.gpus_per_node(), std::string("case 4 (") + what + "): TP inside a node (tp " +
                                                                std::to_string(best.plan.parallelism.tp) + ")");
  }
  check(zero_only_penalty[0] < 1.5, "case 4: with fast links between the nodes, data parallelism alone (ZeRO) is close to the "
                                    "best (the guide: ZeRO, or PP + TP + DP)");
  check(zero_only_penalty[1] > 2 * zero_only_penalty[0] && winners[1].parallelism.pp > 1,
        "case 4: with slow links it is not: the winner pipelines across the nodes (pp " +
            std::to_string(winners[1].parallelism.pp) + ") with TP inside them (the guide: DP + PP + TP + ZeRO)");

  // 8B-class at 64k tokens a sequence: the activations are what does not fit.
  const planner::Cluster two = cluster(2, 80, 312, nvlink);
  planner::Ranking longseq = rank_layouts("case 5: an 8B model on sequences of 65536 tokens",
                                       shape(36, 4096, 32, 128256, 65536), 16, 65536, two, true);
  const TrainPlan& w5 = longseq.layouts.front().plan;
  check(w5.parallelism.cp > 1, "case 5: long sequences: the winner (" + w5.name() + ") cuts the sequence, CP " +
                                   std::to_string(w5.parallelism.cp));
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "15_choosing_a_strategy", "choosing a strategy, in milliseconds on simulated links");
  Config cfg;
  cfg.gpu_tflops = args.real("gpu-tflops", 16.3, "the GPU's f32 peak the links are scaled against (TFLOP/s)", 10, 25);
  cfg.utilisation = args.real("utilisation", 0.4, "the share of that peak a training run achieves", 0.3, 0.5);
  cfg.slow_link_gbs = args.real("slow-link-gbs", 1.25, "section 5's slow link between the nodes (GB/s; slower links take the run past 20 s)", 0.6, 3);
  cfg.unscaled = args.breaks("unscaled", "keep the GPU-world links on this CPU: forget to slow them by the compute ratio");
  cfg.svg_dir = args.svg();
  args.done();
  std::printf("Lesson 15: choosing a strategy, in milliseconds on simulated links\n");
  std::printf("with a %.1f TFLOP/s GPU at %.0f%%, a %.2f GB/s slow link%s\n", cfg.gpu_tflops, 100 * cfg.utilisation,
              cfg.slow_link_gbs, cfg.unscaled ? ", BROKEN: links left at GPU speed" : "");
  the_guide_as_rankings();
  section("2. this machine against a GPU: the scale for the links");
  const double flops = cpu_flops();
  // The links keep their GPU-world ratio to compute: scaled by this CPU's FLOP/s over the GPU's.
  const double right_scale = flops / (cfg.utilisation * cfg.gpu_tflops * 1e12);
  const Machine machine{flops, cfg.unscaled ? 1.0 : right_scale};
  std::printf(
      "  the serial step computes at %.2f GFLOP/s; a GPU at %.0f%% of its %.1f TFLOP/s (f32): links scale by %.2e\n"
      "  (bandwidths times it, latencies divided by it)\n",
      flops / 1e9, 100 * cfg.utilisation, cfg.gpu_tflops, right_scale);
  if (cfg.unscaled)
    std::printf("  --break-unscaled: the links run at scale 1, %.0fx too fast for this CPU's compute: every message is free\n",
                1 / right_scale);
  lesson::BarChart chart("ms per step, measured (red: the planner's prediction)", "ms");
  dp_against_ddp(machine, chart);
  const auto [inside, across] = tp_inside_or_across(machine, chart);
  const std::vector<double> slow = pp_zero_tp(machine, cfg.slow_link_gbs * 1e9, chart);
  lesson::write_picture(cfg.svg_dir, "step_times.svg", chart.svg());
  section("6. lesson 14's rules of thumb, in milliseconds instead of bytes");
  std::printf(
      "  TP inside a node:              %6.1f ms a step, against %.1f ms with the tp pairs across nodes (section 4)\n"
      "  DP replicas across nodes:      the same two runs: replicas across and TP inside is the %.1f ms one\n"
      "  PP across slow links:          PP %.1f ms, ZeRO-3 %.1f ms, TP %.1f ms over Ethernet-class links (section 5)\n"
      "  ZeRO / FSDP when memory binds: a question of bytes, not time: case 2 above (plain DDP fits nowhere)\n"
      "  CP for long sequences:         bytes again: case 5 above (the activations of 65536 tokens)\n",
      inside.step_ms, across.step_ms, inside.step_ms, slow[0], slow[1], slow[2]);
  std::printf("\nlesson 15: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
