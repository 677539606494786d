// test_expert_parallel_layouts.cpp — a mixture-of-experts GPT with its experts sharded over ep
// (parallel/expert_parallel/expert_parallel.h), built by parallelize and run by the Trainer, against
// an INDEPENDENT serial nn::GPT + nn::AdamW (lr 1e-2, weight decay 0.1): the loss of each of 3 steps,
// the gathered gradients of the last step (before its update), the strategy's gradient norm and the
// parameters after it, within the N-D suite's rtol 1e-5, atol 4e-5.
//
// The serial model routes one MoE batch per forward: here, micro-batch m of every batch rank (dp,
// ep included), in rank order (expert_parallel_runner.h), which the Trainer makes the serial run's
// micro-batch m. The reference forwards exactly those rows as one batch and weights its loss by their
// share of the step's counted targets: the serial model with gradient accumulation, not the layout
// at world 1. Capacity, drops and the aux loss are then the serial
// model's; a per-rank capacity or a per-rank aux loss fails here.
//
// The cut joins in: under tp the attention is split and the MoE replicated over it (each tp rank
// routes the same tokens); under pp each stage routes micro-batch m of every batch rank, and the
// first stage's aux loss reaches it only through the backward the last stage started (attach_loss).
//
// What makes it able to fail: a loss-masked stream (rows count unequal numbers of targets, so the
// aux loss's weight G_m/C differs from any rank's own), aux and z weights large enough to move the
// router, cases that drop tokens (asserted), cases where an expert computes no row in a step
// (asserted: serially it has no gradient and AdamW skips it, no weight decay), and gradients
// compared before Adam hides a scale.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/moe.h"
#include "parallel/comm/launch.h"
#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/train/trainer.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::at;
using test_support::expect_close;
using test_support::state_of;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8, kT = 8;
constexpr test_support::Tolerance kTol{.atol = 4e-5, .rtol = 1e-5};
constexpr uint64_t kSeed = 11;

struct EpLayout {
  std::string name;
  int ep = 2, dp = 1;  // dp: DDP replicas (dp_replicate), or ZeRO's dp_shard when zero > 0
  int64_t k = 2;
  double capacity_factor = 0;  // 0: dropless
  int micro_batches = 1;
  bool idle_expert = false;  // some expert computes no row in some step (asserted)
  int zero = 0;        // 0: DDP; 1, 2, 3: ZeRO-1/2, FSDP over dp_shard x ep, the experts over expert_dp_cp
  int tp = 1, pp = 1;  // the cut: attention over tp (the experts replicated over it), layers over pp stages
  int cp = 1;          // each rank the tokens of its sequence shard (zigzag), routed in the serial order
  int replicas = 1;    // HSDP (zero 3): FSDP over dp_shard = dp, all-reduced across this many replicas
  ScheduleKind schedule = ScheduleKind::one_f_one_b;  // pp
  CpVariant cp_variant = CpVariant::ring;
  int batch_ranks() const { return ep * dp * replicas; }
  int world() const { return batch_ranks() * tp * pp * cp; }
};
void PrintTo(const EpLayout& c, std::ostream* out) { *out << c.name; }
std::string layout_name(const testing::TestParamInfo<EpLayout>& info) { return info.param.name; }

// The parity AdamW with eps 1e-5: a gradient element far below eps moves its weight by far less
// than lr. An expert's hidden unit that GELU has switched off gets a gradient of rounding size
// (1e-9), which the layout and the serial run round differently; at eps 1e-6 Adam turned that
// into weights 4.7e-5 apart after 3 steps, past atol. Gradients of 1e-3 (a wrong scale) and the
// decay (a lost one) are untouched by eps.
nn::AdamWOptions moe_adamw() {
  nn::AdamWOptions adamw = parity_adamw();
  adamw.eps = 1e-5;
  return adamw;
}

