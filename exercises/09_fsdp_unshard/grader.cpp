// exercises/09_fsdp_unshard/grader.cpp — grades FSDP's unshard, reshard and reduce_gradients (student.cpp).
//
// Thread ranks (parallel/comm/launch.h) each run one FsdpLinear (fsdp_linear.h) on their own batch; the
// reference is an independent serial Linear on the whole batch (its gradient, flattened and padded,
// sliced where rank r's shard lies). Bytes from each group's CommLedger against (N-1)/N · 4P; memory
// from the MemoryLedger of the rank's device. With -DSL_SOLUTION the library's FsdpUnit
// (parallel/zero/fsdp_unit.h) runs the unit behind an adapter.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/09_fsdp_unshard/fsdp_linear.h"
#include "exercises/09_fsdp_unshard/serial_reference.h"
#include "parallel/comm/launch.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercise09::FsdpLinear;
using exercises::all_close;
using exercises::expect;

namespace exercise09 {
double predicted_step_bytes_per_rank();
void unshard(ProcessGroup& group, FsdpLinear& unit);
void reduce_gradients(ProcessGroup& group, FsdpLinear& unit);
void reshard(FsdpLinear& unit);
}  // namespace exercise09

#ifdef SL_SOLUTION
// The library's unit: with a graph to come, pre_backward gathers and binds zeroed full gradients, and
// its hooks reduce-scatter (avg) into the gradient shard and reshard as soon as backward reaches them.
namespace solution {
// An all-gather of the 4Ψ bytes of parameters and a reduce-scatter of the 4Ψ bytes of gradients, each
// rank sending (N-1)/N of each: 2(N-1)/N · 4Ψ, exactly what DDP's all-reduce sends.
double predicted_step_bytes_per_rank() { return 2.0 * (4 - 1) / 4 * 4 * (1024 * 1024 + 1024); }
void unshard(ProcessGroup&, FsdpLinear& unit) {
  if (GradMode::is_enabled())
    unit.library->pre_backward();
  else
    unit.library->unshard();
}
void reduce_gradients(ProcessGroup&, FsdpLinear& unit) { unit.library->finish_backward(); }
void reshard(FsdpLinear& unit) { unit.library->reshard(); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise09;
#endif

using namespace exercise09::reference;

// The unit as FSDP leaves it after wrapping: the shards of the same weights, gradients zero.
static FsdpLinear make_unit(const ProcessGroupPtr& group) {
  const int n = group->size();
  FsdpLinear unit;
  unit.in = kIn, unit.out = kOut, unit.numel = kNumel, unit.shard_numel = shard_numel(n);
  Tensor weight = initial_weight(), bias = initial_bias();
#ifdef SL_SOLUTION
  weight.set_requires_grad(true), bias.set_requires_grad(true);
  unit.library = FsdpUnit::make("fc", {{"weight", weight}, {"bias", bias}}, group, nullptr);
  unit.weight_shard = unit.library->weight_shard(), unit.grad_shard = unit.library->grad_shard();
  unit.weight = weight, unit.bias = bias;  // the library re-pointed them at its flat buffer
#else
  const std::vector<double> flat = padded_flat(weight, bias, n);
  const auto begin = flat.begin() + group->rank() * unit.shard_numel;
  MemoryScope weights(MemoryCategory::weights);
  unit.weight_shard = from_vector({begin, begin + unit.shard_numel}, Shape({unit.shard_numel}));
  MemoryScope grads(MemoryCategory::grads);
  unit.grad_shard = zeros({unit.shard_numel});
#endif
  return unit;
}

// One step of the unit: gather, forward and backward on rank r's batch, reduce, free.
static void train_step(ProcessGroup& group, FsdpLinear& unit, int rank, int step) {
  impl::unshard(group, unit);
  {
    const Tensor y = linear(batch_of(rank, step), unit.weight, unit.bias);
    loss_of(y).backward();
  }
  impl::reduce_gradients(group, unit);
  impl::reshard(unit);
}

// exercises::run_ranks (thread ranks, 4 s), with what a deadlock here likely is.
static void run_ranks(int n, const RankFunction& body) {
  exercises::run_ranks(n, body, "a rank waited 4 s in a collective its peers never joined: every rank "
                                "must call the same collectives in the same order. ");
}

static std::vector<double> slice(const std::vector<double>& flat, int r, int64_t S) {
  return {flat.begin() + r * S, flat.begin() + (r + 1) * S};
}

// Says in words what a wrong gradient shard of rank r looks like.
static std::string diagnose_grad(int n, int r, const std::vector<double>& got, const Serial& want) {
  const int64_t S = shard_numel(n);
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + "'s grad_shard ";
  std::vector<double> summed = slice(want.grads, r, S);
  for (double& v : summed) v *= n;
  if (got.size() != static_cast<size_t>(S)) return who + "has " + std::to_string(got.size()) + " elements, not S";
  if (all_close(got, std::vector<double>(S, 0.0), 0, 0))
    return who + "is still zero: add the reduced chunk into unit.grad_shard";
  if (all_close(got, summed, 1e-5, 1e-5))
    return who + "is " + std::to_string(n) + "x the serial one: reduce with ReduceOp::avg, not sum";
  if (all_close(got, slice(want.local[r], r, S), 1e-5, 1e-5))
    return who + "is its own batch's gradient alone: reduce-scatter the full gradients over the ranks";
  for (int j = 0; j < n; ++j)
    if (j != r && all_close(got, slice(want.grads, j, S), 1e-5, 1e-5))
      return who + "holds chunk " + std::to_string(j) + " of the gradient: rank r keeps elements [r·S, (r+1)·S)";
  return who + "differs from the serial gradient sliced at [" + std::to_string(r * S) + ", " +
         std::to_string((r + 1) * S) + "): pack weight.grad then bias.grad, in the flat order, zeros after";
}

// One step at world n (steps of them accumulated): every rank's gradient shard against the serial slice.
static void expect_grad_shards(int n, int steps) {
  const Serial want = serial(n, steps);
  std::vector<std::vector<double>> got(n);
  run_ranks(n, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    for (int step = 0; step < steps; ++step) train_step(*ctx.world, unit, ctx.rank, step);
    got[ctx.rank] = unit.grad_shard.to_vector();
  });
  const int64_t S = shard_numel(n);
  for (int r = 0; r < n; ++r) {
    if (all_close(got[r], slice(want.grads, r, S), 1e-5, 1e-5)) continue;
    if (steps > 1) {
      const Serial last = serial(n, 1, steps - 1);  // the last backward alone
      expect(!all_close(got[r], slice(last.grads, r, S), 1e-5, 1e-5),
             "after 2 backwards rank " + std::to_string(r) +
                 "'s grad_shard holds one backward's gradient: add into "
                 "grad_shard (accumulate over micro-batches), do not overwrite it");
    }
    expect(false, diagnose_grad(n, r, got[r], want));
  }
}

static void check_unshard_values() {
  const Serial want = serial(4, 1);
  run_ranks(4, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    NoGradGuard no_grad;
    impl::unshard(*ctx.world, unit);
    expect(unit.weight.defined() && unit.bias.defined(), "unshard left unit.weight or unit.bias undefined");
    expect(unit.weight.shape() == Shape({kOut, kIn}) && unit.bias.shape() == Shape({kOut}),
           "unit.weight should be [out, in] = [3, 5] and unit.bias [out] = [3]");
    expect(all_close(unit.weight.to_vector(), initial_weight().to_vector(), 0, 0),
           "rank " + std::to_string(ctx.rank) +
               "'s gathered weight differs from the serial one: the all-gather's "
               "slot r is rank r's shard, and weight is full's first out·in elements, row-major");
    expect(all_close(unit.bias.to_vector(), initial_bias().to_vector(), 0, 0),
           "rank " + std::to_string(ctx.rank) + "'s gathered bias differs: it starts at out·in = 15 in full");
    expect(all_close(linear(batch_of(ctx.rank, 0), unit.weight, unit.bias).to_vector(), want.y[ctx.rank], 1e-5, 1e-5),
           "rank " + std::to_string(ctx.rank) + "'s forward output differs from the serial block's rows");
  });
}

