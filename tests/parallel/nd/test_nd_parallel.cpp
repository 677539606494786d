// test_nd_parallel.cpp — the GPT cut several ways at once (parallel/nd/parallelize.h: the pipeline's
// stages, each chunk cut over tp and cp), with dp around it, through parallel::Trainer, against an
// INDEPENDENT serial nn::GPT + nn::AdamW (lr 1e-2, weight decay 0.1, eps 1e-6): the loss of each of
// 3 steps, the gathered gradients of the last step (before its update) and the parameters after it,
// within rtol 1e-5, atol 4e-5, and the strategy's gradient norm over the mesh. One table of layouts,
// world <= 16: every pair of dp, pp, tp and cp, 3-way ones, CP zigzag under TP with SP, ZeRO-1 and
// clipping; then the Accelerate guide's FSDP / HSDP over tp, cp and pp (sharded over dp_shard x cp),
// ZeRO-2 over tp and cp, and two world-16 layouts. Then memory per rank and the refusals.
//
// What makes it able to fail:
//   * a loss-masked stream whose rows count unequal numbers of targets, so sequence shards and
//     micro-batches hold different counts (some cp ranks none at all): a wrong weight shows;
//   * a vocabulary of 31 (tp pads it), 4 heads, zigzag and contiguous shards, ring and all-gather;
//   * gradients compared, not only weights (Adam hides a constant factor), and clip cases, whose
//     norm counts every element once only if the placements are right.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "parallel/nd/parallelize.h"
#include "parallel/runner/part_runner.h"
#include "parallel/train/trainer.h"
#include "tensor/ledger.h"
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

struct NdCase {
  std::string name;
  int dp = 1, pp = 1, tp = 1, cp = 1;
  bool sp = false;
  // over dp: 0 DDP (dp_replicate), 1 ZeRO-1 / 2 ZeRO-2 (dp_shard), 3 FSDP over the cut (dp_shard x cp);
  // with replicate R > 1 and zero 3: HSDP, dp_replicate R x dp_shard dp
  int zero = 0;
  int replicate = 1;
  int micro_batches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::string balance = "zigzag", variant = "ring";
  int ulysses = 0;  // hybrid's U
  double clip = 0;
  int64_t n_layer = 2;
  int world() const { return replicate * dp * pp * tp * cp; }
};

void PrintTo(const NdCase& c, std::ostream* out) { *out << c.name; }
std::string case_name(const testing::TestParamInfo<NdCase>& info) { return info.param.name; }

nn::GPTConfig config_of(const NdCase& c) {
  return {.vocab_size = 31, .block_size = kT, .n_layer = c.n_layer, .n_head = 4, .n_embd = 16};
}

// Targets count when i % 8 < 1 + (i / 8) % 5: rows, micro-batches and sequence shards count unequal numbers.
nn::TokenStream masked_tokens() {
  nn::TokenStream s;
  s.vocab_size = 31;
  for (int i = 0; i < 800; ++i) {
    s.tokens.push_back(static_cast<int32_t>((i * 7 + i / 5 + (i * i) % 11) % 31));
    s.loss_mask.push_back(i % 8 < 1 + (i / 8) % 5 ? 1 : 0);
  }
  return s;
}

// The serial reference (tests/support/serial_run.h), clipped as the case clips.
test_support::SerialRun run_serial(const NdCase& c) {
  const nn::TokenStream data = masked_tokens();
  return test_support::serial_run(
      {.config = config_of(c), .seed = kSeed, .adamw = parity_adamw(), .steps = kSteps, .clip = c.clip},
      [&](int s) { return data.get_batch(s, kBatch, kT); });
}

// The norm of a step's gradients (before clipping), summed in double here.
double norm_of(const nn::NamedTensors& grads) {
  double squares = 0;
  for (const auto& [name, g] : grads)
    for (double x : g.to_vector()) squares += x * x;
  return std::sqrt(squares);
}