nn::GPTConfig config_of(const EpLayout& c) {
  nn::GPTConfig config{.vocab_size = 31, .block_size = kT, .n_layer = 2, .n_head = 4, .n_embd = 16};
  config.moe_experts = 4;
  config.moe_top_k = c.k;
  config.moe_capacity_factor = c.capacity_factor;
  // k 1: softmax then top-k (the weight carries the router's gradient); k 2: Mixtral's order.
  config.moe_router = c.k == 1 ? nn::MoERouter::softmax_topk : nn::MoERouter::topk_softmax;
  config.moe_aux_weight = 0.1;  // large, so that an aux loss over the wrong tokens shows
  config.moe_z_weight = 0.01;
  return config;
}

// Targets count when i % 8 < 1 + (i / 8) % 5: rows and micro-batches count unequal numbers.
nn::TokenStream masked_tokens() {
  nn::TokenStream s;
  s.vocab_size = 31;
  for (int i = 0; i < 800; ++i) {
    s.tokens.push_back(static_cast<int32_t>((i * 7 + i / 5 + (i * i) % 11) % 31));
    s.loss_mask.push_back(i % 8 < 1 + (i / 8) % 5 ? 1 : 0);
  }
  return s;
}

// Step s's MoE batches: the serial run's micro-batches, rows m·B/M onwards (the Trainer gives each
// batch rank its slice of every one), weighted by their counted targets over the batch's.
std::vector<test_support::WeightedBatch> moe_batches(const nn::TokenStream& data, int step, const EpLayout& c) {
  const nn::Batch batch = data.get_batch(step, kBatch, kT);
  const int M = c.micro_batches;
  const int64_t rows = kBatch / M;
  const double total = static_cast<double>(nn::counted_targets(batch.targets));
  std::vector<test_support::WeightedBatch> out;
  for (int m = 0; m < M; ++m) {
    nn::Batch group{batch.inputs.narrow(0, m * rows, rows), batch.targets.narrow(0, m * rows, rows)};
    const double weight = M == 1 ? 1.0 : static_cast<double>(nn::counted_targets(group.targets)) / total;
    out.push_back({group, weight});
  }
  return out;
}

double norm_of(const nn::NamedTensors& grads) {
  double squares = 0;
  for (const auto& [name, g] : grads)
    for (double x : g.to_vector()) squares += x * x;
  return std::sqrt(squares);
}

TrainPlan plan_of(const EpLayout& c) {
  TrainPlan plan;
  plan.parallelism.ep = c.ep;
  if (c.zero == 0) {
    plan.parallelism.dp_replicate = c.dp;
  } else {
    plan.parallelism.dp_shard = c.dp;
    plan.parallelism.dp_replicate = c.replicas;
    plan.dp_strategy = zero_stage_strategy(c.zero);
  }
  plan.parallelism.tp = c.tp;
  plan.parallelism.pp = c.pp;
  plan.parallelism.cp = c.cp;
  plan.schedule = c.schedule;
  plan.cp_variant = c.cp_variant;
  plan.micro_batches = c.micro_batches;
  return plan;
}

class ExpertParallelLayouts : public testing::TestWithParam<EpLayout> {};

