// context_parallel — one attention layer (CausalSelfAttention: c_attn, the attention core, c_proj)
// forward and backward on a long sequence: serial against context parallelism over cp ranks, ring
// (contiguous and zigzag), all-gather, Ulysses (zigzag and contiguous; when NH divides by cp) and the
// hybrid U 2 x R cp/2 (cp >= 4), B 1, C 256, NH 4 (HS 64), f32, median over steps.
//
//   build/bench/context_parallel [--cp 2] [--steps 5] [--warmup 1] [--T 1024,2048,4096] [--quick]
//
// Serial: one rank, one GEMM thread (one "device"); and the same with 2 GEMM threads (the serial
// layer given both cores). Each cp rank is a thread with one GEMM thread. One JSON line per case:
//   {"bench": "context_parallel", "T": 2048, "cp": 2, "variant": "ring", "balance": "zigzag", "ulysses": 1,
//    "median_ms": ..., "serial_ms": ..., "serial_2threads_ms": ..., "speedup": serial/median,
//    "serial_cpu_ms": ..., "compute_ms": [per rank], "balance_max_min": max/min of per-rank compute,
//    "ideal_speedup": serial_cpu_ms / max(compute_ms), "sent_kib": ...}
// "ulysses": the Ulysses degree U (1: ring or all-gather, cp: Ulysses, 2: the hybrid); "sent_kib": the
// bytes the busiest rank sent per step (forward + backward), over every group the variant talks in
// (the ledgers: ring 2·(3cp-2)·B·T·C/cp·4 bytes, Ulysses 8·B·T·C·(cp-1)/cp²·4; see lesson 13, section 5).
// A rank's compute time is its thread's CPU time in the step (waits sleep, so they do not count;
// neither does time another process takes from the core): with the contiguous split rank 0 skips
// its K/V block from rank 1 and waits. "ideal_speedup" = the serial run's CPU time / the busiest
// rank's: the speedup with one free core per rank, for machines (like the 2-core box these figures
// come from) shared with other jobs, where wall-clock "speedup" swings with the neighbours' load.
//
// --quick: T 256, 1 step after 1 warm-up per case (about a second; flags given beside it still
// apply). In every mode the output is checked (bench/bench_check.h), exiting 1 on a failure: times
// finite and positive, one compute time per rank, ratios finite, one line per T and case, and the
// busiest rank's bytes per step equal to the variant's formula (B·T·C f32 numbers, S = 4·B·T·C):
//   ring        2(3cp-2)/cp · S     K and V round the ring cp-1 steps forward, again in the backward,
//                                   and dK, dV cp steps home
//   all-gather  4(cp-1)/cp · S      K and V all-gathered forward, dK and dV reduce-scattered
//   Ulysses     8(cp-1)/cp² · S     Q, K, V to heads and the output back, forward and backward, each
//                                   all-to-all sending (cp-1)/cp of a rank's T/cp rows
//   hybrid      8(U-1)/(cp·U) · S + 2(3R-2)/cp · S    Ulysses over U, then the ring over R = cp/U
//                                   on C/U channels
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using Clock = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// CPU time of the calling thread: a rank's own compute, whatever else shares the cores.
static double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

static nn::GPTConfig layer_config(int64_t T) { return {.vocab_size = 256, .block_size = T, .n_layer = 1, .n_head = 4, .n_embd = 256}; }

// One attention layer built as the model builds it (the same Philox draw on every rank).
static std::shared_ptr<nn::CausalSelfAttention> make_layer(int64_t T) {
  Generator g(1234);
  return std::make_shared<nn::CausalSelfAttention>(layer_config(T), nn::InitOptions{0.02, &g, DType::f32});
}

struct SerialResult {
  double median_ms, cpu_ms;  // wall and this thread's CPU time, medians
};

static SerialResult serial_ms(int64_t T, int threads, int steps, int warmup) {
  set_num_threads(threads);
  auto layer = make_layer(T);
  Generator g(7);
  Tensor x = randn({1, T, 256}, DType::f32, &g).set_requires_grad(), dy = randn({1, T, 256}, DType::f32, &g);
  std::vector<double> times, cpu;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    (*layer)(x).backward(dy);
    if (s >= warmup) times.push_back(seconds_since(start) * 1e3), cpu.push_back((thread_cpu_seconds() - cpu_start) * 1e3);
  }
  set_num_threads(1);
  return {median(times), median(cpu)};
}