TrainPlan plan_of(const NdCase& c) {
  TrainPlan plan;
  plan.parallelism.pp = c.pp;
  plan.parallelism.tp = c.tp;
  plan.parallelism.cp = c.cp;
  if (c.zero == 0) plan.parallelism.dp_replicate = c.dp;
  else plan.parallelism.dp_shard = c.dp, plan.dp_strategy = zero_stage_strategy(c.zero);
  if (c.replicate > 1) plan.parallelism.dp_replicate = c.replicate;
  plan.micro_batches = c.micro_batches;
  plan.schedule = parse_schedule(c.schedule);
  plan.virtual_stages = c.virtual_stages;
  plan.sequence_parallel = c.sp;
  plan.cp_balance = parse_cp_balance(c.balance);
  plan.cp_variant = parse_cp_variant(c.variant);
  plan.ulysses_degree = c.ulysses;
  return plan;
}

class NdParallelParity : public testing::TestWithParam<NdCase> {};

TEST_P(NdParallelParity, MatchesSerialThroughTheTrainer) {
  const NdCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(c.world());
  const DeviceGuard on_device(test_device());  // SL_TEST_DEVICE=cuda: the serial run on cuda:0
  const test_support::SerialRun serial = run_serial(c);
  const test_support::SerialStep& last_step = serial.steps.back();  // its gradients are compared, before its update
  const nn::TokenStream data = masked_tokens();
  const TrainPlan plan = plan_of(c);
  const nn::GPTConfig config = config_of(c);
  check_model_cut(config, plan.parallelize_options(), plan.micro_batches);
  launch(
      c.world(),
      [&](RankContext& ctx) {
        std::unique_ptr<Trainer> owned = make_plan_trainer(ctx, plan, config, kSeed, parity_adamw());  // train's path
        Trainer& trainer = *owned;
        for (int s = 0; s < kSteps; ++s) {
          if (s == kSteps - 1) trainer.keep_gradients();
          // No clip: a max_norm no gradient reaches, so the strategy still computes the norm.
          const double clip = c.clip > 0 ? c.clip : 1e30;
          const double loss = trainer.train_step(data, s, kBatch, kT, parity_adamw().lr, clip);
          EXPECT_NEAR(loss, serial.steps[s].loss, kTol.bound(serial.steps[s].loss)) << "step " << s;
        }
        expect_close(trainer.full_gradients(), state_of(last_step.grads), kTol, at("gradient", ctx.rank, kSteps - 1));
        // The strategy's norm over the mesh (from .grad, or from the shards) counts every element
        // once only if the placements are right (AdamW alone is blind to a scale).
        EXPECT_NEAR(trainer.last_grad_norm(), norm_of(last_step.grads), 1e-5 * norm_of(last_step.grads))
            << "gradient norm on rank " << ctx.rank;
        expect_close(trainer.full_state_dict(), state_of(last_step.params), kTol,
                     at("parameter", ctx.rank, kSteps - 1));
      },
      on_test_device(quick(30000), c.world()));
}

