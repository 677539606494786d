// data_parallel — how much faster a training step gets with data-parallel ranks, and what each ZeRO
// stage costs against DDP: GPT config B (n_embd 256, 6 layers, B8 T128), f32, median step time.
//
//   build/bench/data_parallel [--world 2] [--steps 10] [--warmup 3] [--modes ddp,zero1,zero2,zero3] [--quick]
//
// The serial baseline is one rank with one GEMM thread (one "device"); each data-parallel rank is a
// thread with one GEMM thread too, so world 2 on a 2-core machine is two devices. One JSON line per
// mode: {"bench": "data_parallel", "mode": "ddp", "world": 2, "median_ms": ..., "serial_median_ms": ...,
// "speedup": serial/median, "vs_ddp": median/ddp_median, "bytes_sent": ..., "bytes_formula": ...}.
// Under mpirun the ranks are processes.
// "bytes_sent": what rank 0 sent per timed step in the data-parallel groups (the gradients and, for
// ZeRO, the parameters; not the loss's and the counts' all-reduce). "bytes_formula": the same for Ψ
// f32 parameters over n ranks and ring collectives (null for naive, whose exchanges are its own):
//   DDP                 2(n-1)/n · 4Ψ   (all-reduce the gradients)
//   ZeRO-1, ZeRO-2      2(n-1)/n · 4Ψ   (reduce-scatter the gradients, all-gather the parameters)
//   ZeRO-3              3(n-1)/n · 4Ψ   (all-gather the parameters for the forward and again for the
//                                        backward, reduce-scatter the gradients)
// and for ZeRO the clip's 8(n-1) (its gradients are sharded, so each rank's part of the norm, one f64,
// is all-gathered; DDP clips its whole gradients alone).
//
// --quick: every mode on a small GPT (n_embd 128, 2 layers, 4 heads, B8 T64), 1 step after 1
// warm-up (about 2 s; flags given beside it still apply). In every mode the output is checked
// (bench/bench_check.h), exiting 1 on a failure: times finite and positive, ratios finite, one line
// per mode, and bytes_sent equal to bytes_formula up to what the formula leaves out: the flat
// buffers' padding to a multiple of n elements (none when n divides them; kSlack below).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/train/trainer.h"
#include "tensor/cpu/gemm.h"

using namespace sl;
using Clock = std::chrono::steady_clock;

static const nn::GPTConfig kConfigB{256, 128, 6, 8, 256, 0.0};
static const nn::GPTConfig kQuick{256, 64, 2, 4, 128, 0.0};  // --quick: a step in tens of milliseconds
static const int64_t kBatch = 8;
// How far above bytes_formula the measured bytes may be: the flat buffers' padding, a few elements
// against Ψ's hundreds of thousands (0.1% is far more than it takes, and far less than a collective
// sent twice or a mode that all-reduces where it should reduce-scatter).
static const double kSlack = 1e-3;

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
static double serial_median(const nn::GPTConfig& config, const nn::TokenStream& data, int steps, int warmup) {
  nn::GPT model(config, 0);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    auto start = Clock::now();
    nn::Batch batch = data.get_batch(step, kBatch, config.block_size);
    optimizer.zero_grad();
    model.loss(batch.inputs, batch.targets).backward();
    nn::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median(times);
}

struct Measured {
  double median_ms = 0, bytes_sent = 0;  // bytes: rank 0's per timed step
};

// What this rank has sent so far in the data-parallel groups: every ledger but the loss's.
static int64_t dp_bytes_sent(const parallel::Trainer& trainer) {
  int64_t sent = 0;
  for (const auto& [name, ledger] : trainer.ledgers())
    if (name != "loss") sent += ledger->total().bytes_sent;
  return sent;
}

static Measured parallel_median(const nn::GPTConfig& config, const nn::TokenStream& data, int world,
                                const parallel::TrainPlan& plan, int steps, int warmup) {
  std::vector<double> times;
  double bytes = 0;
  parallel::launch(world, [&](parallel::RankContext& ctx) {
    parallel::Trainer trainer(ctx, plan,
                              parallel::parallelize(config, 0, ctx.world, plan.parallelize_options(nn::AdamWOptions{})));
    int64_t sent_before = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) sent_before = dp_bytes_sent(trainer);
      ctx.world->barrier();  // every rank starts the step together: the time is the slowest rank's
      auto start = Clock::now();
      trainer.train_step(data, step, kBatch, config.block_size, 1e-3, 1.0);
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (ctx.rank == 0 && step >= warmup) times.push_back(ms);
    }
    if (ctx.rank == 0) bytes = static_cast<double>(dp_bytes_sent(trainer) - sent_before) / steps;
  });
  return {times.empty() ? 0.0 : median(times), bytes};
}