struct CpResult {
  double median_ms;
  std::vector<double> compute_ms;  // per rank, median
  double sent_bytes = 0;           // per step, the busiest rank
};

// U: the Ulysses degree (1 for ring and all-gather, cp for Ulysses, U < cp for the hybrid).
static CpResult cp_ms(int64_t T, int cp, CpVariant variant, CpBalance balance, int U, int steps, int warmup) {
  std::vector<std::vector<double>> step_ms(cp), compute_ms(cp);
  std::vector<double> sent_bytes(cp);
  Generator g(7);
  Tensor x = randn({1, T, 256}, DType::f32, &g), dy = randn({1, T, 256}, DType::f32, &g);
  launch(cp, [&](RankContext& ctx) {
    set_num_threads(1);
    SequenceShard shard{cp, ctx.rank, balance, U};
    const CpGroups groups = make_cp_groups(ctx.world, variant, U);
    auto layer = make_layer(T);
    layer->core = context_parallel_core(shard, groups, variant);
    Tensor xl = shard.take(x).to(ctx.device).set_requires_grad(), dyl = shard.take(dy).to(ctx.device);
    auto bytes_sent = [&] {  // each group once (Ulysses talks in the cp group itself)
      int64_t sum = 0;
      for (const ProcessGroupPtr& group : std::set<ProcessGroupPtr>{groups.cp, groups.ulysses, groups.ring})
        if (group) sum += group->ledger().total().bytes_sent;
      return sum;
    };
    int64_t sent_before = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) sent_before = bytes_sent();
      ctx.world->barrier();
      const auto start = Clock::now();
      const double cpu_start = thread_cpu_seconds();
      (*layer)(xl).backward(dyl);
      const double total = seconds_since(start), cpu = thread_cpu_seconds() - cpu_start;
      if (s >= warmup) {
        step_ms[ctx.rank].push_back(total * 1e3);
        compute_ms[ctx.rank].push_back(cpu * 1e3);
      }
    }
    sent_bytes[ctx.rank] = static_cast<double>(bytes_sent() - sent_before) / steps;
  });
  CpResult result{0, {}};
  std::vector<double> slowest;  // per step, the last rank to finish
  for (int s = 0; s < steps; ++s) {
    double m = 0;
    for (int r = 0; r < cp; ++r) m = std::max(m, step_ms[r][s]);
    slowest.push_back(m);
  }
  result.median_ms = median(slowest);
  for (int r = 0; r < cp; ++r) result.compute_ms.push_back(median(compute_ms[r]));
  result.sent_bytes = *std::max_element(sent_bytes.begin(), sent_bytes.end());
  return result;
}

struct Case {
  CpVariant variant;
  CpBalance balance;
  int U;
};

// The busiest rank's bytes per step, from the header's ledgers: B·T·C numbers of 4 bytes each.
static double sent_formula(const Case& c, int64_t T, int cp) {
  const nn::GPTConfig config = layer_config(T);
  const double S = 4.0 * 1 * static_cast<double>(T) * static_cast<double>(config.n_embd);  // B 1
  const double n = cp, U = c.U, R = n / U;
  switch (c.variant) {
    case CpVariant::ring:
      return 2 * (3 * n - 2) / n * S;
    case CpVariant::allgather:
      return 4 * (n - 1) / n * S;
    case CpVariant::ulysses:
      return 8 * (n - 1) / (n * n) * S;
    default:  // hybrid: Ulysses over U, the ring over R
      return 8 * (U - 1) / (n * U) * S + 2 * (3 * R - 2) / n * S;
  }
}

