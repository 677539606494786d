// pipeline — what the schedules cost: the bubble against its formula with a fixed cost per layer,
// and GPT config B (n_embd 256, 6 layers, B8 T128) trained over 2 pipeline stages against serial.
//
//   build/bench/pipeline [--steps 5] [--warmup 2] [--sleep-ms 2] [--skip-throughput 1] [--skip-bubble 1] [--quick]
//
// Part 1 (synthetic): the engine sleeps sleep-ms per layer per micro-batch row in each forward (twice
// in each backward; zero-bubble: once in B, once in W) on top of a tiny model's compute, so the
// schedule's shape, not the cores the ranks share, sets the time. One JSON line per (schedule, p, m, v):
//   {"bench": "pipeline", "part": "bubble", "schedule": "1f1b", "p": 4, "m": 8, "v": 1,
//    "median_ms": ..., "bubble": measured, "formula": (p-1)/(m+p-1), (p-1)/(v·m+p-1) or, zero-bubble,
//    (p-1)/(3m+p-1), "rel_error": ...}
// Part 2 (real compute): config B, 8 rows per step cut into 8 micro-batches over pp 2 (1F1B),
// one GEMM thread per rank, against the serial step with the same micro-batches on one thread:
//   {"bench": "pipeline", "part": "throughput", "pp": 2, "m": 8, "median_ms": ..., "serial_median_ms": ...,
//    "speedup": ..., "ideal": 2m/(m+1)}
//
// --quick: 1F1B, interleaved (v 2) and zero-bubble at p 2, m 4 with 1 ms sleeps, and part 2 on the
// tiny model ("config": "tiny"), 1 step after 1 warm-up each (about 2 s; flags given beside it still
// apply). In every mode the output is checked (bench/bench_check.h), exiting 1 on a failure: times
// finite and positive; the formula, derived here, equal to the library's bubble_formula; every rank's
// timeline holding v·m forwards, v·m backwards (and v·m W's for zero-bubble); the measured bubble
// within formula - 0.03 .. formula + 0.05 + 0.4·formula + 0.5 ms / pass, where a pass is one
// forward's sleep (sleep-ms x layers per chunk x rows per micro-batch). The formula is a floor: the
// tiny model's compute and each exchange's wake-up (up to a fraction of a millisecond on a loaded
// machine) only add idle time, the more the shorter the passes; a schedule that ran the wrong order,
// naive's one micro-batch at a time for one, lands far outside (--sleep-ms 0: no upper bound, the
// machine sets the bubble). Part 2's bubble in [0, 1), its speedup finite.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "tensor/cpu/gemm.h"

using namespace sl;
using namespace sl::parallel;
using Clock = std::chrono::steady_clock;

static const nn::GPTConfig kTiny{32, 8, 8, 2, 16, 0.0};
static const nn::GPTConfig kConfigB{256, 128, 6, 8, 256, 0.0};

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

static nn::TokenStream random_tokens(int64_t n, int64_t vocab) {
  nn::TokenStream stream;
  stream.vocab_size = vocab;
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    stream.tokens.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(vocab)));
  }
  return stream;
}

struct StepTimes {
  double median_ms = 0, bubble = 0;
  // The last step's timeline: per rank, how many forwards, backwards and zero-bubble W's it ran.
  std::vector<std::array<int, 3>> events;
};

// Each rank's events of the timeline by kind: forward, backward, weight (W); messages are not counted.
static std::vector<std::array<int, 3>> count_events(const Timeline& t) {
  std::vector<std::array<int, 3>> counts;
  for (const auto& rank : t.ranks) {
    std::array<int, 3> c{};
    for (const TimelineEvent& e : rank) {
      if (e.kind == TimelineEvent::Kind::forward) ++c[0];
      if (e.kind == TimelineEvent::Kind::backward) ++c[1];
      if (e.kind == TimelineEvent::Kind::weight) ++c[2];
    }
    counts.push_back(c);
  }
  return counts;
}

