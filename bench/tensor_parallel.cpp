// tensor_parallel — a training step of GPT config B (n_embd 256, 6 layers, 8 heads, B8 T128, f32)
// cut over tp ranks (Megatron TP, and TP + SP), against the serial step: median step time, the
// time blocked in the tp group's collectives, and the bytes each rank sends per step.
//
//   build/bench/tensor_parallel [--tp 2] [--steps 10] [--warmup 3] [--modes tp,tp_sp]
//
// As bench/data_parallel: the serial baseline is one rank with one GEMM thread, each tp rank a
// thread with one GEMM thread, so tp 2 on a 2-core machine is two devices. One JSON line per mode:
// {"bench": "tensor_parallel", "mode": "tp", "tp": 2, "median_ms": ..., "serial_median_ms": ...,
//  "speedup": serial/median, "comm_ms": median time blocked in the tp group, "bytes_sent": per rank
//  per step, "all_reduce_calls": ..., "all_gather_calls": ..., "reduce_scatter_calls": ...}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/tensor_parallel/tensor_parallel_runner.h"

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
  uint64_t x = 88172645463325252ull;  // xorshift: fixed data
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    stream.tokens.push_back(static_cast<int32_t>(x % 256));
  }
  return stream;
}

static double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

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
    if (step >= warmup) times.push_back(ms_since(start));
  }
  return median(times);
}

struct TPResult {
  double median_ms = 0, comm_ms = 0;
  parallel::CommStats all_reduce, all_gather, reduce_scatter;  // per step, rank 0
};

static TPResult tp_run(const nn::TokenStream& data, int tp, bool sp, int steps, int warmup) {
  TPResult result;
  std::vector<double> times, comm;
  parallel::launch(tp, [&](parallel::RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.world, {.tp = tp});
    parallel::TensorParallelRunner runner(kConfigB, 0, mesh, {.sequence_parallel = sp});
    nn::AdamW optimizer(runner.module().parameters(), nn::AdamWOptions{});
    parallel::CommLedger& ledger = mesh.group("tp")->ledger();
    for (int step = 0; step < warmup + steps; ++step) {
      ctx.world->barrier();  // every rank starts together: the time is the slowest rank's
      ledger.reset();
      auto start = Clock::now();
      optimizer.zero_grad();
      auto micros = data.micro_batches(step, kBatch, kConfigB.block_size, 1);
      runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
      runner.finish_gradients();
      parallel::clip_grad_norm(runner.mesh_grads(), 1.0, mesh);
      optimizer.step();
      const double ms = ms_since(start);
      if (ctx.rank == 0 && step >= warmup) {
        times.push_back(ms);
        comm.push_back(ledger.wait_seconds() * 1e3);
        result.all_reduce = ledger[parallel::CommOp::all_reduce];
        result.all_gather = ledger[parallel::CommOp::all_gather];
        result.reduce_scatter = ledger[parallel::CommOp::reduce_scatter];
      }
    }
  });
  result.median_ms = median(times);
  result.comm_ms = median(comm);
  return result;
}

int main(int argc, char** argv) {
  int tp = 2, steps = 10, warmup = 3;
  std::string modes = "tp,tp_sp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tp"))
      tp = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup"))
      warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--modes"))
      modes = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: tensor_parallel [--tp N] [--steps N] [--warmup N] [--modes tp,tp_sp]\n");
      return 2;
    }
  }
  const nn::TokenStream data = random_tokens(200000);
  const double serial = serial_median(data, steps, warmup);
  std::stringstream list(modes);
  for (std::string mode; std::getline(list, mode, ',');) {
    const TPResult r = tp_run(data, tp, mode == "tp_sp", steps, warmup);
    const int64_t bytes = r.all_reduce.bytes_sent + r.all_gather.bytes_sent + r.reduce_scatter.bytes_sent;
    std::printf(
        "{\"bench\": \"tensor_parallel\", \"mode\": \"%s\", \"tp\": %d, \"median_ms\": %.2f, \"serial_median_ms\": "
        "%.2f, "
        "\"speedup\": %.3f, \"comm_ms\": %.2f, \"bytes_sent\": %lld, \"all_reduce_calls\": %lld, "
        "\"all_gather_calls\": %lld, \"reduce_scatter_calls\": %lld}\n",
        mode.c_str(), tp, r.median_ms, serial, serial / r.median_ms, r.comm_ms, static_cast<long long>(bytes),
        static_cast<long long>(r.all_reduce.calls), static_cast<long long>(r.all_gather.calls),
        static_cast<long long>(r.reduce_scatter.calls));
    std::fflush(stdout);
  }
  return 0;
}