std::vector<NdCase> cases() {
  std::vector<NdCase> out;
  auto add = [&](NdCase c) { out.push_back(std::move(c)); };
  // pairs
  add({.name = "dp2_pp2", .dp = 2, .pp = 2, .micro_batches = 2});
  add({.name = "dp2_tp2", .dp = 2, .tp = 2});
  add({.name = "dp2_cp2", .dp = 2, .cp = 2});
  add({.name = "pp2_tp2", .pp = 2, .tp = 2, .micro_batches = 2});
  add({.name = "pp2_cp2", .pp = 2, .cp = 2, .micro_batches = 2});
  add({.name = "tp2_cp2", .tp = 2, .cp = 2});
  add({.name = "tp2_sp_cp2_zigzag", .tp = 2, .cp = 2, .sp = true});
  add({.name = "pp2_tp2_sp", .pp = 2, .tp = 2, .sp = true, .micro_batches = 4});
  add({.name = "pp2_cp2_allgather_contiguous", .pp = 2, .cp = 2, .micro_batches = 2, .balance = "none",
       .variant = "allgather"});
  add({.name = "pp4_tp2_gpipe", .pp = 4, .tp = 2, .micro_batches = 4, .schedule = "gpipe", .n_layer = 4});
  // three and four ways
  add({.name = "dp2_pp2_tp2", .dp = 2, .pp = 2, .tp = 2, .micro_batches = 2});
  add({.name = "dp2_pp2_tp2_sp_zero1", .dp = 2, .pp = 2, .tp = 2, .sp = true, .zero = 1, .micro_batches = 2});
  add({.name = "dp2_pp2_cp2", .dp = 2, .pp = 2, .cp = 2, .micro_batches = 2});
  add({.name = "dp2_tp2_sp_cp2", .dp = 2, .tp = 2, .cp = 2, .sp = true});
  add({.name = "dp2_tp2_cp2_zero1_clip", .dp = 2, .tp = 2, .cp = 2, .zero = 1, .clip = 0.05});
  add({.name = "pp2_tp2_cp2", .pp = 2, .tp = 2, .cp = 2, .micro_batches = 2});
  add({.name = "pp2_tp2_sp_cp2_zigzag", .pp = 2, .tp = 2, .cp = 2, .sp = true, .micro_batches = 4});
  add({.name = "pp2v2_tp2_cp2_interleaved", .pp = 2, .tp = 2, .cp = 2, .micro_batches = 2, .schedule = "interleaved",
       .virtual_stages = 2, .n_layer = 4});
  // the clip counts every element once: the placements (sharded, replicated, tied) must be right
  add({.name = "dp2_pp2_tp2_clip", .dp = 2, .pp = 2, .tp = 2, .micro_batches = 2, .clip = 0.05});
  add({.name = "pp2_tp2_sp_cp2_clip", .pp = 2, .tp = 2, .cp = 2, .sp = true, .micro_batches = 2, .clip = 0.05});
  // FSDP with PP (torchtitan): each stage's chunk sharded over dp_shard, the tied wte's gradient
  // shards summed between the first and last stage, the clip counting the last stage's copy out
  add({.name = "pp2_fsdp2", .dp = 2, .pp = 2, .zero = 3, .micro_batches = 4});
  add({.name = "pp2_fsdp2_gpipe_clip", .dp = 2, .pp = 2, .zero = 3, .micro_batches = 2, .schedule = "gpipe",
       .clip = 0.05});
  add({.name = "pp3_fsdp2", .dp = 2, .pp = 3, .zero = 3, .micro_batches = 4, .n_layer = 4});
  // The Accelerate ND-parallel guide's sections: FSDP / HSDP over what TP, CP and PP leave on a rank,
  // sharded over dp_shard x cp (the cp ranks' gradient parts summed by the reduce-scatter), SP's
  // partial gradients and the tied wte summed on the shards
  add({.name = "fsdp2_tp2", .dp = 2, .tp = 2, .zero = 3});
  add({.name = "fsdp2_tp2_sp_clip", .dp = 2, .tp = 2, .sp = true, .zero = 3, .micro_batches = 2, .clip = 0.05});
  add({.name = "fsdp4_tp2", .dp = 4, .tp = 2, .zero = 3});
  add({.name = "fsdp2_cp2_zigzag", .dp = 2, .cp = 2, .zero = 3});
  add({.name = "fsdp2_cp2_allgather_clip", .dp = 2, .cp = 2, .zero = 3, .variant = "allgather", .clip = 0.05});
  add({.name = "hsdp2x2", .dp = 2, .zero = 3, .replicate = 2, .clip = 0.05});
  add({.name = "hsdp2x2_tp2_sp", .dp = 2, .tp = 2, .sp = true, .zero = 3, .replicate = 2});
  add({.name = "hsdp2x2_cp2_clip", .dp = 2, .cp = 2, .zero = 3, .replicate = 2, .clip = 0.05});
  add({.name = "hsdp2x2_pp2", .dp = 2, .pp = 2, .zero = 3, .replicate = 2, .micro_batches = 2});
  add({.name = "fsdp2_pp2_tp2", .dp = 2, .pp = 2, .tp = 2, .zero = 3, .micro_batches = 2});
  add({.name = "fsdp2_pp2_cp2_clip", .dp = 2, .pp = 2, .cp = 2, .zero = 3, .micro_batches = 2, .clip = 0.05});
  add({.name = "fsdp2_tp2_cp2", .dp = 2, .tp = 2, .cp = 2, .zero = 3});
  add({.name = "zero2_tp2_sp", .dp = 2, .tp = 2, .sp = true, .zero = 2, .micro_batches = 2});
  add({.name = "zero2_cp2_clip", .dp = 2, .cp = 2, .zero = 2, .clip = 0.05});
  add({.name = "zero2_tp2_cp2", .dp = 2, .tp = 2, .cp = 2, .zero = 2});
  // Ulysses (n_head 4 over cp·tp) and hybrid Ulysses × ring wherever the ring runs: dp, pp, tp with
  // SP, FSDP, and N-D
  add({.name = "dp2_cp2_ulysses", .dp = 2, .cp = 2, .variant = "ulysses"});
  add({.name = "pp2_cp2_ulysses_contiguous", .pp = 2, .cp = 2, .micro_batches = 2, .balance = "none",
       .variant = "ulysses"});
  add({.name = "tp2_sp_cp2_ulysses", .tp = 2, .cp = 2, .sp = true, .variant = "ulysses"});
  add({.name = "fsdp2_cp2_ulysses_clip", .dp = 2, .cp = 2, .zero = 3, .variant = "ulysses", .clip = 0.05});
  add({.name = "pp2_tp2_sp_cp2_ulysses", .pp = 2, .tp = 2, .cp = 2, .sp = true, .micro_batches = 2,
       .variant = "ulysses"});
  add({.name = "tp2_cp4_hybrid_u2", .tp = 2, .cp = 4, .variant = "hybrid", .ulysses = 2});
  add({.name = "dp2_cp4_hybrid_u2", .dp = 2, .cp = 4, .balance = "none", .variant = "hybrid", .ulysses = 2});
  // world 16: the guide's first example (dp_replicate 2, dp_shard 2, cp 2, tp 2), and one with pp
  add({.name = "world16_guide_hsdp2x2_cp2_tp2", .dp = 2, .tp = 2, .cp = 2, .zero = 3, .replicate = 2, .clip = 0.05});
  add({.name = "world16_fsdp2_pp2_tp2_sp_cp2", .dp = 2, .pp = 2, .tp = 2, .cp = 2, .sp = true, .zero = 3,
       .micro_batches = 2, .clip = 0.05});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, NdParallelParity, testing::ValuesIn(cases()), case_name);

