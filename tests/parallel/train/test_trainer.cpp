// test_trainer.cpp — parallel::Trainer, the step `train` takes for every layout, against an
// independent serial run (its own nn::GPT and nn::AdamW over the whole batch in one backward), for
// every layout it supports: naive DP, DDP, ZeRO-1, ZeRO-2, ZeRO-3 (FSDP) and HSDP, each also with
// gradient accumulation over micro-batches; and the plans it must refuse before communicating.
//
// What makes the comparison able to fail:
//   * lr 1e-2 with no warm-up and weight decay 0.1: a lost or misplaced decay moves the weights by
//     lr·wd·p = 1e-3·p per step, a hundred times the tolerance on LayerNorm's weights of 1;
//   * a loss-masked stream where every row counts a different number of targets, so the ranks and
//     the micro-batches hold unequal counts: averaging their mean losses (instead of weighting each
//     by its share of the counted targets) gives a different gradient;
//   * the gradients themselves are compared, not only the weights: Adam divides by sqrt(v), so a
//     gradient off by a constant factor (divided by the world size twice) moves the weights almost
//     as the right one would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/train/trainer.h"
#include "tests/support/compare.h"
#include "tests/support/parallel.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using test_support::at;
using test_support::expect_close;
using test_support::state_of;

constexpr int64_t kBatch = 12;  // rows: divisible by 2, 3 and 4
constexpr int kSteps = 5;
constexpr double kLr = 1e-2;
constexpr test_support::Tolerance kTol{.atol = 1e-5, .rtol = 1.3e-6};  // every element, every loss
constexpr uint64_t kSeed = 11;

nn::GPTConfig config() { return nn::GPTConfig{32, 8, 2, 2, 16, 0.0}; }

// eps 1e-6, not 1e-8: the attention key bias's gradient is 0 in exact arithmetic, float noise of
// ~1e-11 in practice; at lr 1e-2 Adam turns that noise into an update of lr·noise/eps, which with
// eps 1e-8 differs between summation orders by more than the tolerance.
nn::AdamWOptions adamw_options() {
  nn::AdamWOptions options;
  options.lr = kLr;
  options.weight_decay = 0.1;
  options.eps = 1e-6;
  return options;
}

// Target i counts when i % 8 < 1 + (i / 8) % 5: every 8 consecutive targets count between 1 and 5,
// so each row of 8 holds a different, never zero, number of counted targets.
const nn::TokenStream& masked_tokens() {
  static const nn::TokenStream stream = [] {
    nn::TokenStream s;
    s.vocab_size = 32;
    for (int i = 0; i < 600; ++i) {
      s.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
      s.loss_mask.push_back(i % 8 < 1 + (i / 8) % 5 ? 1 : 0);
    }
    return s;
  }();
  return stream;
}

int64_t counted_targets(const nn::Batch& batch) {
  int64_t count = 0;
  for (double target : batch.targets.to_vector()) count += target != kDefaultIgnoreIndex;
  return count;
}

// The serial reference (tests/support/serial_run.h): the whole batch in one backward, its loss the
// mean over the counted targets; each layout's own clip, when the case clips.
test_support::SerialRun run_serial(double grad_clip) {
  return test_support::serial_run(
      {.config = config(), .seed = kSeed, .adamw = adamw_options(), .steps = kSteps, .clip = grad_clip},
      [](int s) { return masked_tokens().get_batch(s, kBatch, config().block_size); });
}

struct TrainerCase {
  TrainPlan plan;
  int world;
  double grad_clip;  // 0: none
};

void PrintTo(const TrainerCase& c, std::ostream* out) {  // gtest shows this, not the struct's bytes
  *out << c.plan.name() << " world " << c.world << " clip " << c.grad_clip;
}

