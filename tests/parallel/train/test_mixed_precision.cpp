// Mixed precision (nn/mixed_precision.h) in every layout that runs it: bf16 and fp16 weights and
// activations, f32 master weights in AdamW, gradients in bf16 or f32, fp16 loss scaling agreed over
// the world. Each layout is compared with an independent serial mixed-precision run (its own nn::GPT
// in 16 bits, nn::AdamW with master weights, nn::GradScaler) over 5 AdamW steps at lr 1e-2, wd 0.1.
//
// Why the layouts are not bitwise equal to serial, and the bounds the tests use:
//   every op rounds its output to 16 bits, u = 2^-9 (bf16) or 2^-12 (fp16) relative; a layout sums
//   the same numbers in another order (a ring all-reduce of 16-bit buckets rounds at every hop, a
//   TP row-parallel layer adds partial products the serial matmul adds inside one f32 accumulator),
//   so the same value can land one rounding apart: |Δ| ≤ u·|x| per rounding. Through 5 steps these
//   add up over the layers without growing by orders of magnitude, so the mean loss, the gradient
//   norm and the weights are compared within 4u relative (plus 4u absolute for values near 0).
//   A wrong scale (an unscaled fp16 gradient: ×65536), a lost decay (1e-3·p per step) or a weight
//   that misses its update (lr·1 per step) are all far outside that.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/train/factory.h"
#include "parallel/train/trainer.h"
#include "parallel/zero/zero_adamw.h"
#include "tests/support/trainer.h"
#include "tensor/ledger.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

constexpr int64_t kBatch = 12, kT = 8;
constexpr int kSteps = 5;
constexpr uint64_t kSeed = 11;
constexpr double kClip = 1.0;

nn::GPTConfig config(DType dtype, int64_t layers = 2) {
  nn::GPTConfig c{.vocab_size = 32, .block_size = kT, .n_layer = layers, .n_head = 2, .n_embd = 16};
  c.param_dtype = dtype;
  return c;
}

double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12); }

struct SerialStep {
  double loss = 0, norm = 0;
  nn::StateDict params;
};

// The serial mixed-precision step, written out: scaled backward, unscale, clip, step. The scaling
// is the test's own (not nn::GradScaler's), so a layout that forgets to unscale cannot agree with it:
// 5 steps of the parity stream never overflow, so the scale stays 2^16 (fp16) or 1 (bf16).
std::vector<SerialStep> run_serial(const nn::MixedPrecision& precision, int64_t layers) {
  nn::GPT model(config(precision.param_dtype, layers), kSeed);
  nn::AdamWOptions adamw = parity_adamw();
  adamw.master_weights = true;
  nn::AdamW optimizer(model.parameters(), adamw);
  const double scale = precision.loss_scale.enabled ? 65536.0 : 1.0;
  const nn::TokenStream data = parity_tokens();
  std::vector<SerialStep> steps;
  for (int s = 0; s < kSteps; ++s) {
    nn::zero_grads(model.parameters(), precision);
    nn::Batch batch = data.get_batch(s, kBatch, kT);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    mul(loss, scale).backward();
    for (const Tensor& p : model.parameters()) {
      for (double g : p.grad().to_vector()) EXPECT_TRUE(std::isfinite(g)) << "the serial run overflowed at step " << s;
      p.grad().mul_(1.0 / scale);
    }
    SerialStep step{loss.item(), nn::clip_grad_norm(model.parameters(), kClip), {}};
    optimizer.step();
    for (const auto& [name, p] : model.state_dict()) step.params[name] = p.detach().clone();
    steps.push_back(std::move(step));
  }
  return steps;
}

