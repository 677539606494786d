// test_divergence_experts.cpp — the divergence finder on mixtures of experts (parallel/train/divergence.h):
// the serial shapes and the checkpoint's pieces know the router and the experts (each expert saved
// once, by the ep rank holding it), 3 steps of MoE serially and under --ep report nothing, and the
// faults inside the expert-parallel layer (parallel/runner/fault_sites.h) are named where they act:
//
//   scale-grad on an expert     that expert's gradient, on the ep rank holding it
//   local-capacity              lesson 17's --break-local-capacity: h.N.mlp's output at the step
//   detached-weights            lesson 17's --break-detached-weights: the router's gradient
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/divergence.h"
#include "parallel/train/plan_of_options.h"
#include "parallel/train/train_run.h"
#include "parallel/train/trainer.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

// The small GPT of test_divergence.cpp with 4 experts, top-2, in every block; 3 steps unless told.
TrainOptions moe_options(int ep, int dp, double capacity_factor = 0, int64_t steps = 3) {
  TrainOptions o;
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 16;
  o.batch_size = 8, o.steps = steps, o.warmup_steps = 0, o.lr = 1e-2;
  o.moe_experts = 4, o.moe_top_k = 2, o.moe_capacity_factor = capacity_factor;
  o.ep = ep, o.dp = dp;
  o.resolve();
  o.validate();
  return o;
}

DivergenceReport find(const TrainOptions& o, const std::vector<std::string>& faults = {}) {
  TrainRun run;
  prepare_run(run, o, /*writer=*/false);
  std::vector<ProbeFault> planted;
  for (const std::string& f : faults) planted.push_back(parse_probe_fault(f));
  return find_divergence(run, planted);
}

// The first divergence is at (step, phase, name) and its ranks are exactly `ranks`.
void expect_first(const DivergenceReport& report, int step, const std::string& phase, const std::string& name,
                  const std::set<int>& ranks) {
  const Comparison* first = report.first();
  ASSERT_NE(first, nullptr) << "nothing diverged; faults: " << report.faults.at(0);
  EXPECT_EQ(first->step, step) << first_divergence_text(report);
  EXPECT_EQ(first->phase, phase) << first_divergence_text(report);
  EXPECT_EQ(first->name, name) << first_divergence_text(report);
  std::set<int> named;
  for (const Comparison* c : report.at_same_place(*first)) named.insert(c->rank);
  EXPECT_EQ(named, ranks) << first_divergence_text(report);
}

TEST(DivergenceExperts, SerialShapesHoldTheRouterAndExpertsOfTheMoEBlocksOnly) {
  nn::GPTConfig config;
  config.n_layer = 2, config.n_embd = 16, config.vocab_size = 32, config.block_size = 8;
  config.moe_experts = 3, config.moe_every = 2;  // block 1 only
  const std::map<std::string, Shape> shapes = serial_parameter_shapes(config);
  EXPECT_EQ(shapes.at("h.1.mlp.router.weight"), Shape({3, 16}));
  EXPECT_EQ(shapes.at("h.1.mlp.experts.2.c_fc.weight"), Shape({64, 16}));
  EXPECT_EQ(shapes.at("h.1.mlp.experts.0.c_proj.bias"), Shape({16}));
  EXPECT_EQ(shapes.count("h.1.mlp.experts.3.c_fc.weight"), 0u);
  EXPECT_EQ(shapes.count("h.1.mlp.c_fc.weight"), 0u);
  EXPECT_EQ(shapes.count("h.0.mlp.router.weight"), 0u);
  EXPECT_EQ(shapes.at("h.0.mlp.c_fc.weight"), Shape({64, 16}));
}

// Under ep 2 x dp 2 every tensor's elements are owned once: an expert by the ep rank holding it on
// the first data-parallel replica (experts 0, 1 on ep 0; 2, 3 on ep 1), the router by rank 0.
TEST(DivergenceExperts, EachExpertIsSavedOnceByItsEpRank) {
  SL_SKIP_UNLESS_WORLD(4);
  TrainRun run;
  prepare_run(run, moe_options(2, 2), /*writer=*/false);
  const TrainPlan plan = plan_of_options(run.o, run.precision);
  std::mutex mutex;
  std::map<std::string, std::vector<int>> owners;  // weight -> the ranks owning a piece of it
  launch(4, [&](RankContext& ctx) {
    Trainer trainer(ctx, plan, parallelize(run.config, run.o.seed, ctx.world, plan.parallelize_options(adamw_of_options(run.o)), run.initial));
    for (const StatePiece& piece : state_pieces(trainer, run.config)) {
      if (!piece.owner) continue;
      const std::lock_guard<std::mutex> lock(mutex);
      owners[piece.tensor].push_back(ctx.rank);
    }
  });
  // ranks: d·2 + ep rank (ep innermost)
  EXPECT_EQ(owners.at("h.0.mlp.experts.1.c_fc.weight"), std::vector<int>{0});
  EXPECT_EQ(owners.at("h.1.mlp.experts.3.c_proj.bias"), std::vector<int>{1});
  EXPECT_EQ(owners.at("exp_avg.h.1.mlp.experts.2.c_fc.weight"), std::vector<int>{1});
  EXPECT_EQ(owners.at("h.0.mlp.router.weight"), std::vector<int>{0});
  EXPECT_EQ(owners.at("h.0.attn.c_attn.weight"), std::vector<int>{0});
}

