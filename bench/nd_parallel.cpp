// nd_parallel — step time and bytes per rank of N-D layouts of 4 to 16 ranks (dp, fsdp, pp, tp, cp and their
// products, through parallel::Trainer) against one serial rank: GPT n_embd 128, 4 layers, 4 heads,
// vocab 256, B 16 rows of T 128, f32, AdamW, clip 1.0; median step time.
//
//   build/bench/nd_parallel [--steps 5] [--warmup 2] [--layouts dp8,dp2xpp2xtp2,...] [--quick]
//
// A layout is its degrees joined by 'x' (dpN: DDP replicas, fsdpN: FSDP shards, repN: HSDP's
// replicas of those shards, ppN, tpN, cpN), then optional suffixes: "_zero1" / "_zero2" (ZeRO-1/2
// over dp instead of DDP), "_sp" (sequence parallel under tp), "_mK" (K micro-batches; default 2·pp
// with a pipeline, else 1). The pipelines run 1F1B, CP runs zigzag ring attention. FSDP over a cut
// shards over dp_shard x cp (fully_shard, parallel/zero/zero_strategies.h).
//
// "dp_formula_kib" (pp 1 only; null otherwise): what the data-parallel groups must send per rank and
// step for a rank's part of Ψ_tp = Ψ_sliced/tp + Ψ_replicated elements (Megatron's split, counted
// from the model's shapes here), ring collectives, f32:
//   DDP over D replicas       2(D-1)/D · 4Ψ_tp                 (the all-reduce)
//   ZeRO-1/2 over N           2(N-1)/N · 4Ψ_tp                 (reduce-scatter + all-gather)
//   FSDP over N = S·cp        3(N-1)/N · 4Ψ_tp                 (all-gather twice, reduce-scatter)
//   HSDP, + over R replicas   2(R-1)/R · 4Ψ_tp/N               (each gradient shard all-reduced)
// "dp_over_formula" is their ratio (padding and the clip's few bytes put it a little above 1).
//
// Every rank is a thread with one GEMM thread (like bench/data_parallel), so world 8 on a 2-core
// machine shares 2 cores among 8 "devices": the times say what the layouts cost in work and
// synchronisation on one machine, not what 8 GPUs would do. Bytes are what each rank's groups
// counted (the threads backend's ring steps): exact, whatever the machine.
//
// On a shared machine the wall times swing with the neighbours' load; "cpu_ms" (the process's CPU
// time per step, every rank's thread together: the work, spread over however many cores) swings
// much less. The threads backend waits on condition variables, so waiting costs no CPU time.
//
// One JSON line per layout: {"bench": "nd_parallel", "layout", "plan", "world", "micro_batches",
// "median_ms", "serial_median_ms", "speedup" (serial / median), "cpu_ms", "serial_cpu_ms", "sent_kib": {"dp", "pp",
// "tp", "cp"} (per rank and step, mean over ranks), "sent_kib_total", "dp_formula_kib", "dp_over_formula",
// "max_rank_sent_kib", "bubble_formula"}.
//
// --quick: layouts rep2xfsdp2 (HSDP: both terms of its formula) and dp2xpp2 (a pipeline under DDP),
// 1 step without warm-up (a few seconds; flags given beside it still apply). In every mode the
// output is checked (bench/bench_check.h), exiting 1 on a failure: one line per layout asked, times
// finite and positive, bytes finite and >= 0, and against formulas derived here:
//   dp_over_formula in [1, 1.001] (the padding and the clip's few bytes only ever add);
//   the pipeline's bytes per rank and step, mean over ranks: every stage boundary carries a
//   micro-batch's activations forward and their gradient back, the rank's B/(dp·shards) rows of
//   T/cp tokens and C channels (under SP a tp rank's T/(cp·tp)), so 2(pp-1)/pp of those f32 bytes
//   (0 without a pipeline), and up to 8(pp-1) more: when the stages alone cut the model, the clip
//   all-gathers each stage's part of the norm (one f64) in the pp group (with tp, in a pp x tp group
//   of its own, not counted here);
//   bubble_formula = (pp-1)/(m+pp-1), 1F1B's (0 without a pipeline).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "tensor/cpu/gemm.h"
#include "tensor/error.h"

using namespace sl;
using Clock = std::chrono::steady_clock;

static const nn::GPTConfig kConfig{.vocab_size = 256, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128};
static const int64_t kBatch = 16;
static const uint64_t kSeed = 0;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

static nn::TokenStream random_tokens(int64_t n) {
  nn::TokenStream stream;
  uint64_t x = 88172645463325252ull;  // xorshift: fixed data, no dependence on the RNG under test
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    stream.tokens.push_back(static_cast<int32_t>(x % 256));
  }
  return stream;
}