// The case's JSON line, and its checks.
static void report_case(bench::Checks& checks, const Case& c, int64_t T, int cp, const CpResult& r,
                        const SerialResult& one, double serial2) {
  const std::string where = bench::Checks::label("T ", T, ", cp ", cp, ", ", cp_variant_name(c.variant), " ",
                                                 cp_balance_name(c.balance), " (U ", c.U, "): ");
  checks.positive(r.median_ms, where, "median_ms");
  checks.positive(one.median_ms, where, "serial_ms");
  checks.positive(serial2, where, "serial_2threads_ms");
  checks.positive(one.cpu_ms, where, "serial_cpu_ms");
  checks.count(static_cast<int64_t>(r.compute_ms.size()), cp, where, "compute_ms entries (one per rank)");
  for (double ms : r.compute_ms) checks.positive(ms, where, "a rank's compute_ms");
  const auto [lo, hi] = std::minmax_element(r.compute_ms.begin(), r.compute_ms.end());
  checks.finite(one.median_ms / r.median_ms, where, "speedup");
  checks.finite(*hi / *lo, where, "balance_max_min");
  checks.finite(one.cpu_ms / *hi, where, "ideal_speedup");
  checks.equal(r.sent_bytes, sent_formula(c, T, cp), 0, where, "bytes the busiest rank sent per step");
  std::string per_rank;
  for (double ms : r.compute_ms) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "%s%.2f", per_rank.empty() ? "" : ", ", ms);
    per_rank += cell;
  }
  std::printf(
      "{\"bench\": \"context_parallel\", \"T\": %lld, \"cp\": %d, \"variant\": \"%s\", \"balance\": \"%s\", "
      "\"ulysses\": %d, \"median_ms\": %.2f, \"serial_ms\": %.2f, \"serial_2threads_ms\": %.2f, "
      "\"speedup\": %.3f, \"serial_cpu_ms\": %.2f, \"compute_ms\": [%s], \"balance_max_min\": %.3f, "
      "\"ideal_speedup\": %.3f, \"sent_kib\": %.1f}\n",
      static_cast<long long>(T), cp, cp_variant_name(c.variant), cp_balance_name(c.balance), c.U, r.median_ms,
      one.median_ms, serial2, one.median_ms / r.median_ms, one.cpu_ms, per_rank.c_str(), *hi / *lo, one.cpu_ms / *hi,
      r.sent_bytes / 1024.0);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int cp = 2, steps = 5, warmup = 1;
  std::vector<int64_t> lengths = {1024, 2048, 4096};
  if (quick) steps = 1, lengths = {256};  // defaults: the flags below still override them
  cli::Parser flags("context_parallel", "context_parallel: one attention layer's step over cp ranks, per variant");
  flags.integer("--cp", cp, 2, 1024, "context-parallel ranks");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per case");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed steps before them");
  flags.integers("--T", lengths, 1, 1 << 20, "sequence lengths");
  bench::parse_flags(flags, argc, argv);
  bench::Checks checks("context_parallel");
  int64_t rows = 0, asked = 0;
  for (int64_t T : lengths) {
    const SerialResult one = serial_ms(T, 1, steps, warmup);
    const double serial2 = serial_ms(T, 2, steps, warmup).median_ms;
    std::vector<Case> cases = {{CpVariant::ring, CpBalance::zigzag, 1}, {CpVariant::ring, CpBalance::none, 1},
                               {CpVariant::allgather, CpBalance::zigzag, 1}};
    const int64_t n_head = layer_config(T).n_head;
    if (n_head % cp == 0)  // Ulysses needs whole heads per rank
      cases.insert(cases.end(), {{CpVariant::ulysses, CpBalance::zigzag, cp}, {CpVariant::ulysses, CpBalance::none, cp}});
    else
      std::fprintf(stderr, "context_parallel: no ulysses rows at cp %d: n_head %lld does not divide by it\n", cp,
                   static_cast<long long>(n_head));
    if (cp >= 4 && cp % 2 == 0) cases.push_back({CpVariant::hybrid, CpBalance::zigzag, 2});
    asked += static_cast<int64_t>(cases.size());
    for (Case c : cases) {
      report_case(checks, c, T, cp, cp_ms(T, cp, c.variant, c.balance, c.U, steps, warmup), one, serial2);
      ++rows;
    }
  }
  checks.count(rows, asked, "JSON lines (one per T and case)");
  return checks.finish();
}