// Steps of the pipeline alone (forward_backward + the tied sum + AdamW), timed on rank 0 between barriers.
static StepTimes pipeline_steps(const nn::GPTConfig& config, const nn::TokenStream& data, int p, int m, int v,
                                ScheduleKind kind, int64_t rows, double sleep, int steps, int warmup) {
  std::vector<double> times, bubbles;
  std::vector<std::array<int, 3>> events;
  launch(p, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.pp = p});
    PipelineOptions options;
    options.schedule = kind;
    options.virtual_stages = v;
    options.engine.sleep_per_layer_row_seconds = sleep;
    PipelineRunner runner(config, 0, mesh, options);
    nn::AdamW adamw(runner.module().parameters(), nn::AdamWOptions{});
    for (int step = 0; step < warmup + steps; ++step) {
      auto micros = data.micro_batches(step, rows, config.block_size, m);
      double count = 0;
      for (const auto& mb : micros) count += static_cast<double>(mb.counted);
      ctx.world->barrier();
      const auto start = Clock::now();
      adamw.zero_grad();
      runner.forward_backward(micros, count, 1, {});
      runner.finish_gradients();
      adamw.step();
      ctx.world->barrier();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      Timeline t = runner.gather_timeline();
      if (ctx.rank == 0 && step >= warmup) {
        times.push_back(ms);
        bubbles.push_back(t.bubble());
        events = count_events(t);
      }
    }
  });
  return {median(times), median(bubbles), events};
}

static double serial_steps(const nn::GPTConfig& config, const nn::TokenStream& data, int m, int64_t rows, int steps,
                           int warmup) {
  nn::GPT model(config, 0);
  nn::AdamW adamw(model.parameters(), nn::AdamWOptions{});
  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    auto micros = data.micro_batches(step, rows, config.block_size, m);
    double count = 0;
    for (const auto& mb : micros) count += static_cast<double>(mb.counted);
    const auto start = Clock::now();
    adamw.zero_grad();
    for (const auto& mb : micros) {
      const double w = static_cast<double>(mb.counted) / count;
      Tensor loss = model.loss(mb.batch.inputs, mb.batch.targets);
      (w == 1.0 ? loss : mul(loss, w)).backward();
    }
    adamw.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median(times);
}

struct Case {
  ScheduleKind kind;
  int p, m, v;
};

// The bubble each schedule leaves with equal forward, backward (and W) costs, derived here so that
// the check compares the library's bubble_formula with an independent copy: GPipe and 1F1B idle p-1
// slots of m+p-1; interleaving v chunks per rank shrinks a slot v times, (p-1)/(v·m+p-1); zero-bubble
// (ZB-H1) idles p-1 of 3m+p-1 passes of F, B and W; naive runs one micro-batch at a time, so each
// rank works 1 slot of p.
static double expected_bubble(const Case& c) {
  const double p = c.p, m = c.m, v = c.v;
  switch (c.kind) {
    case ScheduleKind::naive:
      return (p - 1) / p;
    case ScheduleKind::interleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::zero_bubble:
      return (p - 1) / (3 * m + p - 1);
    default:
      return (p - 1) / (m + p - 1);  // gpipe, 1f1b
  }
}

static void check_bubble(bench::Checks& checks, const Case& c, const StepTimes& t, double formula, double pass_ms) {
  const std::string where = bench::Checks::label(schedule_name(c.kind), " p ", c.p, " m ", c.m, " v ", c.v, ": ");
  const double expected = expected_bubble(c);
  checks.positive(t.median_ms, where, "median_ms");
  checks.equal(formula, expected, 1e-12, where, "bubble_formula against the bench's own derivation");
  checks.within(t.bubble, expected - 0.03, expected + 0.05 + 0.4 * expected + 0.5 / pass_ms, where,
                "measured bubble (passes of ", pass_ms, " ms)");
  checks.count(static_cast<int64_t>(t.events.size()), c.p, where, "ranks in the timeline");
  const int per_rank = c.v * c.m, weights = c.kind == ScheduleKind::zero_bubble ? per_rank : 0;
  for (size_t r = 0; r < t.events.size(); ++r) {
    checks.count(t.events[r][0], per_rank, where, "rank ", r, " forwards (v·m)");
    checks.count(t.events[r][1], per_rank, where, "rank ", r, " backwards (v·m)");
    checks.count(t.events[r][2], weights, where, "rank ", r, " W passes (zero-bubble: v·m)");
  }
}

// Part 1: one line per case.
static void bubble_part(bench::Checks& checks, const std::vector<Case>& cases, double sleep_ms, int steps, int warmup) {
  const nn::TokenStream tiny = random_tokens(20000, kTiny.vocab_size);
  for (const Case& c : cases) {
    // 16 rows per step whatever m is (below 16: 16 rows still), so each case does the same work.
    const int64_t rows = std::max<int64_t>(16, c.m);
    const StepTimes t = pipeline_steps(kTiny, tiny, c.p, c.m, c.v, c.kind, rows, sleep_ms * 1e-3, steps, warmup);
    const double formula = bubble_formula(c.kind, c.p, c.m, c.v);
    const double layers_per_chunk = static_cast<double>(kTiny.n_layer) / (c.p * c.v);
    check_bubble(checks, c, t, formula, sleep_ms * layers_per_chunk * static_cast<double>(rows) / c.m);
    std::printf(
        "{\"bench\": \"pipeline\", \"part\": \"bubble\", \"schedule\": \"%s\", \"p\": %d, \"m\": %d, \"v\": %d, "
        "\"median_ms\": %.2f, \"bubble\": %.4f, \"formula\": %.4f, \"rel_error\": %.3f}\n",
        schedule_name(c.kind), c.p, c.m, c.v, t.median_ms, t.bubble, formula, (t.bubble - formula) / formula);
    std::fflush(stdout);
  }
}