static void check_unshard_bytes() {
  run_ranks(4, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    NoGradGuard no_grad;
    ctx.world->ledger().reset();
    impl::unshard(*ctx.world, unit);
    const CommLedger& ledger = ctx.world->ledger();
    const int64_t formula = 3 * 4 * 20 / 4;
    expect(ledger[CommOp::all_gather].calls == 1 && ledger.total().bytes_sent == formula,
           "rank " + std::to_string(ctx.rank) + " sent " + std::to_string(ledger.total().bytes_sent) + " bytes in " +
               std::to_string(ledger[CommOp::all_gather].calls) +
               " all-gathers; one all-gather of the [S] shard "
               "sends (N-1)/N · 4P = " +
               std::to_string(formula));
  });
}

static void check_unshard_memory() {
  run_ranks(4, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    NoGradGuard no_grad;
    const MemoryLedger& memory = MemoryLedger::instance();
    const int64_t before = memory.current(ctx.device), P = 4 * shard_numel(4);
    impl::unshard(*ctx.world, unit);
    const int64_t gathered = memory.current(ctx.device) - before;
    expect(gathered == 4 * P, "unshard added " + std::to_string(gathered) + " bytes on rank " +
                                  std::to_string(ctx.rank) + "; the gathered unit is 4P = " + std::to_string(4 * P) +
                                  " bytes (allocate full once, view weight and bias: no copies)");
    impl::reshard(unit);
    const int64_t left = memory.current(ctx.device) - before;
    expect(left == 0, "after reshard rank " + std::to_string(ctx.rank) + " still holds " + std::to_string(left) +
                          " of the gathered bytes: weight and bias are views that keep full's buffer alive, drop "
                          "them too");
    expect(memory.current(ctx.device, MemoryCategory::weights) == 4 * shard_numel(4),
           "between blocks a rank should hold 4S = 20 bytes of weights (Ψ/N), it holds " +
               std::to_string(memory.current(ctx.device, MemoryCategory::weights)));
  });
}