struct MoELayout {
  std::string name;
  int ep = 1, dp = 1;
  double capacity_factor = 0;
  int64_t steps = 3;
};

class NoFalseAlarmWithExperts : public testing::TestWithParam<MoELayout> {};

TEST_P(NoFalseAlarmWithExperts, ThreeStepsWithinTheBounds) {
  const MoELayout l = GetParam();
  SL_SKIP_UNLESS_WORLD(l.ep * l.dp);
  const DivergenceReport report = find(moe_options(l.ep, l.dp, l.capacity_factor, l.steps));
  EXPECT_EQ(report.first(), nullptr) << first_divergence_text(report);
  EXPECT_TRUE(report.uncompared.empty()) << report.uncompared.front();
  EXPECT_GT(report.rows.size(), 300u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, NoFalseAlarmWithExperts,
                         testing::Values(MoELayout{.name = "serial"}, MoELayout{.name = "serial_capacity", .capacity_factor = 1.25},
                                         MoELayout{.name = "ep2", .ep = 2}, MoELayout{.name = "ep2_dp2", .ep = 2, .dp = 2},
                                         MoELayout{.name = "ep4", .ep = 4},
                                         MoELayout{.name = "ep2_capacity", .ep = 2, .capacity_factor = 1},
                                         // an expert computes no row at step 1: AdamW skips it and its step
                                         // count lags the others'; the serial runs take the lagging count
                                         // (with the common one, its update at step 6 is off its bound)
                                         MoELayout{.name = "ep2_dp2_expert_skipped", .ep = 2, .dp = 2, .capacity_factor = 1, .steps = 8}),
                         [](const testing::TestParamInfo<MoELayout>& info) { return info.param.name; });

TEST(DivergenceExperts, NamesAnExpertsGradientOnTheEpRankHoldingIt) {
  SL_SKIP_UNLESS_WORLD(4);
  expect_first(find(moe_options(2, 1), {"scale-grad h.0.mlp.experts.3.c_fc.weight ep=1 step=1 x2"}), 1, "backward",
               "h.0.mlp.experts.3.c_fc.weight", {1});
  // ranks 1 and 3 hold experts 2 and 3; rank 3 is dp_replicate 1's
  expect_first(find(moe_options(2, 2), {"scale-grad h.1.mlp.experts.2.c_proj.weight ep=1 dp_replicate=1 step=2 x2"}), 2,
               "backward", "h.1.mlp.experts.2.c_proj.weight", {3});
}

// Capacity ceil(1 · 64 · 2 / 4) = 32 per rank instead of 64 for the batch: rows the serial model keeps
// are dropped on the ranks where one expert is over its share; their h.0.mlp leaves the serial one.
TEST(DivergenceExperts, NamesACapacityCountedPerRankAtTheMoEOutput) {
  SL_SKIP_UNLESS_WORLD(2);
  expect_first(find(moe_options(2, 1, 1.0), {"local-capacity h.0.mlp step=0"}), 0, "forward", "h.0.mlp", {0, 1});
  // dropless: no capacity to count, nothing changes
  EXPECT_EQ(find(moe_options(2, 1), {"local-capacity h.0.mlp step=0"}).first(), nullptr);
}

// The outputs are the same; the router's gradient keeps only the auxiliary losses' part, on both ranks.
TEST(DivergenceExperts, NamesDetachedCombineWeightsAtTheRoutersGradient) {
  SL_SKIP_UNLESS_WORLD(2);
  expect_first(find(moe_options(2, 1), {"detached-weights h.0.mlp step=0"}), 0, "backward", "h.0.mlp.router.weight",
               {0, 1});
}

TEST(DivergenceExperts, ReadsTheExpertFaultsFromTheirWords) {
  using Kind = ProbeFault::Kind;
  const ProbeFault c = parse_probe_fault("local-capacity h.0.mlp step=0");
  EXPECT_EQ(c.kind, Kind::local_capacity);
  EXPECT_TRUE(c.acts_at_site());
  EXPECT_EQ(c.str(), "local_capacity h.0.mlp at step 0");
  EXPECT_EQ(parse_probe_fault("detached-weights h.1.mlp ep=1").kind, Kind::detached_weights);
  expect_error([] { parse_probe_fault("local-capacity h.0.attn"); }, "its module is h.N.mlp, got 'h.0.attn'");
  expect_error([] { parse_probe_fault("local-capacity h.0.mlp ep=1"); }, "it takes no DIM=K");
  expect_error([] { parse_probe_fault("detached-weights h.0 x2"); }, "cannot read 'x2'");
}

}  // namespace
}  // namespace sl::parallel
