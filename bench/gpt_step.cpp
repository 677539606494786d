// gpt_step — the time of one training step of the tiny GPT (zero_grad, forward, loss, backward,
// AdamW step), f32, 1 thread by default: the median over 20 steps after 5 warm-up steps.
//
//   build/bench/gpt_step [--config A|B] [--threads N] [--steps 20] [--warmup 5] [--profile]
//
// Prints one JSON line per config, e.g. {"bench": "gpt_step", "config": "A", "threads": 1, "median_ms": ...}.
// Compare in one run with ../shared/bench/gpt_torch.py (same shapes; see README: Results).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/profiler.h"
#include "nn/gpt.h"
#include "nn/optim.h"

using namespace sl;

struct BenchConfig {
  const char* name;
  nn::GPTConfig model;
  int64_t batch;
};

static double run(const BenchConfig& bench, int steps, int warmup, bool profile) {
  nn::GPT model(bench.model, /*seed=*/0);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
  Generator data_gen(1);
  const int64_t B = bench.batch, T = bench.model.block_size, V = bench.model.vocab_size;
  std::vector<double> times_ms;
  static const std::string optimizer_name = "AdamW.step";
  for (int step = 0; step < warmup + steps; ++step) {
    Tensor tokens = cast(mul(rand({B, T + 1}, {}, &data_gen), static_cast<double>(V)), DType::i64);
    Tensor inputs = tokens.narrow(1, 0, T), targets = tokens.narrow(1, 1, T);
    if (profile && step == warmup) Profiler::enable();
    auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    Tensor loss = model.loss(inputs, targets);
    loss.backward();
    {
      ProfileScope scope_optimizer(optimizer_name, false);
      optimizer.step();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (step >= warmup) times_ms.push_back(ms);
  }
  if (profile) {
    std::printf("profile of config %s over %d steps (inclusive times):\n%s", bench.name, steps,
                Profiler::report().c_str());
    Profiler::disable();
    Profiler::reset();
  }
  std::sort(times_ms.begin(), times_ms.end());
  return times_ms[times_ms.size() / 2];
}

int main(int argc, char** argv) {
  std::string only;
  int threads = 1, steps = 20, warmup = 5;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpt_step: %s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--config")
      only = value();
    else if (flag == "--threads")
      threads = std::stoi(value());
    else if (flag == "--steps")
      steps = std::stoi(value());
    else if (flag == "--warmup")
      warmup = std::stoi(value());
    else if (flag == "--profile")
      profile = true;
    else {
      std::fprintf(stderr, "usage: gpt_step [--config A|B] [--threads N] [--steps N] [--warmup N] [--profile]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  std::vector<BenchConfig> configs = {
      {"A", nn::GPTConfig{256, 64, 4, 4, 128, 0.0}, 16},
      {"B", nn::GPTConfig{256, 128, 6, 8, 256, 0.0}, 8},
  };
  for (const BenchConfig& config : configs) {
    if (!only.empty() && only != config.name) continue;
    double median = run(config, steps, warmup, profile);
    std::printf("{\"bench\": \"gpt_step\", \"config\": \"%s\", \"threads\": %d, \"median_ms\": %.3f}\n", config.name,
                threads, median);
    std::fflush(stdout);
  }
  return 0;
}