// "dp2xpp2xtp2_zero1_m4" -> a TrainPlan; throws sl::Error naming the part it cannot read.
static parallel::TrainPlan parse_layout(const std::string& name) {
  parallel::TrainPlan plan;
  auto& par = plan.parallelism;
  std::stringstream parts(name);
  std::string dims, suffix;
  std::getline(parts, dims, '_');
  int micro = 0, dp = 1, replicas = 1;
  bool fsdp = false;
  while (std::getline(parts, suffix, '_')) {
    if (suffix == "zero1")
      plan.dp_strategy = parallel::DpStrategy::zero1;
    else if (suffix == "zero2")
      plan.dp_strategy = parallel::DpStrategy::zero2;
    else if (suffix == "sp")
      plan.sequence_parallel = true;
    else if (suffix.size() > 1 && suffix[0] == 'm')
      micro = std::stoi(suffix.substr(1));
    else
      SL_CHECK(false, "nd_parallel: unknown suffix '", suffix, "' in layout ", name, " (zero1, zero2, sp, mK)");
  }
  std::stringstream list(dims);
  for (std::string dim; std::getline(list, dim, 'x');) {
    size_t digits = dim.find_first_of("0123456789");
    SL_CHECK(digits != std::string::npos && digits > 0, "nd_parallel: cannot read '", dim, "' in layout ", name);
    const std::string kind = dim.substr(0, digits);
    const int n = std::stoi(dim.substr(digits));
    if (kind == "dp")
      dp = n;
    else if (kind == "fsdp")
      dp = n, fsdp = true;
    else if (kind == "rep")
      replicas = n, fsdp = true;
    else if (kind == "pp")
      par.pp = n;
    else if (kind == "tp")
      par.tp = n;
    else if (kind == "cp")
      par.cp = n;
    else
      SL_CHECK(false, "nd_parallel: unknown dimension '", kind, "' in layout ", name, " (dp, fsdp, rep, pp, tp, cp)");
  }
  if (fsdp) plan.dp_strategy = parallel::DpStrategy::fsdp;
  if (plan.zero() > 0)
    par.dp_shard = dp, par.dp_replicate = replicas;
  else
    par.dp_replicate = dp;
  plan.micro_batches = micro > 0 ? micro : (par.pp > 1 ? 2 * par.pp : 1);
  return plan;
}

// The serial step, as bench/data_parallel times it.
static double cpu_ms_since(std::clock_t start) { return 1000.0 * (std::clock() - start) / CLOCKS_PER_SEC; }

static double serial_median(const nn::TokenStream& data, int steps, int warmup, double* cpu_ms) {
  nn::GPT model(kConfig, kSeed);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
  std::vector<double> times;
  std::clock_t cpu_start = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) cpu_start = std::clock();
    auto start = Clock::now();
    nn::Batch batch = data.get_batch(step, kBatch, kConfig.block_size);
    optimizer.zero_grad();
    model.loss(batch.inputs, batch.targets).backward();
    nn::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  *cpu_ms = cpu_ms_since(cpu_start) / steps;
  return median(times);
}

// Ψ_tp: the elements of one tp rank's slice of the model (Megatron's split: c_attn, c_fc and the
// c_proj weights and wte, its vocabulary padded to a multiple of tp, are cut; the rest replicated).
static double psi_per_tp_rank(int tp) {
  nn::GPT model(kConfig, kSeed);
  double psi = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool bias = name.find(".bias") != std::string::npos;
    const bool cut = name == "wte.weight" || name.find("c_attn") != std::string::npos ||
                     name.find("c_fc") != std::string::npos || (name.find("c_proj") != std::string::npos && !bias);
    const double numel = name == "wte.weight"
                             ? static_cast<double>((kConfig.vocab_size + tp - 1) / tp * tp * kConfig.n_embd)
                             : static_cast<double>(p.numel());
    psi += cut ? numel / tp : numel;
  }
  return psi;
}

// The data-parallel groups' bytes per rank and step from the formulas in the header (KiB); < 0: none (pp > 1).
static double dp_formula_kib(const parallel::TrainPlan& plan) {
  const auto& par = plan.parallelism;
  if (par.pp > 1) return -1;
  const double bytes = 4 * psi_per_tp_rank(par.tp);
  const int zero = plan.zero();
  double sent = 0;
  if (zero == 0) {
    const double d = par.dp_replicate;
    sent = 2 * (d - 1) / d * bytes;
  } else if (zero < 3) {
    const double n = par.dp_shard;
    sent = 2 * (n - 1) / n * bytes;
  } else {
    const double n = static_cast<double>(par.dp_shard) * par.cp, r = par.dp_replicate;
    sent = 3 * (n - 1) / n * bytes + 2 * (r - 1) / r * bytes / n;
  }
  return sent / 1024.0;
}