static void check_step_bytes() {
  run_ranks(4, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    ctx.world->ledger().reset();
    train_step(*ctx.world, unit, ctx.rank, 0);
    const CommLedger& ledger = ctx.world->ledger();
    const int64_t formula = 3 * 4 * 20 / 4;
    const CommStats scatter = ledger[CommOp::reduce_scatter];
    expect(ledger[CommOp::all_reduce].calls == 0,
           "rank " + std::to_string(ctx.rank) + " all-reduced: FSDP reduce-scatters, each rank keeps only its chunk");
    expect(scatter.calls == 1 && scatter.bytes_sent == formula,
           "rank " + std::to_string(ctx.rank) + " sent " + std::to_string(scatter.bytes_sent) + " bytes in " +
               std::to_string(scatter.calls) +
               " reduce-scatters; one reduce-scatter of the [P] gradients sends "
               "(N-1)/N · 4P = " +
               std::to_string(formula));
    expect(ledger.total().bytes_sent == 2 * formula, "a step sends " + std::to_string(ledger.total().bytes_sent) +
                                                         " bytes on rank " + std::to_string(ctx.rank) + ", not 2 x " +
                                                         std::to_string(formula));
  });
}

static void check_step_memory() {
  run_ranks(4, [&](RankContext& ctx) {
    FsdpLinear unit = make_unit(ctx.world);
    const MemoryLedger& memory = MemoryLedger::instance();
    const int64_t before = memory.current(ctx.device);
    train_step(*ctx.world, unit, ctx.rank, 0);
    const int64_t left = memory.current(ctx.device) - before;
    expect(left == 0, "after a step rank " + std::to_string(ctx.rank) + " holds " + std::to_string(left) +
                          " bytes more than before it (the gathered parameters are 4P = 80 bytes, their gradients "
                          "72): reshard drops full, weight and bias (whose .grad hold the gradients), and "
                          "reduce_gradients' [P] buffer must not outlive the call");
  });
}

// The prediction's measured value: the library's FsdpUnit wraps a Linear 1024 -> 1024 at N = 4 and runs
// one step (gather, forward, backward, reduce-scatter, reshard); rank 0's ledger counts what it sent.
static double measured_step_bytes_per_rank() {
  std::vector<int64_t> sent(4);
  exercises::run_ranks(4, [&](RankContext& ctx) {
    Tensor weight = zeros({1024, 1024}), bias = zeros({1024});
    weight.set_requires_grad(true), bias.set_requires_grad(true);
    const auto unit = FsdpUnit::make("fc", {{"weight", weight}, {"bias", bias}}, ctx.world, nullptr);
    ctx.world->ledger().reset();
    unit->pre_backward();
    sum(linear(ones({2, 1024}), weight, bias)).backward();
    unit->finish_backward();
    unit->reshard();
    sent[static_cast<size_t>(ctx.rank)] = ctx.world->ledger().total().bytes_sent;
  }, "the library's FSDP step did not finish. ");
  return static_cast<double>(sent[0]);
}

int main() {
  exercises::Grader grader("09_fsdp_unshard");
  grader.predict("bytes each rank sends in one FSDP step of a Linear 1024 -> 1024 with bias at N = 4",
                 impl::predicted_step_bytes_per_rank, measured_step_bytes_per_rank, 0, "bytes");
  grader.check("unshard, world 4: weight and bias equal the serial block's, and so does each rank's output",
               check_unshard_values);
  grader.check("unshard, world 4: one all-gather of (N-1)/N · 4P bytes per rank (P = N·S = 20)", check_unshard_bytes);
  grader.check("memory, world 4: unshard adds exactly 4P bytes; reshard gives them back, only the 4S shard stays",
               check_unshard_memory);
  grader.check("reduce_gradients, world 4 (padded): each grad_shard == the serial gradient sliced at [rS, (r+1)S)",
               [] { expect_grad_shards(4, 1); });
  grader.check("reduce_gradients, worlds 2 and 3: the same, unpadded and padded", [] {
    expect_grad_shards(2, 1);
    expect_grad_shards(3, 1);
  });
  grader.check("a step, world 4: one all-gather and one reduce-scatter, (N-1)/N · 4P bytes each", check_step_bytes);
  grader.check("memory after a step, world 4: the full parameters and their gradients are all freed",
               check_step_memory);
  grader.check("two backwards, world 4: the gradient shards accumulate (the sum of both steps' mean gradients)",
               [] { expect_grad_shards(4, 2); });
  return grader.finish();
}