// parallelize: one stage runs the plain micro-batch loop (PartRunner), several the pipeline's
// schedule; the loss is held on the last stage's tp rank 0, by every cp rank (its tokens' share).
TEST(NdParallel, ParallelizeRunsOneStageInTheLoopAndSeveralByTheSchedule) {
  SL_SKIP_UNLESS_WORLD(4);
  for (const NdCase& c : {NdCase{.name = "pp2_cp2", .pp = 2, .cp = 2}, NdCase{.name = "tp2_cp2", .tp = 2, .cp = 2}})
    launch(
        4,
        [&](RankContext& ctx) {
          Parallelized parts = parallelize(config_of(c), kSeed, ctx.world, plan_of(c).parallelize_options());
          const DeviceMesh& mesh = *parts.mesh;
          if (c.pp > 1) {
            auto* pipeline = dynamic_cast<PipelineRunner*>(parts.runner.get());
            ASSERT_NE(pipeline, nullptr) << c.name;
            EXPECT_EQ(pipeline->stage().holds_last(), mesh.pp_rank() == 1);
            EXPECT_EQ(pipeline->holds_loss(), mesh.pp_rank() == 1);
          } else {
            ASSERT_NE(dynamic_cast<PartRunner*>(parts.runner.get()), nullptr) << c.name;
            EXPECT_EQ(parts.runner->holds_loss(), mesh.tp_rank() == 0);
          }
        },
        quick(10000));
}

