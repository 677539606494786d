// data_parallel — how much faster a training step gets with data-parallel ranks, and what each ZeRO
// stage costs against DDP: GPT config B (n_embd 256, 6 layers, B8 T128), f32, median step time.
//
//   build/bench/data_parallel [--world 2] [--steps 10] [--warmup 3] [--modes ddp,zero1,zero2,zero3]
//
// The serial baseline is one rank with one GEMM thread (one "device"); each data-parallel rank is a
// thread with one GEMM thread too, so world 2 on a 2-core machine is two devices. One JSON line per
// mode: {"bench": "data_parallel", "mode": "ddp", "world": 2, "median_ms": ..., "serial_median_ms": ...,
// "speedup": serial/median, "vs_ddp": median/ddp_median}. Under mpirun the ranks are processes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/train/trainer.h"
#include "tensor/cpu/gemm.h"

using namespace sl;
using Clock = std::chrono::steady_clock;

static const nn::GPTConfig kConfigB{256, 128, 6, 8, 256, 0.0};
static const int64_t kBatch = 8;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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

// The serial step, as bench/gpt_step times it (plus clipping, as the parallel steps do).
static double serial_median(const nn::TokenStream& data, int steps, int warmup) {
  nn::GPT model(kConfigB, 0);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    auto start = Clock::now();
    nn::Batch batch = data.get_batch(step, kBatch, kConfigB.block_size);
    optimizer.zero_grad();
    model.loss(batch.inputs, batch.targets).backward();
    nn::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median(times);
}

static double parallel_median(const nn::TokenStream& data, int world, const parallel::TrainPlan& plan,
                              int steps, int warmup) {
  std::vector<double> times;
  parallel::launch(world, [&](parallel::RankContext& ctx) {
    nn::GPT model(kConfigB, 0);
    parallel::Trainer trainer(model, ctx, plan, nn::AdamWOptions{});
    for (int step = 0; step < warmup + steps; ++step) {
      ctx.world->barrier();  // every rank starts the step together: the time is the slowest rank's
      auto start = Clock::now();
      trainer.train_step(data, step, kBatch, kConfigB.block_size, 1e-3, 1.0);
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (ctx.rank == 0 && step >= warmup) times.push_back(ms);
    }
  });
  return times.empty() ? 0.0 : median(times);
}

int main(int argc, char** argv) {
  int world = parallel::under_mpirun() ? parallel::mpirun_world_size() : 2, steps = 10, warmup = 3;
  std::string modes = "ddp,zero1,zero2,zero3";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--world") world = std::stoi(value);
    else if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--warmup") warmup = std::stoi(value);
    else if (flag == "--modes") modes = value;
    else {
      std::fprintf(stderr, "usage: data_parallel [--world N] [--steps N] [--warmup N] [--modes ddp,zero1,...]\n");
      return 2;
    }
  }
  set_num_threads(1);
  nn::TokenStream data = random_tokens(1 << 18);
  const bool print = parallel::mpirun_rank() == 0;
  double serial = serial_median(data, steps, warmup);
  double ddp_ms = 0;
  std::stringstream list(modes);
  for (std::string mode; std::getline(list, mode, ',');) {
    parallel::TrainPlan plan = parallel::TrainPlan::data_parallel(world);
    if (mode == "zero1" || mode == "zero2" || mode == "zero3") plan = parallel::TrainPlan::data_parallel(world, mode[4] - '0');
    else if (mode == "naive") plan.dp_strategy = parallel::DpStrategy::naive;
    else if (mode != "ddp") {
      std::fprintf(stderr, "data_parallel: unknown mode %s\n", mode.c_str());
      return 2;
    }
    double ms = parallel_median(data, world, plan, steps, warmup);
    if (mode == "ddp") ddp_ms = ms;
    if (print)
      std::printf("{\"bench\": \"data_parallel\", \"mode\": \"%s\", \"backend\": \"%s\", \"world\": %d, "
                  "\"median_ms\": %.2f, \"serial_median_ms\": %.2f, \"speedup\": %.3f, \"vs_ddp\": %.3f}\n",
                  mode.c_str(), parallel::under_mpirun() ? "mpi" : "threads", world, ms, serial, serial / ms,
                  ddp_ms > 0 ? ms / ddp_ms : 0.0);
    std::fflush(stdout);
  }
  return 0;
}