// Part 2: the model over pp 2 against serial, one line.
static void throughput_part(bench::Checks& checks, const char* name, const nn::GPTConfig& config, int steps,
                            int warmup) {
  const nn::TokenStream data = random_tokens(200000, config.vocab_size);
  const int m = 8;
  const int64_t rows = 8;
  const double serial = serial_steps(config, data, m, rows, steps, warmup);
  const StepTimes pp = pipeline_steps(config, data, 2, m, 1, ScheduleKind::one_f_one_b, rows, 0, steps, warmup);
  checks.positive(pp.median_ms, "throughput: median_ms");
  checks.positive(serial, "throughput: serial_median_ms");
  checks.finite(serial / pp.median_ms, "throughput: speedup");
  checks.within(pp.bubble, 0, 0.999999, "throughput: bubble");
  std::printf(
      "{\"bench\": \"pipeline\", \"part\": \"throughput\", \"config\": \"%s\", \"pp\": 2, \"m\": %d, "
      "\"schedule\": \"1f1b\", \"median_ms\": %.1f, \"serial_median_ms\": %.1f, \"speedup\": %.2f, "
      "\"ideal\": %.2f, \"bubble\": %.3f}\n",
      name, m, pp.median_ms, serial, serial / pp.median_ms, 2.0 * m / (m + 1), pp.bubble);
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int steps = 5, warmup = 2;
  double sleep_ms = 2.0;
  if (quick) steps = 1, warmup = 1, sleep_ms = 1.0;  // defaults: the flags below still override them
  int64_t skip_throughput = 0, skip_bubble = 0;
  set_num_threads(1);  // one GEMM thread per rank, and for the serial baseline: one "device" each
  cli::Parser flags("pipeline", "pipeline: each schedule's bubble on synthetic layers, and a GPT's throughput");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per case");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed steps before them");
  flags.real("--sleep-ms", sleep_ms, cli::number_where([](double x) { return x > 0 && x <= 1000; }, "0 < ms <= 1000"),
             "0 < X <= 1000", "synthetic cost per layer and row, in ms");
  flags.integer("--skip-throughput", skip_throughput, 0, 1, "1: leave out the GPT throughput part");
  flags.integer("--skip-bubble", skip_bubble, 0, 1, "1: leave out the bubble part");
  bench::parse_flags(flags, argc, argv);
  const bool throughput = skip_throughput == 0, bubble = skip_bubble == 0;
  const std::vector<Case> cases = {
      {ScheduleKind::naive, 4, 4, 1},        {ScheduleKind::gpipe, 2, 4, 1},       {ScheduleKind::gpipe, 4, 4, 1},
      {ScheduleKind::gpipe, 4, 8, 1},        {ScheduleKind::one_f_one_b, 2, 8, 1}, {ScheduleKind::one_f_one_b, 4, 4, 1},
      {ScheduleKind::one_f_one_b, 4, 8, 1},  {ScheduleKind::one_f_one_b, 4, 16, 1}, {ScheduleKind::interleaved, 2, 8, 2},
      {ScheduleKind::interleaved, 4, 8, 2},  {ScheduleKind::interleaved, 4, 16, 2}, {ScheduleKind::zero_bubble, 2, 8, 1},
      {ScheduleKind::zero_bubble, 4, 4, 1},  {ScheduleKind::zero_bubble, 4, 8, 1},   {ScheduleKind::zero_bubble, 4, 16, 1}};
  // The smallest pipeline each kind of schedule needs: 2 stages, 4 micro-batches.
  const std::vector<Case> quick_cases = {
      {ScheduleKind::one_f_one_b, 2, 4, 1}, {ScheduleKind::interleaved, 2, 4, 2}, {ScheduleKind::zero_bubble, 2, 4, 1}};
  bench::Checks checks("pipeline");
  if (bubble) bubble_part(checks, quick ? quick_cases : cases, sleep_ms, steps, warmup);
  // --quick: the tiny model, whose steps take milliseconds where config B's take a second
  if (throughput) throughput_part(checks, quick ? "tiny" : "B", quick ? kTiny : kConfigB, steps, warmup);
  return checks.finish();
}