struct Measured {
  double median_ms = 0, cpu_ms = 0;
  std::map<std::string, double> sent_kib;  // per group: per rank and step, mean over ranks
  double max_rank_kib = 0;                 // the busiest rank's bytes per step, all groups
};

static Measured run_layout(const nn::TokenStream& data, const parallel::TrainPlan& plan, int steps, int warmup) {
  const int world = plan.parallelism.world_size();
  plan.validate(world);
  parallel::check_model_cut(kConfig, plan.parallelize_options(), plan.micro_batches);
  std::vector<double> times;
  double cpu_ms = 0;
  std::vector<std::map<std::string, int64_t>> sent(world);
  parallel::launch(world, [&](parallel::RankContext& ctx) {
    std::unique_ptr<parallel::Trainer> trainer = std::make_unique<parallel::Trainer>(
        ctx, plan, parallel::parallelize(kConfig, kSeed, ctx.world, plan.parallelize_options(nn::AdamWOptions{})));
    auto totals = [&] {  // bytes sent so far per group, DDP's "dp" and ZeRO's "dp_shard" both as "dp"
      std::map<std::string, int64_t> t;
      for (const auto& [name, group] : trainer->ledgers())
        if (name != "loss") t[name.rfind("dp", 0) == 0 ? "dp" : name] += group->total().bytes_sent;
      return t;
    };
    std::map<std::string, int64_t> before;
    std::clock_t cpu_start = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) before = totals(), ctx.world->barrier(), cpu_start = std::clock();
      ctx.world->barrier();  // every rank starts the step together: the time is the slowest rank's
      auto start = Clock::now();
      trainer->train_step(data, step, kBatch, kConfig.block_size, 1e-3, 1.0);
      ctx.world->barrier();
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (ctx.rank == 0 && step >= warmup) times.push_back(ms);
    }
    if (ctx.rank == 0) cpu_ms = cpu_ms_since(cpu_start) / steps;  // every rank has passed the last barrier
    for (const auto& [name, bytes] : totals()) sent[ctx.rank][name] = bytes - before[name];
  });
  Measured m;
  m.median_ms = median(times);
  m.cpu_ms = cpu_ms;
  for (int r = 0; r < world; ++r) {
    double rank_kib = 0;
    for (const auto& [name, bytes] : sent[r]) {
      m.sent_kib[name] += bytes / 1024.0 / steps / world;
      rank_kib += bytes / 1024.0 / steps;
    }
    m.max_rank_kib = std::max(m.max_rank_kib, rank_kib);
  }
  return m;
}

// The header's pipeline bytes (KiB per rank and step, mean over ranks): 2(pp-1)/pp activations.
static double pp_formula_kib(const parallel::TrainPlan& plan) {
  const auto& par = plan.parallelism;
  if (par.pp == 1) return 0;
  const double rows = static_cast<double>(kBatch) / (par.dp_replicate * par.dp_shard);
  const double tokens = static_cast<double>(kConfig.block_size) / par.cp / (plan.sequence_parallel ? par.tp : 1);
  const double activations = 4.0 * rows * tokens * static_cast<double>(kConfig.n_embd);
  return 2.0 * (par.pp - 1) / par.pp * activations / 1024.0;
}

static void check_layout(bench::Checks& checks, const std::string& name, const parallel::TrainPlan& plan,
                         const Measured& m, double serial, double bubble, double formula) {
  const auto& par = plan.parallelism;
  const std::string where = bench::Checks::label(name, ": ");
  checks.positive(m.median_ms, where, "median_ms");
  checks.finite(serial / m.median_ms, where, "speedup");
  checks.positive(m.cpu_ms, where, "cpu_ms");
  for (const auto& [group, kib] : m.sent_kib) checks.within(kib, 0, 1e12, where, "sent_kib ", group);
  checks.within(m.max_rank_kib, 0, 1e12, where, "max_rank_sent_kib");
  if (formula > 0) {
    const double dp = m.sent_kib.count("dp") ? m.sent_kib.at("dp") : 0.0;
    checks.within(dp / formula, 1, 1.001, where, "dp_over_formula");
  }
  const double pp = m.sent_kib.count("pp") ? m.sent_kib.at("pp") : 0.0;
  const double activations = pp_formula_kib(plan), clip = 8.0 * (par.pp - 1) / 1024.0;
  checks.within(pp, activations - 1e-9, activations + clip + 1e-9, where,
                "sent_kib pp (2(pp-1)/pp activations, and up to the clip's 8(pp-1) bytes)");
  const double p = par.pp, micro = plan.micro_batches;
  checks.equal(bubble, par.pp > 1 ? (p - 1) / (micro + p - 1) : 0.0, 1e-12, where, "bubble_formula (1F1B)");
}