// The weights: within tol of the serial ones, except the few elements whose gradient is within
// rounding noise of 0. There Adam's update m/sqrt(v) is ±1 by the sign of that noise, so one rounding
// apart can move the weight by 2·lr per step the other way: such elements are bounded by 2·lr per
// step taken, and they must stay rare (at most 1% of the elements; 0.2% at most were seen), or a rule
// is broken.
void expect_close(const nn::StateDict& got, const nn::StateDict& want, double tol, int rank, int step) {
  ASSERT_EQ(got.size(), want.size());
  int64_t total = 0, outside = 0;
  const double noisy_bound = 2 * parity_adamw().lr * (step + 1) + tol;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.dtype(), w.dtype()) << name;
    const std::vector<double> a = g.to_vector(), b = w.to_vector();
    for (size_t i = 0; i < b.size(); ++i) {
      const double diff = std::abs(a[i] - b[i]);
      total++;
      if (diff <= tol + tol * std::abs(b[i])) continue;
      outside++;
      ASSERT_LE(diff, noisy_bound) << name << "[" << i << "] on rank " << rank << " at step " << step << ": " << a[i]
                                   << " vs serial " << b[i];
    }
  }
  EXPECT_LE(outside, total / 100) << outside << " of " << total << " weights differ by more than " << tol
                                  << " (relative) on rank " << rank << " at step " << step;
}

struct MpCase {
  std::string name;
  ParallelismConfig parallelism;
  std::string mode, grads = "";
  int micro_batches = 1;
  bool sp = false;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  DpStrategy dp = DpStrategy::ddp;  // zero1, zero2, fsdp (ZeRO-3, HSDP with dp_replicate)
  bool offload = false;
  int virtual_stages = 1;  // interleaved: model chunks per stage (the GPT then has pp x this many layers)
  CpVariant cp_variant = CpVariant::ring;
  int64_t layers() const { return std::max<int64_t>(2, parallelism.pp * virtual_stages); }
  int world() const { return parallelism.world_size(); }
};
void PrintTo(const MpCase& c, std::ostream* out) { *out << c.name; }

TrainPlan plan_of(const MpCase& c) {
  TrainPlan plan;
  plan.parallelism = c.parallelism;
  plan.micro_batches = c.micro_batches;
  plan.sequence_parallel = c.sp;
  plan.schedule = c.schedule;
  plan.precision = nn::MixedPrecision::parse(c.mode, c.grads);
  plan.dp_strategy = c.dp;
  plan.offload = c.offload;
  plan.virtual_stages = c.virtual_stages;
  plan.cp_variant = c.cp_variant;
  return plan;
}

// Runs `c` on its mesh: the whole model under its data-parallel strategy, or train's runner for a cut.
std::unique_ptr<Trainer> make_trainer(RankContext& ctx, const MpCase& c, std::unique_ptr<nn::GPT>& whole) {
  const TrainPlan plan = plan_of(c);
  const nn::GPTConfig cfg = config(plan.precision.param_dtype, c.layers());
  if (!plan.cuts_model()) {
    whole = std::make_unique<nn::GPT>(cfg, kSeed);
    return std::make_unique<Trainer>(*whole, ctx, plan, parity_adamw());
  }
  return std::make_unique<Trainer>(
      ctx, plan, [&](const DeviceMesh& mesh) { return make_model_runner(plan, cfg, kSeed, {}, mesh); }, parity_adamw());
}

class MixedPrecisionParity : public testing::TestWithParam<MpCase> {};

TEST_P(MixedPrecisionParity, MatchesTheSerialMixedPrecisionRun) {
  const MpCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::MixedPrecision precision = nn::MixedPrecision::parse(c.mode, c.grads);
  const std::vector<SerialStep> serial = run_serial(precision, c.layers());
  const double tol = 4 * unit_roundoff(precision.param_dtype);
  const nn::TokenStream data = parity_tokens();
  launch(
      c.world(),
      [&](RankContext& ctx) {
        std::unique_ptr<nn::GPT> whole;
        std::unique_ptr<Trainer> trainer = make_trainer(ctx, c, whole);
        for (int s = 0; s < kSteps; ++s) {
          const double loss = trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
          EXPECT_NEAR(loss, serial[s].loss, tol * std::abs(serial[s].loss)) << "step " << s;
          EXPECT_NEAR(trainer->last_grad_norm(), serial[s].norm, tol * serial[s].norm) << "step " << s;
          expect_close(trainer->full_state_dict(), serial[s].params, tol, ctx.rank, s);
        }
        EXPECT_EQ(trainer->scaler().scale(), precision.loss_scale.enabled ? 65536.0 : 1.0);
      },
      quick(30000));
}