// train --init-from: each rank takes its slice of the serial weights (the last stage's tied wte
// copy too: its vocabulary rows), and the gather gives them back whole.
TEST(NdParallel, LoadsTheSerialWeightsAndGathersThemBack) {
  SL_SKIP_UNLESS_WORLD(8);
  const NdCase c{.name = "pp2_tp2_sp_cp2", .pp = 2, .tp = 2, .cp = 2, .sp = true, .micro_batches = 2};
  nn::GPT other(config_of(c), kSeed + 1);  // not the runner's seed: every value must come from the load
  const nn::StateDict serial = other.state_dict();
  launch(
      8,
      [&](RankContext& ctx) {
        Parallelized parts = parallelize(config_of(c), kSeed, ctx.world, plan_of(c).parallelize_options(), serial);
        const DeviceMesh& mesh = *parts.mesh;
        ModelRunner* runner = parts.runner.get();
        expect_close(runner->full_state_dict(), serial, kTol, at("loaded parameter", ctx.rank));
        if (mesh.pp_rank() == 1) {  // the head's copy of wte holds this tp rank's rows of the serial wte
          Tensor copy = runner->module().state_dict().at("wte.weight");
          const int64_t rows = copy.size(0), start = mesh.tp_rank() * rows;
          const int64_t real = std::min<int64_t>(rows, config_of(c).vocab_size - start);
          EXPECT_EQ(copy.narrow(0, 0, real).to_vector(), serial.at("wte.weight").narrow(0, start, real).to_vector());
        }
      },
      quick(10000));
}

// Bytes one rank holds after 2 steps of `c` through train's runner, beyond what it held before the
// Trainer was built: weights, gradients, optimizer state (the ledger), and its pp rank.
struct HeldModelStates {
  int64_t weights = 0, grads = 0, optimizer = 0;
  int stage = 0;
};
HeldModelStates held_after_two_steps(RankContext& ctx, const NdCase& c) {
  MemoryLedger& ledger = MemoryLedger::instance();
  auto now = [&](MemoryCategory cat) { return ledger.current(ctx.device, cat); };
  const int64_t weights0 = now(MemoryCategory::weights), grads0 = now(MemoryCategory::grads),
                optimizer0 = now(MemoryCategory::optimizer);
  const TrainPlan plan = plan_of(c);
  Trainer trainer(ctx, plan, parallelize(config_of(c), kSeed, ctx.world, plan.parallelize_options(parity_adamw())));
  const nn::TokenStream data = masked_tokens();
  for (int s = 0; s < 2; ++s) trainer.train_step(data, s, kBatch, kT, parity_adamw().lr, 0);
  return {now(MemoryCategory::weights) - weights0, now(MemoryCategory::grads) - grads0,
          now(MemoryCategory::optimizer) - optimizer0, trainer.mesh().pp_rank()};
}

// Elements of one rank's shard of FSDP units of these sizes over n ranks, each unit padded to a multiple of n.
int64_t shard_numel(const std::map<std::string, int64_t>& units, int64_t n) {
  int64_t shard = 0;
  for (const auto& [unit, numel] : units) shard += (numel + n - 1) / n;
  return shard;
}

