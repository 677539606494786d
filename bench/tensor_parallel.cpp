// tensor_parallel — a training step of GPT config B (n_embd 256, 6 layers, 8 heads, B8 T128, f32)
// cut over tp ranks (Megatron TP, and TP + SP), against the serial step: median step time, the
// time blocked in the tp group's collectives, and the bytes each rank sends per step.
//
//   build/bench/tensor_parallel [--tp 2] [--steps 10] [--warmup 3] [--modes tp,tp_sp] [--quick]
//
// As bench/data_parallel: the serial baseline is one rank with one GEMM thread, each tp rank a
// thread with one GEMM thread, so tp 2 on a 2-core machine is two devices. One JSON line per mode:
// {"bench": "tensor_parallel", "mode": "tp", "tp": 2, "median_ms": ..., "serial_median_ms": ...,
//  "speedup": serial/median, "comm_ms": median time blocked in the tp group, "bytes_sent": per rank
//  per step, "all_reduce_calls": ..., "all_gather_calls": ..., "reduce_scatter_calls": ...}.
//
// --quick: both modes on a small GPT (n_embd 128, 2 layers, 4 heads, B8 T64), 1 step after 1
// warm-up (under 2 s; flags given beside it still apply). In every mode the output is checked
// (bench/bench_check.h), exiting 1 on a failure: the times finite and positive, the time blocked in
// the tp group at most the step's; and the calls and bytes per step equal to Megatron's placement of
// f and g, counted here (S = 4·B·T·C bytes, AR(x) = 2(t-1)/t·x for a ring all-reduce, AG/RS(x) =
// (t-1)/t·x), L blocks:
//   tp      all-reduce 4L + 5 (per block 2 g forward, 2 f backward; the embedding's g, the head's f;
//           the loss's max, target logit and Σexp over B·T numbers); all-gather 1 (clipping's norm:
//           each rank's f64 partial sum)
//           bytes (4L+2)·AR(S) + 3·AR(4BT) + 8(t-1)
//   tp_sp   all-reduce 5 (the embedding's g, the loss's 3, one sum of the partial LayerNorm and c_proj
//           bias gradients, (6L+2)·C numbers); all-gather 4L + 3 (per block 2 forward, 2 backward; the
//           embedding's scatter backward, the head's gather, clipping's norm); reduce-scatter 4L + 1
//           bytes AR(S) + 3·AR(4BT) + AR(4(6L+2)C) + (4L+2)·AG(S) + (4L+1)·RS(S) + 8(t-1)
// (exact when t divides B·T; otherwise the loss's ring chunks are one element apart: within 8 bytes
// per all-reduce of them).
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
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/nd/parallelize.h"

using namespace sl;
using Clock = std::chrono::steady_clock;

static const nn::GPTConfig kConfigB{256, 128, 6, 8, 256, 0.0};
static const nn::GPTConfig kQuick{256, 64, 2, 4, 128, 0.0};  // --quick: a step in tens of milliseconds
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
    if (step >= warmup) times.push_back(ms_since(start));
  }
  return median(times);
}

struct TPResult {
  double median_ms = 0, comm_ms = 0;
  parallel::CommStats all_reduce, all_gather, reduce_scatter;  // per step, rank 0
};