// The layout's JSON line, and its checks.
static void report_layout(bench::Checks& checks, const std::string& name, const parallel::TrainPlan& plan,
                          const Measured& m, double serial, double serial_cpu) {
  const auto& par = plan.parallelism;
  const double bubble = par.pp > 1 ? parallel::bubble_formula(plan.schedule, par.pp, plan.micro_batches, 1) : 0.0;
  auto kib = [&](const char* g) { return m.sent_kib.count(g) ? m.sent_kib.at(g) : 0.0; };
  const double formula = dp_formula_kib(plan);
  char formula_json[64] = "null, \"dp_over_formula\": null";
  if (formula > 0)
    std::snprintf(formula_json, sizeof formula_json, "%.1f, \"dp_over_formula\": %.3f", formula, kib("dp") / formula);
  std::printf(
      "{\"bench\": \"nd_parallel\", \"layout\": \"%s\", \"plan\": \"%s\", \"world\": %d, \"micro_batches\": %d, "
      "\"median_ms\": %.2f, \"serial_median_ms\": %.2f, \"speedup\": %.3f, \"cpu_ms\": %.2f, \"serial_cpu_ms\": "
      "%.2f, "
      "\"sent_kib\": {\"dp\": %.1f, \"pp\": %.1f, \"tp\": %.1f, \"cp\": %.1f}, \"sent_kib_total\": %.1f, "
      "\"dp_formula_kib\": %s, \"max_rank_sent_kib\": %.1f, \"bubble_formula\": %.3f}\n",
      name.c_str(), plan.name().c_str(), par.world_size(), plan.micro_batches, m.median_ms, serial,
      serial / m.median_ms, m.cpu_ms, serial_cpu, kib("dp"), kib("pp"), kib("tp"), kib("cp"),
      kib("dp") + kib("pp") + kib("tp") + kib("cp"), formula_json, m.max_rank_kib, bubble);
  std::fflush(stdout);
  check_layout(checks, name, plan, m, serial, bubble, formula);
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int steps = 5, warmup = 2;
  std::string layouts =
      "dp8,fsdp8,dp2xpp4,dp4xtp2,dp2xpp2xtp2,dp2xpp2xtp2_zero1,dp2xtp2xcp2,pp2xtp2xcp2,pp2xtp2xcp2_sp,"
      "dp2xtp2,fsdp2xtp2,fsdp4xtp2,rep2xfsdp2xtp2,fsdp2xcp2,fsdp4xcp2,dp2xtp2_zero2,rep2xfsdp2xcp2xtp2";
  if (quick) steps = 1, warmup = 0, layouts = "rep2xfsdp2,dp2xpp2";  // the flags below still override them
  cli::Parser flags("nd_parallel", "nd_parallel: a GPT step over N-D layouts (dp, FSDP, pp, tp, cp), beside serial");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per layout");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed steps before them");
  flags.text("--layouts", layouts, "a,b,...", "which layouts, comma-separated");
  bench::parse_flags(flags, argc, argv);
  if (parallel::under_mpirun()) {
    std::fprintf(stderr, "nd_parallel: runs its own thread ranks (worlds 4 to 16); run it without mpirun\n");
    return 2;
  }
  set_num_threads(1);
  const nn::TokenStream data = random_tokens(1 << 18);
  double serial_cpu = 0;
  const double serial = serial_median(data, steps, warmup, &serial_cpu);
  std::printf(
      "{\"bench\": \"nd_parallel\", \"layout\": \"serial\", \"world\": 1, \"median_ms\": %.2f, \"cpu_ms\": %.2f}\n",
      serial, serial_cpu);
  std::fflush(stdout);
  bench::Checks checks("nd_parallel");
  checks.positive(serial, "serial: median_ms");
  checks.positive(serial_cpu, "serial: cpu_ms");
  int64_t rows = 0, asked = 0;
  std::stringstream list(layouts);
  for (std::string name; std::getline(list, name, ',');) {
    ++asked;
    parallel::TrainPlan plan;
    Measured m;
    try {  // run_layout checks the plan (and the Trainer the batch) before any rank communicates
      plan = parse_layout(name);
      m = run_layout(data, plan, steps, warmup);
    } catch (const Error& e) {  // a layout this model or the Trainer cannot run: say why, go on
      std::fprintf(stderr, "nd_parallel: %s: %s\n", name.c_str(), e.what());
      continue;
    }
    report_layout(checks, name, plan, m, serial, serial_cpu);
    ++rows;
  }
  checks.count(rows, asked, "JSON lines (one per layout asked; a layout that cannot run says why above)");
  return checks.finish();
}