// FSDP with pp: between steps a rank holds 1/dp_shard of its stage's weights, gradients and AdamW
// state (16 bytes per element, ZeRO-3's 16Ψ/N with Ψ the stage's), from the ledger. The stage's
// units are worked out here from a part built from the stage's layer range: wte alone, wpe or ln_f,
// one per block, each padded to a multiple of dp_shard.
TEST(NdParallel, FsdpStageHoldsItsShareOfTheStage) {
  SL_SKIP_UNLESS_WORLD(4);
  const NdCase c{.name = "pp2_fsdp2", .dp = 2, .pp = 2, .zero = 3, .micro_batches = 2};
  launch(
      4,
      [&](RankContext& ctx) {
        const HeldModelStates held = held_after_two_steps(ctx, c);
        std::map<std::string, int64_t> units;
        int64_t stage_numel = 0;
        nn::GPT part(config_of(c), kSeed, nn::GPTShardSpec::layers(held.stage, held.stage + 1));  // n_layer 2: one each
        for (const auto& [name, p] : part.named_parameters()) {
          const std::string unit = name.rfind("h.", 0) == 0 ? name.substr(0, name.find('.', 2))
                                   : name.rfind("wte.", 0) == 0 ? "wte" : "root";
          units[unit] += p.numel();
          stage_numel += p.numel();
        }
        const int64_t shard = shard_numel(units, c.dp);
        EXPECT_EQ(held.weights, 4 * shard) << "stage " << held.stage;
        EXPECT_EQ(held.grads, 4 * shard) << "stage " << held.stage;
        EXPECT_EQ(held.optimizer, 8 * shard) << "stage " << held.stage;
        // ~1/dp of the unsharded stage's 16 bytes per element (up to each unit's padding)
        EXPECT_LE(16 * shard, 16 * (stage_numel / c.dp + static_cast<int64_t>(units.size())));
      },
      quick(10000));
}

// FSDP over TP and CP (pp 1): a rank holds 1/(dp_shard·cp) of its tp slice's units: 16Ψ/(tp·dp_shard·cp)
// of model states for the tp-sliced parameters, 16Ψ_rep/(dp_shard·cp) for those TP replicates
// (LayerNorms, wpe, row-parallel biases), plus each unit's padding. Worked out here from the serial
// model's shapes and Megatron's split, not from the runner.
TEST(NdParallel, FsdpOverTpAndCpHoldsItsShareOfTheSlice) {
  SL_SKIP_UNLESS_WORLD(8);
  const NdCase c{.name = "fsdp2_tp2_cp2", .dp = 2, .tp = 2, .cp = 2, .zero = 3};
  const nn::GPTConfig config = config_of(c);
  const int64_t tp = c.tp, shards = c.dp * c.cp;  // FSDP's group: dp_shard x cp
  // The serial parameters: which ones TP slices (columns: c_attn, c_fc; rows: the c_proj weights; the
  // vocabulary: wte, padded to a multiple of tp) and which it replicates.
  const int64_t padded_vocab = (config.vocab_size + tp - 1) / tp * tp;
  std::map<std::string, int64_t> units;  // unit -> elements of this rank's tp slice
  int64_t psi = 0, psi_sliced = 0;
  {
    nn::GPT serial(config, kSeed);
    for (const auto& [name, p] : serial.named_parameters()) {
      psi += p.numel();
      const bool bias = name.find(".bias") != std::string::npos;
      const bool sliced = name == "wte.weight" || name.find("c_attn") != std::string::npos ||
                          name.find("c_fc") != std::string::npos || (name.find("c_proj") != std::string::npos && !bias);
      const int64_t numel = name == "wte.weight" ? padded_vocab * config.n_embd : p.numel();
      if (sliced) psi_sliced += numel;
      const std::string unit = name.rfind("h.", 0) == 0 ? name.substr(0, name.find('.', 2))
                               : name == "wte.weight"   ? "wte"
                                                        : "root";
      units[unit] += sliced ? numel / tp : numel;
    }
  }
  const int64_t shard = shard_numel(units, shards);
  const int64_t psi_replicated = psi - (psi_sliced - (padded_vocab - config.vocab_size) * config.n_embd);
  launch(
      8,
      [&](RankContext& ctx) {
        const HeldModelStates held = held_after_two_steps(ctx, c);
        EXPECT_EQ(held.weights, 4 * shard);
        EXPECT_EQ(held.grads, 4 * shard);
        EXPECT_EQ(held.optimizer, 8 * shard);
        // 16Ψ/(tp·dp_shard·cp) for the sliced part, the replicated part whole over tp, + padding
        const double formula = 16.0 * static_cast<double>(psi_sliced) / static_cast<double>(tp * shards) +
                               16.0 * static_cast<double>(psi_replicated) / static_cast<double>(shards);
        EXPECT_GE(16.0 * static_cast<double>(shard), formula);
        EXPECT_LE(16.0 * static_cast<double>(shard), formula + 16.0 * static_cast<double>(units.size() * shards));
      },
      quick(10000));
}