std::vector<MpCase> parity_cases() {
  std::vector<MpCase> cases;
  for (std::string mode : {"bf16", "fp16"}) {
    cases.push_back({mode + "_ddp2", {.dp_replicate = 2}, mode});
    cases.push_back({mode + "_ddp3_micro2", {.dp_replicate = 3}, mode, "", 2});
    cases.push_back({mode + "_pp2_1f1b", {.pp = 2}, mode, "", 2});
    cases.push_back({mode + "_pp2_zero_bubble", {.pp = 2}, mode, "", 2, false, ScheduleKind::zero_bubble});
    cases.push_back({mode + "_tp2_sp", {.tp = 2}, mode, "", 1, true});
    cases.push_back({mode + "_cp2", {.cp = 2}, mode});
    cases.push_back({mode + "_dp2_pp2_tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}, mode, "", 2});
    cases.push_back({mode + "_dp2_cp2_tp2_sp", {.dp_replicate = 2, .cp = 2, .tp = 2}, mode, "", 1, true});
  }
  cases.push_back({"bf16_f32grads_ddp2_micro3", {.dp_replicate = 2}, "bf16", "f32", 3});
  cases.push_back({"bf16_f32grads_pp2_tp2", {.pp = 2, .tp = 2}, "bf16", "f32", 2});
  // The sharded strategies: ZeRO-1/2 reduce-scatter the 16-bit buckets (ZeRO-1's average in place),
  // ZeRO-3/FSDP and HSDP gather 16-bit weights and reduce 16-bit gradients, offload steps on the host.
  // N = 3 pads every bucket; the f32-gradient cases hold main_grad in the flat buffers.
  const ScheduleKind f1b = ScheduleKind::one_f_one_b;
  for (std::string mode : {"bf16", "fp16"}) {
    cases.push_back({mode + "_zero1_dp2", {.dp_shard = 2}, mode, "", 1, false, f1b, DpStrategy::zero1});
    cases.push_back({mode + "_zero2_dp3_micro2", {.dp_shard = 3}, mode, "", 2, false, f1b, DpStrategy::zero2});
    cases.push_back({mode + "_fsdp3", {.dp_shard = 3}, mode, "", 1, false, f1b, DpStrategy::fsdp});
    cases.push_back(
        {mode + "_hsdp_2x2", {.dp_replicate = 2, .dp_shard = 2}, mode, "", 1, false, f1b, DpStrategy::fsdp});
  }
  cases.push_back({"bf16_zero1_dp3_micro2", {.dp_shard = 3}, "bf16", "", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_f32grads_zero1_dp2", {.dp_shard = 2}, "bf16", "f32", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_f32grads_fsdp2", {.dp_shard = 2}, "bf16", "f32", 1, false, f1b, DpStrategy::fsdp});
  cases.push_back({"bf16_zero2_offload_dp2", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2, true});
  cases.push_back({"fp16_zero1_offload_dp2", {.dp_shard = 2}, "fp16", "", 1, false, f1b, DpStrategy::zero1, true});
  cases.push_back({"bf16_fsdp2_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp, true});
  cases.push_back({"bf16_zero2_dp2_tp2_sp", {.dp_shard = 2, .tp = 2}, "bf16", "", 1, true, f1b, DpStrategy::zero2});
  cases.push_back({"bf16_zero1_dp2_pp2", {.dp_shard = 2, .pp = 2}, "bf16", "", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_fsdp2_cp2", {.dp_shard = 2, .cp = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp});
  // Ulysses keeps 16-bit q, k, v through its all-to-alls and the serial attention (n_head 2 over cp 2)
  for (std::string mode : {"bf16", "fp16"})
    cases.push_back({mode + "_cp2_ulysses", {.cp = 2}, mode, "", 1, false, f1b, DpStrategy::ddp, false, 1,
                     CpVariant::ulysses});
  cases.push_back({"fp16_fsdp2_tp2", {.dp_shard = 2, .tp = 2}, "fp16", "", 1, false, f1b, DpStrategy::fsdp});
  // The schedules not above: naive and GPipe, and interleaved 1F1B (2 chunks per stage, 4 layers).
  cases.push_back({"bf16_pp2_naive", {.pp = 2}, "bf16", "", 2, false, ScheduleKind::naive});
  cases.push_back({"fp16_pp2_gpipe", {.pp = 2}, "fp16", "", 2, false, ScheduleKind::gpipe});
  cases.push_back(
      {"bf16_pp2_interleaved", {.pp = 2}, "bf16", "", 2, false, ScheduleKind::interleaved, DpStrategy::ddp, false, 2});
  cases.push_back({"fp16_zero1_dp2_pp2_interleaved",
                   {.dp_shard = 2, .pp = 2},
                   "fp16",
                   "",
                   2,
                   false,
                   ScheduleKind::interleaved,
                   DpStrategy::zero1,
                   false,
                   2});  // (DDP refuses interleaved)
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, MixedPrecisionParity, testing::ValuesIn(parity_cases()),
                         [](const testing::TestParamInfo<MpCase>& info) { return info.param.name; });

// A loss scale so large that fp16's gradients overflow (65504 is fp16's largest): every rank of every
// mesh dimension must skip the step, the scale halves, and no weight or AdamW state moves a bit.
class MixedPrecisionOverflow : public testing::TestWithParam<MpCase> {};

TEST_P(MixedPrecisionOverflow, EveryRankSkipsTheStepAndTheScaleHalves) {
  MpCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::TokenStream data = parity_tokens();
  launch(
      c.world(),
      [&](RankContext& ctx) {
        TrainPlan plan = plan_of(c);
        plan.precision.loss_scale.init_scale = std::ldexp(1.0, 100);  // loss·2^100 is finite in f32
        std::unique_ptr<nn::GPT> whole;
        std::unique_ptr<Trainer> trainer;
        const nn::GPTConfig cfg = config(DType::f16);
        if (!plan.cuts_model()) {
          whole = std::make_unique<nn::GPT>(cfg, kSeed);
          trainer = std::make_unique<Trainer>(*whole, ctx, plan, parity_adamw());
        } else {
          trainer = std::make_unique<Trainer>(
              ctx, plan, [&](const DeviceMesh& mesh) { return make_model_runner(plan, cfg, kSeed, {}, mesh); },
              parity_adamw());
        }
        const nn::StateDict before = trainer->full_state_dict();
        // This rank's own part, bitwise (FSDP frees its gathered parameters between steps: there the
        // whole state dict, gathered from every rank's shard, is the check).
        const bool local = c.dp != DpStrategy::fsdp;
        std::vector<std::string> local_before;
        for (const auto& [name, p] : trainer->runner()->module().named_parameters())
          if (local) local_before.emplace_back(static_cast<const char*>(p.raw_data()), static_cast<size_t>(p.nbytes()));
        trainer->train_step(data, 0, kBatch, kT, parity_adamw().lr, kClip);
        EXPECT_EQ(trainer->scaler().skipped_steps(), 1) << "rank " << ctx.rank;
        EXPECT_EQ(trainer->scaler().scale(), std::ldexp(1.0, 99)) << "rank " << ctx.rank;
        size_t i = 0;
        for (const auto& [name, p] : trainer->runner()->module().named_parameters())
          if (local) {
            EXPECT_TRUE(local_before[i++] ==
                        std::string(static_cast<const char*>(p.raw_data()), static_cast<size_t>(p.nbytes())))
                << name << " moved on rank " << ctx.rank;
          }
        const nn::StateDict after = trainer->full_state_dict();
        for (const auto& [name, t] : before)
          EXPECT_EQ(std::memcmp(t.raw_data(), after.at(name).raw_data(), static_cast<size_t>(t.nbytes())), 0) << name;
      },
      quick(30000));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MixedPrecisionOverflow,
    testing::Values(
        MpCase{"ddp2", {.dp_replicate = 2}, "fp16"},
        MpCase{"pp2_gpipe", {.pp = 2}, "fp16", "", 2, false, ScheduleKind::gpipe},
        MpCase{"tp2_sp", {.tp = 2}, "fp16", "", 1, true}, MpCase{"cp2", {.cp = 2}, "fp16"},
        MpCase{"dp2_pp2_tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}, "fp16", "", 2},
        MpCase{"zero1_dp2", {.dp_shard = 2}, "fp16", "", 1, false, ScheduleKind::one_f_one_b, DpStrategy::zero1},
        MpCase{"zero2_offload_dp2",
               {.dp_shard = 2},
               "fp16",
               "",
               1,
               false,
               ScheduleKind::one_f_one_b,
               DpStrategy::zero2,
               true},
        MpCase{"hsdp_2x2",
               {.dp_replicate = 2, .dp_shard = 2},
               "fp16",
               "",
               1,
               false,
               ScheduleKind::one_f_one_b,
               DpStrategy::fsdp},
        MpCase{
            "fsdp2_pp2", {.dp_shard = 2, .pp = 2}, "fp16", "", 2, false, ScheduleKind::one_f_one_b, DpStrategy::fsdp}),
    [](const testing::TestParamInfo<MpCase>& info) { return info.param.name; });

// ZeRO's accounting, from Ψ (counted from the config's shapes) and the element sizes: DDP holds
// weights 2Ψ, gradients 2Ψ (bf16 buckets) or 4Ψ (f32 main_grad), optimizer 12Ψ (master + two moments).
TEST(MixedPrecisionMemory, DdpHoldsTwoPlusTwoPlusTwelveBytesPerParameter) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig c = config(DType::bf16);
  const int64_t C = c.n_embd, L = c.n_layer;
  const int64_t psi = c.vocab_size * C + c.block_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  for (const std::string grads : {"bf16", "f32"}) {
    const MpCase mp{"ddp2", {.dp_replicate = 2}, "bf16", grads};
    const nn::TokenStream data = parity_tokens();
    launch(
        2,
        [&](RankContext& ctx) {
          MemoryLedger& ledger = MemoryLedger::instance();
          auto now = [&](MemoryCategory cat) { return ledger.current(ctx.device, cat); };
          const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads),
                        o0 = now(MemoryCategory::optimizer);
          {
            std::unique_ptr<nn::GPT> whole;
            std::unique_ptr<Trainer> trainer = make_trainer(ctx, mp, whole);
            for (int s = 0; s < 2; ++s) trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
            EXPECT_EQ(now(MemoryCategory::weights) - w0, 2 * psi) << grads;
            EXPECT_EQ(now(MemoryCategory::grads) - g0, (grads == "bf16" ? 2 : 4) * psi) << grads;
            EXPECT_EQ(now(MemoryCategory::optimizer) - o0, 12 * psi) << grads;
          }
        },
        quick(30000));
  }
}

// The ZeRO paper's table (§3.1, K = 12) from Ψ and N, for the model states a rank holds between
// steps. Ψ = 7232 divides by 2 and 4 and each FSDP unit's count is even, so no bucket is padded at
// N = 2 and the formulas hold to the byte:
//   ZeRO-1  weights 2Ψ    gradients 2Ψ    optimizer 12Ψ/N (f32 master + two moments)   4Ψ + 12Ψ/N
//   ZeRO-2  weights 2Ψ    gradients 2Ψ/N  optimizer 12Ψ/N                              2Ψ + 14Ψ/N
//   ZeRO-3  weights 2Ψ/N  gradients 2Ψ/N  optimizer 12Ψ/N                              16Ψ/N
//   offload: the optimizer's 12Ψ/N lives on the host ("offload") with the f32 gradient the update
//   reads there (ZeRO-2: 4Ψ/N; FSDP's CPUOffload also keeps its 2+2 bytes of shards there).
TEST(MixedPrecisionMemory, ShardedStrategiesHoldThePapersBytes) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig c = config(DType::bf16);
  const int64_t C = c.n_embd, L = c.n_layer, N = 2;
  const int64_t psi = c.vocab_size * C + c.block_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  ASSERT_EQ(psi % N, 0);
  struct Expected {
    MpCase mp;
    int64_t weights, grads, optimizer, offload;
  };
  const ScheduleKind f1b = ScheduleKind::one_f_one_b;
  const std::vector<Expected> cases = {
      {{"zero1", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero1}, 2 * psi, 2 * psi, 12 * psi / N, 0},
      {{"zero1_main_grad", {.dp_shard = 2}, "bf16", "f32", 1, false, f1b, DpStrategy::zero1},
       2 * psi,
       4 * psi,
       12 * psi / N,
       0},
      {{"zero2", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2}, 2 * psi, 2 * psi / N, 12 * psi / N, 0},
      {{"zero3", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp},
       2 * psi / N,
       2 * psi / N,
       12 * psi / N,
       0},
      {{"zero2_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2, true},
       2 * psi,
       2 * psi / N,
       0,
       (12 + 4) * psi / N},
      {{"zero3_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp, true},
       0,
       0,
       0,
       (2 + 2 + 12) * psi / N},
  };
  const nn::TokenStream data = parity_tokens();
  for (const Expected& e : cases) {
    launch(
        2,
        [&](RankContext& ctx) {
          MemoryLedger& ledger = MemoryLedger::instance();
          auto now = [&](MemoryCategory cat) { return ledger.current(ctx.device, cat); };
          const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads),
                        o0 = now(MemoryCategory::optimizer), h0 = now(MemoryCategory::offload);
          std::unique_ptr<nn::GPT> whole;
          std::unique_ptr<Trainer> trainer = make_trainer(ctx, e.mp, whole);
          for (int s = 0; s < 2; ++s) trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
          EXPECT_EQ(now(MemoryCategory::weights) - w0, e.weights) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::grads) - g0, e.grads) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::optimizer) - o0, e.optimizer) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::offload) - h0, e.offload) << e.mp.name;
        },
        quick(30000));
  }
}

