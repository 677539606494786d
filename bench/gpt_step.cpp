// gpt_step — the time of one training step of the tiny GPT (zero_grad, forward, loss, backward,
// AdamW step), f32, 1 thread by default: the median and the minimum over 20 steps after 5 warm-up
// steps (on a shared, noisy machine the minimum is the least disturbed step).
//
//   build/bench/gpt_step [--config A|B] [--seq-len T] [--threads N] [--steps 20] [--warmup 5] [--profile]
//
// --seq-len T runs the config's model at sequence length T (block_size T) with batch B·T0/T (at
// least 1), the same tokens per step as the config: only attention's share grows, as T. PyTorch's
// side: bench/gpt_torch_seq.py --config B --seq-len T.
// A bad flag or value prints the usage, naming the flag, and exits 2.
// Prints one JSON line per config, e.g. {"bench": "gpt_step", "config": "A", "T": 64, "batch": 16, "threads": 1,
// "median_ms": ..., "min_ms": ...}. Compare in one run with ../shared/bench/gpt_torch.py (same shapes; see README: Results).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

struct StepTimes {
  double median_ms, min_ms;
};

static StepTimes run(const BenchConfig& bench, int steps, int warmup, bool profile) {
  nn::GPT model(bench.model, /*seed=*/0);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
  Generator data_gen(1);
  const int64_t B = bench.batch, T = bench.model.block_size, V = bench.model.vocab_size;
  std::vector<double> times_ms;
  static const std::string optimizer_name = "AdamW.step";
  for (int step = 0; step < warmup + steps; ++step) {
    Tensor inputs, targets;
    {
      ProfilerPause untimed;  // the batch is drawn outside the timed step, and outside the profile
      Tensor tokens = cast(mul(rand({B, T + 1}, {}, &data_gen), static_cast<double>(V)), DType::i64);
      inputs = tokens.narrow(1, 0, T);
      targets = tokens.narrow(1, 1, T);
    }
    if (profile && step == warmup) Profiler::enable();
    auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    Tensor loss = model.loss(inputs, targets);
    loss.backward();
    {
      ProfileScope scope_optimizer(optimizer_name, ProfilePhase::optimizer);
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
  return {times_ms[times_ms.size() / 2], times_ms.front()};
}

static const char* const kUsage =
    "usage: gpt_step [--config A|B] [--seq-len T >= 1] [--threads N >= 1] [--steps N >= 1] [--warmup N >= 0] "
    "[--profile]\n";

// A bad flag or value: the message names it, then the usage; exit code 2.
[[noreturn]] static void usage_error(const std::string& message) {
  std::fprintf(stderr, "gpt_step: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// The value of `flag` as an integer in [minimum, maximum], or a usage error.
static int parse_int(const std::string& flag, const std::string& value, int minimum, int maximum) {
  size_t used = 0;
  long long parsed = 0;
  try {
    parsed = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || parsed < minimum || parsed > maximum)
    usage_error(flag + ": expected an integer in " + std::to_string(minimum) + ".." + std::to_string(maximum) +
                ", got '" + value + "'");
  return static_cast<int>(parsed);
}

int main(int argc, char** argv) {
  std::vector<BenchConfig> configs = {
      {"A", nn::GPTConfig{256, 64, 4, 4, 128, 0.0}, 16},
      {"B", nn::GPTConfig{256, 128, 6, 8, 256, 0.0}, 8},
  };
  std::string only;
  int threads = 1, steps = 20, warmup = 5, seq_len = 0;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--config") {
      only = value();
      bool known = false;
      for (const BenchConfig& config : configs) known = known || only == config.name;
      if (!known) usage_error("--config: expected A or B, got '" + only + "'");
    } else if (flag == "--seq-len") {
      seq_len = parse_int(flag, value(), 1, 65536);
    } else if (flag == "--threads") {
      threads = parse_int(flag, value(), 1, 1024);
    } else if (flag == "--steps") {
      steps = parse_int(flag, value(), 1, 1000000);  // the median needs at least one timed step
    } else if (flag == "--warmup") {
      warmup = parse_int(flag, value(), 0, 1000000);
    } else if (flag == "--profile") {
      profile = true;
    } else if (flag == "--help" || flag == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  set_num_threads(threads);
  for (BenchConfig config : configs) {
    if (!only.empty() && only != config.name) continue;
    if (seq_len > 0) {  // the same tokens per step at another length
      config.batch = std::max<int64_t>(1, config.batch * config.model.block_size / seq_len);
      config.model.block_size = seq_len;
    }
    const StepTimes times = run(config, steps, warmup, profile);
    std::printf(
        "{\"bench\": \"gpt_step\", \"config\": \"%s\", \"T\": %lld, \"batch\": %lld, \"threads\": %d, "
        "\"median_ms\": %.3f, \"min_ms\": %.3f}\n",
        config.name, static_cast<long long>(config.model.block_size), static_cast<long long>(config.batch), threads,
        times.median_ms, times.min_ms);
    std::fflush(stdout);
  }
  return 0;
}