// What cannot run is refused before any communication, naming the values and the reason.
TEST(NdParallel, RefusalsNameTheirValues) {
  NdCase zero2{.name = "zero2", .dp = 2, .pp = 2, .zero = 2, .micro_batches = 2};
  expect_error([&] { plan_of(zero2).validate(4); },
               "pp 2 x cp 1 x tp 1: ZeRO-2 (--zero 2) with pp 2: the first stage's wte and the last stage's tied "
               "copy sit at different offsets of their stages' gradient shards");
  // FSDP with pp runs one chunk per rank, under naive / gpipe / 1f1b only; no offload over a cut.
  TrainPlan fsdp_offload = plan_of(NdCase{.name = "fsdp_offload", .dp = 2, .tp = 2, .zero = 3});
  fsdp_offload.offload = true;
  expect_error([&] { fsdp_offload.validate(4); },
               "dp_replicate 1 x dp_shard 2 x pp 1 x cp 1 x tp 2: --offload with pp, tp or cp is not supported");
  TrainPlan zero1_offload = plan_of(NdCase{.name = "zero1_offload", .dp = 2, .cp = 2, .zero = 1});
  zero1_offload.offload = true;
  expect_error([&] { zero1_offload.validate(4); }, "--offload with --zero 1 over a cut model (pp, tp or cp > 1)");
  NdCase fsdp_zero_bubble{.name = "fsdp_zb", .dp = 2, .pp = 2, .zero = 3, .micro_batches = 2, .schedule = "zero-bubble"};
  expect_error([&] { plan_of(fsdp_zero_bubble).validate(4); }, "the zero-bubble schedule's W actions would fill a unit's weight gradients");
  NdCase fsdp_interleaved{.name = "fsdp_interleaved", .dp = 2, .pp = 2, .zero = 3, .micro_batches = 2,
                          .schedule = "interleaved", .virtual_stages = 2, .n_layer = 4};
  expect_error([&] { plan_of(fsdp_interleaved).validate(4); },
               "FSDP shards one chunk per rank; the interleaved schedule (virtual_stages 2) gives each rank several");
  NdCase sp{.name = "sp", .tp = 4, .cp = 2, .sp = true};
  nn::GPTConfig config = config_of(sp);
  config.block_size = 12;
  expect_error([&] { check_model_cut(config, plan_of(sp).parallelize_options(), 1); },
               "sequence parallel under cp: the 6 tokens of a cp shard (block_size 12 / cp 2) do not split over tp 4");
  // Ulysses gives each rank whole heads: n_head (4) over cp, times tp; a hybrid's U divides cp.
  NdCase ulysses{.name = "ulysses", .tp = 2, .cp = 4, .variant = "ulysses"};
  expect_error([&] { check_model_cut(config_of(ulysses), plan_of(ulysses).parallelize_options(), 1); },
               "context parallel (ulysses): n_head 4 must divide by the Ulysses degree 4 x tp 2");
  NdCase hybrid{.name = "hybrid", .cp = 4, .variant = "hybrid", .ulysses = 3};
  expect_error([&] { check_model_cut(config_of(hybrid), plan_of(hybrid).parallelize_options(), 1); },
               "context parallel (hybrid): the Ulysses degree 3 must divide cp 4 (cp = ulysses x ring)");
  NdCase dropout{.name = "dropout", .pp = 2, .cp = 2};
  config = config_of(dropout);
  config.dropout = 0.1;
  expect_error([&] { check_model_cut(config, plan_of(dropout).parallelize_options(), 1); }, "context parallel: dropout (0.1) is not supported");
}

}  // namespace
}  // namespace sl::parallel