// ZeroAdamW on 16-bit parameters keeps nn::AdamW's rule (no update without an f32 master copy), and
// ZeRO-1 with 16-bit gradients, which averages in place, refuses a second reduce before zero_grad():
// adding a backward's sum to an average would silently weigh the two windows differently.
TEST(MixedPrecisionZero, SixteenBitRulesAreSaidNotBroken) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        {
          nn::GPT model(config(DType::bf16), kSeed);
          expect_error([&] { ZeroAdamW zero(model.parameters(), ctx.world, {.stage = 1}); },
                       "set AdamWOptions::master_weights");
        }
        nn::GPT model(config(DType::bf16), kSeed);
        ZeroAdamW zero(model.parameters(), ctx.world, {.stage = 1, .adamw = {.master_weights = true}});
        const nn::Batch batch = parity_tokens().get_batch(0, 2, kT);
        zero.zero_grad();
        model.loss(batch.inputs, batch.targets).backward();
        zero.reduce_gradients();
        model.loss(batch.inputs, batch.targets).backward();
        expect_error([&] { zero.reduce_gradients(); }, "a backward after it needs zero_grad() first");
        zero.zero_grad();  // a new window reduces again
        model.loss(batch.inputs, batch.targets).backward();
        EXPECT_NO_THROW(zero.step());
      },
      quick(10000));
}

TEST(MixedPrecisionPlan, TheNaiveDataParallelIsRefusedNamingWhy) {
  TrainPlan plan = TrainPlan::data_parallel(2);
  plan.dp_strategy = DpStrategy::naive;
  plan.precision = nn::MixedPrecision::parse("bf16");
  expect_error([&] { plan.validate(2); }, "the naive DataParallel keeps f32");
  for (DpStrategy dp : {DpStrategy::zero1, DpStrategy::zero2, DpStrategy::fsdp}) {
    plan = TrainPlan::data_parallel(2, 1);
    plan.dp_strategy = dp;
    plan.precision = nn::MixedPrecision::parse("bf16");
    EXPECT_NO_THROW(plan.validate(2));
  }
}

TEST(MixedPrecisionPlan, AModelOfAnotherDtypeIsRefused) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        nn::GPT model(config(DType::f32), kSeed);
        TrainPlan plan = TrainPlan::data_parallel(2);
        plan.precision = nn::MixedPrecision::parse("bf16");
        expect_error([&] { Trainer trainer(model, ctx, plan, parity_adamw()); },
                     "build the model with GPTConfig::param_dtype bf16");
      },
      quick(10000));
}

}  // namespace
}  // namespace sl::parallel