// The header's formula for rank 0's bytes per step; < 0 for naive (no formula).
static double bytes_formula(const std::string& mode, const nn::GPTConfig& config, int n) {
  nn::GPT model(config, 0);
  double psi = 0;  // Ψ: the parameters' elements
  for (const Tensor& p : model.parameters()) psi += static_cast<double>(p.numel());
  if (mode == "naive") return -1;
  // ZeRO's gradients are sharded, so the clip sums its norm over the ranks: an all-gather of one f64
  // per rank. DDP's are whole on every rank, and its clip is local.
  const double clip = mode == "ddp" ? 0.0 : 8.0 * (n - 1);
  return (mode == "zero3" ? 3.0 : 2.0) * (n - 1) / n * 4 * psi + clip;
}

// One JSON line, and its checks (on the process that prints it).
static void report(bench::Checks& checks, const std::string& mode, int world, const Measured& m, double serial,
                   double ddp_ms, double formula) {
  const std::string where = bench::Checks::label(mode, ", world ", world, ": ");
  checks.positive(m.median_ms, where, "median_ms");
  checks.positive(serial, where, "serial_median_ms");
  checks.finite(serial / m.median_ms, where, "speedup");
  checks.finite(ddp_ms > 0 ? m.median_ms / ddp_ms : 0.0, where, "vs_ddp");
  if (formula >= 0)  // the formula leaves out the padding (< n elements per flat buffer)
    checks.within(m.bytes_sent, formula, formula * (1 + kSlack), where, "bytes_sent per step against bytes_formula");
  char formula_json[32] = "null";
  if (formula >= 0) std::snprintf(formula_json, sizeof formula_json, "%.0f", formula);
  std::printf(
      "{\"bench\": \"data_parallel\", \"mode\": \"%s\", \"backend\": \"%s\", \"world\": %d, "
      "\"median_ms\": %.2f, \"serial_median_ms\": %.2f, \"speedup\": %.3f, \"vs_ddp\": %.3f, "
      "\"bytes_sent\": %.0f, \"bytes_formula\": %s}\n",
      mode.c_str(), parallel::under_mpirun() ? "mpi" : "threads", world, m.median_ms, serial, serial / m.median_ms,
      ddp_ms > 0 ? m.median_ms / ddp_ms : 0.0, m.bytes_sent, formula_json);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int world = parallel::under_mpirun() ? parallel::mpirun_world_size() : 2, steps = 10, warmup = 3;
  if (quick) steps = 1, warmup = 1;  // defaults: the flags below still override them
  const nn::GPTConfig& config = quick ? kQuick : kConfigB;
  std::string modes = "ddp,zero1,zero2,zero3";
  cli::Parser flags("data_parallel", "data_parallel: a GPT step under DDP, ZeRO-1/2/3 and naive DP, beside serial");
  flags.integer("--world", world, 1, 1024, "data-parallel ranks (under mpirun: mpirun's -np)");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per mode");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed steps before them");
  flags.text("--modes", modes, "ddp,zero1,...", "which strategies, comma-separated: ddp, zero1, zero2, zero3, naive");
  bench::parse_flags(flags, argc, argv);
  set_num_threads(1);
  nn::TokenStream data = random_tokens(1 << 18);
  const bool print = parallel::mpirun_rank() == 0;
  double serial = serial_median(config, data, steps, warmup);
  double ddp_ms = 0;
  bench::Checks checks("data_parallel");
  int rows = 0, asked = 0;
  std::stringstream list(modes);
  for (std::string mode; std::getline(list, mode, ',');) {
    ++asked;
    parallel::TrainPlan plan = parallel::TrainPlan::data_parallel(world);
    if (mode == "zero1" || mode == "zero2" || mode == "zero3") plan = parallel::TrainPlan::data_parallel(world, mode[4] - '0');
    else if (mode == "naive") plan.dp_strategy = parallel::DpStrategy::naive;
    else if (mode != "ddp") {
      std::fprintf(stderr, "data_parallel: unknown mode %s\n", mode.c_str());
      return 2;
    }
    const Measured m = parallel_median(config, data, world, plan, steps, warmup);
    if (mode == "ddp") ddp_ms = m.median_ms;
    if (!print) continue;  // under mpirun: rank 0's process prints
    report(checks, mode, world, m, serial, ddp_ms, bytes_formula(mode, config, world));
    ++rows;
  }
  if (print) checks.count(rows, asked, "JSON lines (one per mode)");
  return checks.finish();
}
