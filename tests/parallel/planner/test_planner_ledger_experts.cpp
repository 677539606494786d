// test_planner_ledger_experts.cpp — the planner's cost model (parallel/planner/cost_model.h) against the
// ledgers of real expert-parallel training steps, as test_planner_ledger.cpp does for dense layouts:
// for every layout below the trainer runs a small MoE GPT on thread ranks, and on every rank, around
// its second optimizer step,
//   * each group's calls, bytes sent and bytes received per op equal estimate_traffic's exactly: the
//     ep group's four all-to-alls per MoE layer and micro-batch, the routing's all-gather, DDP's
//     buckets (the experts' over expert_dp_cp), ZeRO's reduce-scatters and gathers over dp_shard x ep
//     and the experts' one all-reduce per tensor, tp's and pp's own traffic;
//   * weights, grads and optimizer held after the step equal estimate_memory's exactly (the experts
//     whole on every tp rank and, under ZeRO, outside its shards).
// Every token picks every expert (k = E, dropless), so the load is exactly uniform: each exchange is
// the tokens·k·C·4·(ep-1)/ep bytes the model counts for a uniform load, whatever the router learns.
// Activations are left out: the dense suite holds the activation model to the measured peak.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/planner/cost_model.h"
#include "parallel/train/trainer.h"
#include "tensor/ledger.h"
#include "tests/support/planner_ledger.h"
#include "tests/support/trainer.h"

namespace sl::parallel::planner {
namespace {

constexpr int64_t kBatch = 8, kT = 16;  // rows: split over dp x ep 2 or 4 and 2 micro-batches
constexpr uint64_t kSeed = 7;

struct ExpertLedgerCase {
  std::string name;
  TrainPlan plan;
  int world() const { return plan.parallelism.world_size(); }
};
void PrintTo(const ExpertLedgerCase& c, std::ostream* out) { *out << c.name; }

// 4 layers of C 32, the second and fourth MoE (moe_every 2): 4 experts, each token runs all 4.
nn::GPTConfig moe_config() {
  nn::GPTConfig config{.vocab_size = 64, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 32};
  config.moe_experts = 4;
  config.moe_top_k = 4;
  config.moe_every = 2;
  return config;
}

const nn::TokenStream& tokens() {
  static const nn::TokenStream stream = [] {
    nn::TokenStream s;
    s.vocab_size = 64;
    for (int i = 0; i < 2000; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 13) % 64);
    return s;
  }();
  return stream;
}

// The term the model leaves out (above): one micro-batch's [b, T, C] f32 on the last stage of ep x pp.
class PlannerLedgerExperts : public testing::TestWithParam<ExpertLedgerCase> {};

TEST_P(PlannerLedgerExperts, CostModelMatchesTheLedgers) {
  const ExpertLedgerCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::GPTConfig config = moe_config();
  const BatchShape batch{kBatch, kT};
  launch(
      c.world(),
      [&](RankContext& ctx) {
        MemoryLedger& memory = MemoryLedger::instance();
        auto now = [&](MemoryCategory category) { return memory.current(ctx.device, category); };
        const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads),
                      o0 = now(MemoryCategory::optimizer);
        {
          std::unique_ptr<Trainer> trainer = make_plan_trainer(ctx, c.plan, config, kSeed, parity_adamw());
          trainer->train_step(tokens(), 0, kBatch, kT, 1e-3, 1.0);
          const std::vector<GroupTraffic> model = estimate_traffic(config, c.plan, batch, ctx.rank);  // shapes only
          const Counts before = snapshot(*trainer, model);
          trainer->train_step(tokens(), 1, kBatch, kT, 1e-3, 1.0);
          expect_traffic(before, snapshot(*trainer, model), model, ctx.rank, counted_as(*trainer, model));
          const MemoryEstimate m = estimate_memory(config, c.plan, batch, ctx.rank);
          EXPECT_EQ(now(MemoryCategory::weights) - w0, m.weights) << "rank " << ctx.rank << " weights";
          EXPECT_EQ(now(MemoryCategory::grads) - g0, m.grads) << "rank " << ctx.rank << " grads";
          EXPECT_EQ(now(MemoryCategory::optimizer) - o0, m.optimizer) << "rank " << ctx.rank << " optimizer";
        }
      },
      quick(30000));
}

TrainPlan plan(ParallelismConfig parallelism, DpStrategy dp = DpStrategy::ddp, int micro = 1) {
  TrainPlan p;
  p.parallelism = parallelism;
  p.dp_strategy = dp;
  p.micro_batches = micro;
  return p;
}

std::vector<ExpertLedgerCase> cases() {
  using D = DpStrategy;
  return {
      {"ep2", plan({.ep = 2})},
      {"ep2_ddp2", plan({.dp_replicate = 2, .ep = 2})},
      {"ep2_tp2", plan({.tp = 2, .ep = 2})},
      {"ep2_zero1_dp2", plan({.dp_shard = 2, .ep = 2}, D::zero1)},
      {"ep2_zero2_dp2_micro2", plan({.dp_shard = 2, .ep = 2}, D::zero2, 2)},
      {"ep2_fsdp2", plan({.dp_shard = 2, .ep = 2}, D::fsdp)},
      {"ep2_zero1_dp2_tp2", plan({.dp_shard = 2, .tp = 2, .ep = 2}, D::zero1)},
      {"ep2_pp2_micro2", plan({.pp = 2, .ep = 2}, D::ddp, 2)},
      {"ep2_cp2", plan({.cp = 2, .ep = 2})},
      {"ep2_hsdp2", plan({.dp_replicate = 2, .ep = 2}, D::fsdp)},
  };
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlannerLedgerExperts, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<ExpertLedgerCase>& info) { return info.param.name; });

}  // namespace
}  // namespace sl::parallel::planner