TEST_P(ExpertParallelLayouts, MatchesTheSerialMoEThroughTheTrainer) {
  const EpLayout c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::TokenStream data = masked_tokens();
  const nn::GPTConfig config = config_of(c);
  const test_support::SerialRun serial = test_support::serial_run_micro(
      {.config = config, .seed = kSeed, .adamw = moe_adamw(), .steps = kSteps},
      [&](int s) { return moe_batches(data, s, c); });
  const test_support::SerialStep& last_step = serial.steps.back();
  const TrainPlan plan = plan_of(c);
  std::vector<int64_t> dropped(static_cast<size_t>(c.world()), 0), idle(static_cast<size_t>(c.world()), 0);
  launch(c.world(), [&](RankContext& ctx) {
    std::unique_ptr<Trainer> trainer = make_plan_trainer(ctx, plan, config, kSeed, moe_adamw());  // train's path
    std::vector<std::pair<int64_t, ExpertParallelMoE*>> layers;  // this rank's MoE layers (a stage's under pp)
    if (c.pp == 1) {
      layers = expert_parallel_layers(dynamic_cast<nn::GPT&>(trainer->runner()->module()));
    } else {
      for (const auto& part : dynamic_cast<PipelineRunner&>(*trainer->runner()).stage().parts)
        for (const auto& layer : expert_parallel_layers(*part)) layers.push_back(layer);
    }
    ASSERT_EQ(layers.size(), 2u / c.pp);
    for (int s = 0; s < kSteps; ++s) {
      if (s == kSteps - 1) trainer->keep_gradients();
      const double loss = trainer->train_step(data, s, kBatch, kT, moe_adamw().lr, 1e30);  // the norm, no clip
      EXPECT_NEAR(loss, serial.steps[s].loss, kTol.bound(serial.steps[s].loss)) << "step " << s;
      for (const auto& [layer, moe] : layers) {
        dropped[static_cast<size_t>(ctx.rank)] += moe->stats().dropped();
        for (int64_t kept : moe->stats().kept) idle[static_cast<size_t>(ctx.rank)] += kept == 0 ? 1 : 0;
      }
    }
    expect_close(trainer->full_gradients(), state_of(last_step.grads), kTol, at("gradient", ctx.rank, kSteps - 1));
    EXPECT_NEAR(trainer->last_grad_norm(), norm_of(last_step.grads), 1e-5 * norm_of(last_step.grads))
        << "gradient norm on rank " << ctx.rank;
    expect_close(trainer->full_state_dict(), state_of(last_step.params), kTol, at("parameter", ctx.rank, kSteps - 1));
  });
  for (int64_t d : dropped) {
    if (c.capacity_factor > 0) {
      EXPECT_GT(d, 0) << "this case must drop tokens";
    } else {
      EXPECT_EQ(d, 0);
    }
  }
  if (c.idle_expert) {
    for (int64_t i : idle) EXPECT_GT(i, 0) << "this case must leave an expert without rows in a step";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExpertParallelLayouts,
    testing::Values(EpLayout{.name = "ep2_k1", .ep = 2, .k = 1},
                    EpLayout{.name = "ep2_k2", .ep = 2, .k = 2},
                    EpLayout{.name = "ep2_k1_drops", .ep = 2, .k = 1, .capacity_factor = 1.0},
                    EpLayout{.name = "ep2_k2_drops", .ep = 2, .k = 2, .capacity_factor = 1.0},
                    EpLayout{.name = "ep4_k1_drops", .ep = 4, .k = 1, .capacity_factor = 1.0},
                    EpLayout{.name = "ep4_k2", .ep = 4, .k = 2},
                    EpLayout{.name = "ep2_dp2_k1", .ep = 2, .dp = 2, .k = 1, .idle_expert = true},
                    EpLayout{.name = "ep2_dp2_k1_drops", .ep = 2, .dp = 2, .k = 1, .capacity_factor = 1.0,
                             .idle_expert = true},
                    EpLayout{.name = "ep2_dp2_k2", .ep = 2, .dp = 2, .k = 2},
                    EpLayout{.name = "ep2_dp2_k2_drops_mb2", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2},
                    EpLayout{.name = "ep2_zero1_k2", .ep = 2, .k = 2, .zero = 1},
                    EpLayout{.name = "ep2_dp2_zero1_k1", .ep = 2, .dp = 2, .k = 1, .idle_expert = true, .zero = 1},
                    EpLayout{.name = "ep2_dp2_zero1_k2_drops", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .zero = 1},
                    EpLayout{.name = "ep2_dp2_zero2_k1_drops", .ep = 2, .dp = 2, .k = 1, .capacity_factor = 1.0,
                             .idle_expert = true, .zero = 2},
                    EpLayout{.name = "ep2_dp2_zero2_k2", .ep = 2, .dp = 2, .k = 2, .zero = 2},
                    EpLayout{.name = "ep2_dp2_zero2_k2_drops_mb2", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .zero = 2},
                    EpLayout{.name = "ep2_fsdp_k2_drops", .ep = 2, .k = 2, .capacity_factor = 1.0, .zero = 3},
                    EpLayout{.name = "ep2_dp2_fsdp_k1_drops", .ep = 2, .dp = 2, .k = 1, .capacity_factor = 1.0,
                             .idle_expert = true, .zero = 3},
                    EpLayout{.name = "ep2_dp2_fsdp_k2", .ep = 2, .dp = 2, .k = 2, .zero = 3},
                    EpLayout{.name = "ep2_dp2_fsdp_k2_drops_mb2", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .zero = 3},
                    // ep x tp: the attention split, the MoE replicated over tp; ep x pp: a stage's MoE
                    // blocks, the first stage's aux loss reaching it through the backward.
                    EpLayout{.name = "ep2_tp2_k2", .ep = 2, .k = 2, .tp = 2},
                    EpLayout{.name = "ep2_tp2_k1_drops", .ep = 2, .k = 1, .capacity_factor = 1.0, .tp = 2},
                    EpLayout{.name = "ep2_dp2_tp2_k2_drops_mb2", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .tp = 2},
                    EpLayout{.name = "ep2_tp2_zero1_k1_drops", .ep = 2, .k = 1, .capacity_factor = 1.0, .zero = 1,
                             .tp = 2},
                    EpLayout{.name = "ep2_tp2_fsdp_k2", .ep = 2, .k = 2, .zero = 3, .tp = 2},
                    EpLayout{.name = "ep2_pp2_k2_mb2", .ep = 2, .k = 2, .micro_batches = 2, .pp = 2},
                    EpLayout{.name = "ep2_pp2_k1_drops_mb2", .ep = 2, .k = 1, .capacity_factor = 1.0,
                             .micro_batches = 2, .pp = 2},
                    EpLayout{.name = "ep2_pp2_k2_drops", .ep = 2, .k = 2, .capacity_factor = 1.0, .pp = 2},
                    EpLayout{.name = "ep2_pp2_tp2_k2_drops_mb2", .ep = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .tp = 2, .pp = 2},
                    EpLayout{.name = "ep4_pp2_k1_mb2", .ep = 4, .k = 1, .micro_batches = 2, .pp = 2},
                    // zero-bubble: the aux part's gradient reaches the router's weights in W, not B
                    EpLayout{.name = "ep2_pp2_cp2_zb_k2_drops_mb2", .ep = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .pp = 2, .cp = 2, .schedule = ScheduleKind::zero_bubble},
                    // ep x cp: the MoE batch gathers every sequence shard's tokens; capacity keeps them in
                    // the serial order (row by row, position by position), not the ranks'.
                    EpLayout{.name = "ep2_cp2_k2", .ep = 2, .k = 2, .cp = 2},
                    EpLayout{.name = "ep2_cp2_k1_drops", .ep = 2, .k = 1, .capacity_factor = 1.0, .cp = 2},
                    EpLayout{.name = "ep2_dp2_cp2_k2_drops_mb2", .ep = 2, .dp = 2, .k = 2, .capacity_factor = 1.0,
                             .micro_batches = 2, .cp = 2},
                    EpLayout{.name = "ep2_cp2_ulysses_k2_drops", .ep = 2, .k = 2, .capacity_factor = 1.0, .cp = 2,
                             .cp_variant = CpVariant::ulysses},
                    EpLayout{.name = "ep2_tp2_cp2_k1_drops", .ep = 2, .k = 1, .capacity_factor = 1.0, .tp = 2, .cp = 2},
                    // HSDP: FSDP over dp_shard x ep within a replica, the replicas all-reduced
                    EpLayout{.name = "ep2_hsdp2x1_k2_drops", .ep = 2, .dp = 1, .k = 2, .capacity_factor = 1.0, .zero = 3,
                             .replicas = 2},
                    EpLayout{.name = "ep2_hsdp2x2_k1", .ep = 2, .dp = 2, .k = 1, .zero = 3, .replicas = 2}),
    layout_name);

}  // namespace
}  // namespace sl::parallel