std::string case_name(const testing::TestParamInfo<TrainerCase>& info) {
  const TrainerCase& c = info.param;
  std::string name = c.plan.name() + "_world" + std::to_string(c.world);
  if (c.grad_clip > 0) name += "_clip";
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

TrainPlan with_micro_batches(TrainPlan plan, int micro_batches) {
  plan.micro_batches = micro_batches;
  return plan;
}

TrainPlan naive_plan(int world) {
  TrainPlan plan = TrainPlan::data_parallel(world);
  plan.dp_strategy = DpStrategy::naive;
  return plan;
}

std::vector<TrainerCase> trainer_cases() {
  std::vector<TrainerCase> cases;
  for (int world : {2, 3}) {
    cases.push_back({naive_plan(world), world, 0});
    for (int zero : {0, 1, 2, 3}) cases.push_back({TrainPlan::data_parallel(world, zero), world, 0});
  }
  cases.push_back({TrainPlan::data_parallel(4), 4, 0});
  const TrainPlan hsdp{.parallelism = {.dp_replicate = 2, .dp_shard = 2}, .dp_strategy = DpStrategy::fsdp};
  cases.push_back({hsdp, 4, 0});
  // Clipping at 0.05 scales every step's gradient (their norms are ~0.3-1): each layout's own clip.
  cases.push_back({naive_plan(2), 2, 0.05});
  cases.push_back({TrainPlan::data_parallel(2), 2, 0.05});
  cases.push_back({TrainPlan::data_parallel(3, 2), 3, 0.05});
  cases.push_back({TrainPlan::data_parallel(2, 3), 2, 0.05});
  // Gradient accumulation: 12 rows = rows x micro-batches x dp, and the micro-batches count
  // different numbers of targets.
  cases.push_back({with_micro_batches(TrainPlan::data_parallel(2), 3), 2, 0});
  cases.push_back({with_micro_batches(TrainPlan::data_parallel(4), 3), 4, 0.05});
  cases.push_back({with_micro_batches(TrainPlan::data_parallel(3, 1), 2), 3, 0});
  cases.push_back({with_micro_batches(TrainPlan::data_parallel(2, 2), 2), 2, 0.05});
  cases.push_back({with_micro_batches(TrainPlan::data_parallel(2, 3), 3), 2, 0});
  cases.push_back({with_micro_batches(hsdp, 3), 4, 0});
  return cases;
}

class TrainerTest : public testing::TestWithParam<TrainerCase> {};

TEST_P(TrainerTest, MatchesSerialWithUnequalCountsPerRank) {
  const TrainerCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  const test_support::SerialRun serial = run_serial(c.grad_clip);

  // The point of the stream: in step 0 the ranks' rows hold different numbers of counted targets.
  std::set<int64_t> counts;
  for (int r = 0; r < c.world; ++r) {
    RowRange rows = data_parallel_rows(kBatch, r, c.world);
    counts.insert(counted_targets(masked_tokens().get_batch(0, kBatch, config().block_size, rows.begin, rows.end)));
  }
  ASSERT_GT(counts.size(), 1u) << "every rank counts the same number of targets: the weighting goes untested";
  if (c.plan.micro_batches > 1) {  // and so do one rank's micro-batches
    std::set<int64_t> micro_counts;
    RowRange rows = data_parallel_rows(kBatch, 0, c.world);
    for (const auto& m : masked_tokens().micro_batches(0, kBatch, config().block_size, c.plan.micro_batches,
                                                       rows.begin, rows.end))
      micro_counts.insert(m.counted);
    ASSERT_GT(micro_counts.size(), 1u) << "rank 0's micro-batches count the same number of targets";
  }

  launch(
      c.world,
      [&](RankContext& ctx) {
        Trainer trainer(ctx, c.plan, parallelize(config(), kSeed, ctx.world, c.plan.parallelize_options(adamw_options())));
        trainer.keep_gradients();
        for (int s = 0; s < kSteps; ++s) {
          double loss = trainer.train_step(masked_tokens(), s, kBatch, config().block_size, kLr, c.grad_clip);
          const test_support::SerialStep& want = serial.steps[s];
          EXPECT_NEAR(loss, want.loss, kTol.bound(want.loss)) << "step " << s;
          expect_close(trainer.full_gradients(), state_of(want.grads), kTol, at("gradient", ctx.rank, s));
          expect_close(trainer.full_state_dict(), state_of(want.params), kTol, at("parameter", ctx.rank, s));
        }
      },
      quick(30000));
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainerTest, testing::ValuesIn(trainer_cases()), case_name);

// Plans that cannot run are refused by validate(), which the constructor calls before the mesh is
// built: no rank communicates, so no rank can hang on a peer that threw.
TEST(TrainPlan, InvalidPlansNameTheirValues) {
  auto plan = [](ParallelismConfig p, int zero) { return TrainPlan{.parallelism = p, .dp_strategy = zero_stage_strategy(zero)}; };
  expect_error([&] { plan({.dp_replicate = 2}, 0).validate(3); },
               "ParallelismConfig: world size 3 != dp_replicate 2 x dp_shard 1 x pp 1 x cp 1 x tp 1");
  plan({.pp = 2, .tp = 2}, 0).validate(4);  // the cuts combine (parallel/nd)
  expect_error([&] { plan({.dp_shard = 2, .pp = 2}, 2).validate(4); },
               "Trainer: dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 1: ZeRO-2 (--zero 2) with pp 2: the first "
               "stage's wte and the last stage's tied copy sit at different offsets of their stages' gradient shards");
  plan({.dp_shard = 2, .tp = 2}, 2).validate(4);                     // ZeRO-2 over a tp cut
  plan({.dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 2}, 3).validate(16);  // the Accelerate guide's example
  // parallelize checks the layout before any communication, and the Trainer refuses what was built
  // for another plan.
  launch(2, [&](RankContext& ctx) {
    expect_error([&] { parallelize(config(), kSeed, ctx.world, plan({.dp_shard = 2}, 0).parallelize_options()); },
                 "Trainer: DDP replicates: dp_shard 2 needs --zero 1, 2 or 3");
    expect_error(
        [&] {
          Trainer(ctx, plan({.pp = 2}, 0),
                  parallelize(config(), kSeed, ctx.world, plan({.dp_replicate = 2}, 0).parallelize_options()));
        },
        "Trainer: the plan is dp_replicate 1 x dp_shard 1 x pp 2 x cp 1 x tp 1 but the parts were built for "
        "dp_replicate 2 x dp_shard 1 x pp 1 x cp 1 x tp 1");
  });
  expect_error([&] { plan({.dp_shard = 2}, 0).validate(2); }, "Trainer: DDP replicates: dp_shard 2 needs --zero 1, 2 or 3");
  expect_error([&] { plan({.dp_replicate = 2, .dp_shard = 2}, 2).validate(4); },
               "--zero 2 cannot be combined with dp_replicate 2");
  expect_error([&] { plan({.dp_shard = 2}, 4).validate(2); }, "--zero must be 0 (DDP), 1, 2 or 3 (got 4)");
  TrainPlan offload_hsdp = plan({.dp_replicate = 2, .dp_shard = 2}, 3);
  offload_hsdp.offload = true;
  expect_error([&] { offload_hsdp.validate(4); }, "HSDP (dp_replicate 2) cannot be combined with --offload");
  TrainPlan naive_micro = naive_plan(2);
  naive_micro.micro_batches = 2;
  expect_error([&] { naive_micro.validate(2); }, "--micro-batches must be 1 (got 2)");
  TrainPlan none = TrainPlan::data_parallel(2);
  none.micro_batches = 0;
  expect_error([&] { none.validate(2); }, "--micro-batches must be >= 1 (got 0)");
}

// The batch arithmetic is checked per step, before the counts' all-reduce: every rank throws alike.
TEST(TrainPlan, ABatchThatDoesNotDivideShowsTheArithmetic) {
  launch(
      2,
      [&](RankContext& ctx) {
        const TrainPlan plan = with_micro_batches(TrainPlan::data_parallel(2), 4);
        Trainer trainer(ctx, plan, parallelize(config(), kSeed, ctx.world, plan.parallelize_options(adamw_options())));
        expect_error([&] { trainer.train_step(masked_tokens(), 0, 12, config().block_size, kLr, 0); },
                     "Trainer: the global batch of 12 rows must be micro-batch rows x 4 micro-batches x dp_replicate "
                     "2 x dp_shard 1 (the pp, tp and cp ranks of a replica share its rows), but 12 % 8 = 4");
      },
      quick(30000));
}

}  // namespace
}  // namespace sl::parallel