static TPResult tp_run(const nn::GPTConfig& config, const nn::TokenStream& data, int tp, bool sp, int steps,
                       int warmup) {
  TPResult result;
  std::vector<double> times, comm;
  parallel::launch(tp, [&](parallel::RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.world, {.tp = tp});
    // this rank's tp slice, as `train --tp` builds it (apply_tensor_parallel; parallel/nd/parallelize.h)
    std::unique_ptr<parallel::ModelRunner> owned =
        parallel::parallelize_model(config, 0, mesh, {.parallelism = mesh.config(), .sequence_parallel = sp});
    parallel::ModelRunner& runner = *owned;
    nn::AdamW optimizer(runner.module().parameters(), nn::AdamWOptions{});
    parallel::CommLedger& ledger = mesh.group(parallel::MeshDim::tp)->ledger();
    for (int step = 0; step < warmup + steps; ++step) {
      ctx.world->barrier();  // every rank starts together: the time is the slowest rank's
      ledger.reset();
      auto start = Clock::now();
      optimizer.zero_grad();
      auto micros = data.micro_batches(step, kBatch, config.block_size, 1);
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

struct TPFormula {
  int64_t all_reduce_calls, all_gather_calls, reduce_scatter_calls;
  double bytes, tolerance;
};

// What one rank of t sends in a step, from where Megatron puts f and g (see the header above and
// parallel/tensor_parallel/tensor_parallel.h), counted here rather than read from the code it checks.
static TPFormula tp_formula(const nn::GPTConfig& c, int64_t B, int t, bool sp) {
  const double L = static_cast<double>(c.n_layer), T = static_cast<double>(c.block_size);
  const double S = 4.0 * B * T * static_cast<double>(c.n_embd), rows = 4.0 * B * T;
  auto all_reduce = [&](double bytes) { return 2.0 * (t - 1) / t * bytes; };
  auto gather_or_scatter = [&](double bytes) { return (t - 1.0) / t * bytes; };
  const double clip = 8.0 * (t - 1);  // each rank's f64 partial sum of squares, all-gathered
  const double loss = 3 * all_reduce(rows);
  const double tolerance = (B * c.block_size) % t == 0 ? 0.0 : 3 * 8.0;
  const int64_t l = c.n_layer;
  if (!sp) return {4 * l + 5, 1, 0, (4 * L + 2) * all_reduce(S) + loss + clip, tolerance};
  const double partial = 4.0 * (6 * L + 2) * static_cast<double>(c.n_embd);  // ln_1, ln_2, 2 c_proj biases; ln_f
  return {5, 4 * l + 3, 4 * l + 1,
          all_reduce(S) + loss + all_reduce(partial) + (4 * L + 2) * gather_or_scatter(S) +
              (4 * L + 1) * gather_or_scatter(S) + clip,
          tolerance};
}

static void check_mode(bench::Checks& checks, const std::string& mode, const nn::GPTConfig& config, int tp,
                       const TPResult& r, double serial) {
  const std::string where = bench::Checks::label(mode, ", tp ", tp, ": ");
  const TPFormula f = tp_formula(config, kBatch, tp, mode == "tp_sp");
  checks.positive(r.median_ms, where, "median_ms");
  checks.positive(serial, where, "serial_median_ms");
  checks.finite(serial / r.median_ms, where, "speedup");
  checks.within(r.comm_ms, 0, r.median_ms, where, "comm_ms (blocked in the tp group, within the step)");
  checks.count(r.all_reduce.calls, f.all_reduce_calls, where, "all_reduce calls per step");
  checks.count(r.all_gather.calls, f.all_gather_calls, where, "all_gather calls per step");
  checks.count(r.reduce_scatter.calls, f.reduce_scatter_calls, where, "reduce_scatter calls per step");
  checks.equal(static_cast<double>(r.all_reduce.bytes_sent + r.all_gather.bytes_sent + r.reduce_scatter.bytes_sent),
               f.bytes, f.tolerance, where, "bytes_sent per rank per step");
}

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int tp = 2, steps = 10, warmup = 3;
  if (quick) steps = 1, warmup = 1;  // defaults: the flags below still override them
  const nn::GPTConfig& config = quick ? kQuick : kConfigB;
  std::string modes = "tp,tp_sp";
  cli::Parser flags("tensor_parallel", "tensor_parallel: a GPT step under Megatron tp and tp + sp, beside serial");
  flags.integer("--tp", tp, 2, 1024, "tensor-parallel ranks");
  flags.integer("--steps", steps, 1, 1 << 20, "timed steps per mode");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed steps before them");
  flags.text("--modes", modes, "tp,tp_sp", "which modes, comma-separated");
  bench::parse_flags(flags, argc, argv);
  const nn::TokenStream data = random_tokens(200000);
  const double serial = serial_median(config, data, steps, warmup);
  bench::Checks checks("tensor_parallel");
  std::stringstream list(modes);
  for (std::string mode; std::getline(list, mode, ',');) {
    const TPResult r = tp_run(config, data, tp, mode == "tp_sp", steps, warmup);
    check_mode(checks, mode, config, tp, r, serial);
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
  return checks.finish();
}
