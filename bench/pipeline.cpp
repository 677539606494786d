// pipeline — what the schedules cost: the bubble against its formula with a fixed cost per layer,
// and GPT config B (n_embd 256, 6 layers, B8 T128) trained over 2 pipeline stages against serial.
//
//   build/bench/pipeline [--steps 5] [--warmup 2] [--sleep-ms 2] [--skip-throughput 1] [--skip-bubble 1]
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
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

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
};

// Steps of the pipeline alone (forward_backward + the tied sum + AdamW), timed on rank 0 between barriers.
static StepTimes pipeline_steps(const nn::GPTConfig& config, const nn::TokenStream& data, int p, int m, int v,
                                ScheduleKind kind, int64_t rows, double sleep, int steps, int warmup) {
  std::vector<double> times, bubbles;
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
      }
    }
  });
  return {median(times), median(bubbles)};
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

int main(int argc, char** argv) {
  int steps = 5, warmup = 2;
  double sleep_ms = 2.0;
  bool throughput = true, bubble = true;
  set_num_threads(1);  // one GEMM thread per rank, and for the serial baseline: one "device" each
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--warmup") warmup = std::stoi(value);
    else if (flag == "--sleep-ms") sleep_ms = std::stod(value);
    else if (flag == "--skip-throughput") throughput = value == "0";
    else if (flag == "--skip-bubble") bubble = value == "0";
    else {
      std::fprintf(stderr, "usage: pipeline [--steps N] [--warmup N] [--sleep-ms X] [--skip-throughput 0|1] [--skip-bubble 0|1]\n");
      return 2;
    }
  }
  const nn::TokenStream tiny = random_tokens(20000, kTiny.vocab_size);
  struct Case {
    ScheduleKind kind;
    int p, m, v;
  };
  const std::vector<Case> cases = {
      {ScheduleKind::naive, 4, 4, 1},        {ScheduleKind::gpipe, 2, 4, 1},       {ScheduleKind::gpipe, 4, 4, 1},
      {ScheduleKind::gpipe, 4, 8, 1},        {ScheduleKind::one_f_one_b, 2, 8, 1}, {ScheduleKind::one_f_one_b, 4, 4, 1},
      {ScheduleKind::one_f_one_b, 4, 8, 1},  {ScheduleKind::one_f_one_b, 4, 16, 1}, {ScheduleKind::interleaved, 2, 8, 2},
      {ScheduleKind::interleaved, 4, 8, 2},  {ScheduleKind::interleaved, 4, 16, 2}, {ScheduleKind::zero_bubble, 2, 8, 1},
      {ScheduleKind::zero_bubble, 4, 4, 1},  {ScheduleKind::zero_bubble, 4, 8, 1},   {ScheduleKind::zero_bubble, 4, 16, 1}};
  for (const Case& c : bubble ? cases : std::vector<Case>{}) {
    // 16 rows per step whatever m is (below 16: 16 rows still), so each case does the same work.
    const int64_t rows = std::max<int64_t>(16, c.m);
    const StepTimes t = pipeline_steps(kTiny, tiny, c.p, c.m, c.v, c.kind, rows, sleep_ms * 1e-3, steps, warmup);
    const double formula = bubble_formula(c.kind, c.p, c.m, c.v);
    std::printf("{\"bench\": \"pipeline\", \"part\": \"bubble\", \"schedule\": \"%s\", \"p\": %d, \"m\": %d, \"v\": %d, "
                "\"median_ms\": %.2f, \"bubble\": %.4f, \"formula\": %.4f, \"rel_error\": %.3f}\n",
                schedule_name(c.kind), c.p, c.m, c.v, t.median_ms, t.bubble, formula, (t.bubble - formula) / formula);
    std::fflush(stdout);
  }
  if (throughput) {
    const nn::TokenStream data = random_tokens(200000, kConfigB.vocab_size);
    const int m = 8;
    const int64_t rows = 8;
    const double serial = serial_steps(kConfigB, data, m, rows, steps, warmup);
    const StepTimes pp = pipeline_steps(kConfigB, data, 2, m, 1, ScheduleKind::one_f_one_b, rows, 0, steps, warmup);
    std::printf("{\"bench\": \"pipeline\", \"part\": \"throughput\", \"config\": \"B\", \"pp\": 2, \"m\": %d, "
                "\"schedule\": \"1f1b\", \"median_ms\": %.1f, \"serial_median_ms\": %.1f, \"speedup\": %.2f, "
                "\"ideal\": %.2f, \"bubble\": %.3f}\n",
                m, pp.median_ms, serial, serial / pp.median_ms, 2.0 * m / (m + 1), pp.bubble);
  }
  return 0;
}
