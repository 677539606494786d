// test_divergence.cpp — the divergence finder (parallel/train/divergence.h) and the debug probe
// (parallel/runner/debug_probe.h): on layouts of the N-D parity suite, with mixed precision and the CP
// variants, 3 steps report nothing; a fault planted through the probe on one rank is named with its
// step, phase, module or parameter and that rank's mesh coordinates.
//
// Layouts (a few of tools/diverge_layouts.txt, sized for seconds; tools/check_diverge.sh runs all of
// them in CI): dp2_pp2 (2 micro-batches), tp2_cp2 (zigzag ring), pp2_tp2_sp (4 micro), fsdp2_cp2
// (zigzag), dp2_cp2_ulysses, pp2_tp2 bf16 (4 micro), ZeRO-1 bf16 (its f32 masters and moments
// sharded), FSDP x TP fp16 (a loss scale).
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "autograd/grad_mode.h"
#include "nn/optim.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/divergence.h"
#include "parallel/train/divergence_sync.h"
#include "tensor/ops.h"
#include "parallel/train/train_run.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

struct Layout {
  std::string name;
  int dp = 1, pp = 1, tp = 1, cp = 1, zero = 0, micro = 1;
  bool sp = false;
  std::string variant = "ring", precision = "no";
};

TrainOptions options_of(const Layout& l) {
  TrainOptions o;
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 16;
  o.batch_size = 8, o.steps = 3, o.warmup_steps = 0, o.lr = 1e-2;
  o.dp = l.dp, o.pp = l.pp, o.tp = l.tp, o.cp = l.cp, o.sp = l.sp, o.micro_batches = l.micro;
  if (l.zero == 3) o.dp = 1, o.dp_shard = l.dp;
  else o.zero = l.zero;
  o.cp_variant = l.variant, o.mixed_precision = l.precision;
  o.resolve();
  o.validate();
  return o;
}

DivergenceReport find(const Layout& l, const std::vector<ProbeFault>& faults = {}) {
  TrainRun run;
  prepare_run(run, options_of(l), /*writer=*/false);
  return find_divergence(run, faults);
}

class NoFalseAlarm : public testing::TestWithParam<Layout> {};

TEST_P(NoFalseAlarm, ThreeStepsWithinTheBounds) {
  const Layout l = GetParam();
  SL_SKIP_UNLESS_WORLD(l.dp * l.pp * l.tp * l.cp);
  const DivergenceReport report = find(l);
  EXPECT_EQ(report.first(), nullptr) << first_divergence_text(report);
  EXPECT_TRUE(report.uncompared.empty()) << report.uncompared.front();
  EXPECT_GT(report.rows.size(), 100u);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NoFalseAlarm,
    testing::Values(Layout{.name = "dp2_pp2", .dp = 2, .pp = 2, .micro = 2}, Layout{.name = "tp2_cp2", .tp = 2, .cp = 2},
                    Layout{.name = "pp2_tp2_sp", .pp = 2, .tp = 2, .micro = 4, .sp = true},
                    Layout{.name = "fsdp2_cp2", .dp = 2, .cp = 2, .zero = 3},
                    Layout{.name = "dp2_cp2_ulysses", .dp = 2, .cp = 2, .variant = "ulysses"},
                    Layout{.name = "pp2_tp2_bf16", .pp = 2, .tp = 2, .micro = 4, .precision = "bf16"},
                    Layout{.name = "zero1_dp2_bf16", .dp = 2, .zero = 1, .micro = 2, .precision = "bf16"},
                    Layout{.name = "fsdp2_tp2_fp16", .dp = 2, .tp = 2, .zero = 3, .precision = "fp16"}),
    [](const testing::TestParamInfo<Layout>& info) { return info.param.name; });

// The first divergence is at `step`, in `phase`, at `name`, and every rank that diverged there has
// the coordinate `coordinate` ("tp 1").
void expect_first(const DivergenceReport& report, int step, const std::string& phase, const std::string& name,
                  const std::string& coordinate) {
  const Comparison* first = report.first();
  ASSERT_NE(first, nullptr) << first_divergence_text(report);
  EXPECT_EQ(first->step, step) << first_divergence_text(report);
  EXPECT_EQ(first->phase, phase) << first_divergence_text(report);
  EXPECT_EQ(first->name, name) << first_divergence_text(report);
  for (const Comparison* c : report.at_same_place(*first))
    EXPECT_NE((" " + c->coordinates + " ").find(" " + coordinate + " "), std::string::npos)
        << "rank " << c->rank << " (" << c->coordinates << ")\n" << first_divergence_text(report);
}

using Kind = ProbeFault::Kind;

TEST(DivergenceFinder, NamesOneTpRanksScaledCAttnGradient) {
  SL_SKIP_UNLESS_WORLD(4);
  const DivergenceReport report = find({.name = "tp2_cp2", .tp = 2, .cp = 2},
                                       {{.kind = Kind::scale_gradient, .target = "h.0.attn.c_attn.weight", .factor = 2,
                                         .step = 1, .on = {{MeshDim::tp, 1}}}});
  // before the cp sum: both cp ranks of tp rank 1 hold the wrong sum
  expect_first(report, 1, "backward", "h.0.attn.c_attn.weight", "tp 1");
}

// A gradient x2 on one tp rank is caught at the step it is planted, whichever step that is.
TEST(DivergenceFinder, CatchesADoubledGradientAtEveryStepInF32) {
  SL_SKIP_UNLESS_WORLD(4);
  for (int step = 0; step < 3; ++step) {
    const DivergenceReport report = find({.name = "tp2_cp2", .tp = 2, .cp = 2},
                                         {{.kind = Kind::scale_gradient, .target = "h.1.mlp.c_fc.weight", .factor = 2,
                                           .step = step, .on = {{MeshDim::tp, 1}}}});
    expect_first(report, step, "backward", "h.1.mlp.c_fc.weight", "tp 1");
  }
}

// In 16-bit precision (rounding 2^-8 in bf16, 2^-11 in fp16) a doubled gradient is named at whichever
// step it is planted: each step starts from the layout's state, so the bound of a later step is that
// step's rounding alone, as at the first.
TEST(DivergenceFinder, CatchesADoubledGradientAtEveryStepIn16Bit) {
  SL_SKIP_UNLESS_WORLD(4);
  for (const std::string precision : {"bf16", "fp16"})
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(precision + " step " + std::to_string(step));
      const DivergenceReport report = find({.name = "pp2_tp2", .pp = 2, .tp = 2, .micro = 2, .precision = precision},
                                           {{.kind = Kind::scale_gradient, .target = "h.0.attn.c_attn.weight", .factor = 2,
                                             .step = step, .on = {{MeshDim::tp, 1}}}});
      expect_first(report, step, "backward", "h.0.attn.c_attn.weight", "tp 1");
    }
}

// In f32 a gradient 1% too large on one tp rank, planted at the last step, is named there.
TEST(DivergenceFinder, CatchesAGradientOnePercentOffAtALaterStepInF32) {
  SL_SKIP_UNLESS_WORLD(4);
  const DivergenceReport report = find({.name = "pp2_tp2", .pp = 2, .tp = 2, .micro = 2},
                                       {{.kind = Kind::scale_gradient, .target = "h.0.attn.c_attn.weight", .factor = 1.01,
                                         .step = 2, .on = {{MeshDim::tp, 1}}}});
  expect_first(report, 2, "backward", "h.0.attn.c_attn.weight", "tp 1");
}

// Each step starts from the layout's own state: a gradient doubled at step 1 is named there, and step 2,
// which starts from the weights, AdamW moments and f32 masters the fault left, diverges nowhere. (A
// serial run that kept its own moments would differ at step 2's update by the doubled gradient's share
// of them, in f32 by hundreds of times the bound.)
TEST(DivergenceFinder, ComparesTheStepAfterAFaultFromTheStateItLeft) {
  SL_SKIP_UNLESS_WORLD(4);
  for (const std::string precision : {"no", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const DivergenceReport report = find({.name = "pp2_tp2", .pp = 2, .tp = 2, .micro = 2, .precision = precision},
                                         {{.kind = Kind::scale_gradient, .target = "h.0.attn.c_attn.weight", .factor = 2,
                                           .step = 1, .on = {{MeshDim::tp, 1}}}});
    expect_first(report, 1, "backward", "h.0.attn.c_attn.weight", "tp 1");
    int at_step_2 = 0;
    for (const Comparison& c : report.rows) {
      if (c.step != 2) continue;
      ++at_step_2;
      EXPECT_FALSE(c.diverged()) << c.phase << " " << c.name << " rank " << c.rank << ": " << c.over << " of "
                                 << c.elements << " over, worst " << c.worst_ratio << " x its bound";
    }
    EXPECT_GT(at_step_2, 50);
  }
}

TEST(DivergenceFinder, NamesOneCpRanksScaledAttentionOutput) {
  SL_SKIP_UNLESS_WORLD(4);
  const DivergenceReport report = find({.name = "tp2_cp2", .tp = 2, .cp = 2},
                                       {{.kind = Kind::scale_output, .target = "h.1.attn", .factor = 1.5, .step = 0,
                                         .on = {{MeshDim::cp, 1}}}});
  expect_first(report, 0, "forward", "h.1.attn", "cp 1");
}

TEST(DivergenceFinder, NamesADroppedCpContribution) {
  SL_SKIP_UNLESS_WORLD(2);
  const DivergenceReport report = find({.name = "cp2", .cp = 2},
                                       {{.kind = Kind::scale_gradient, .target = "h.1.mlp.c_fc.weight", .factor = 0,
                                         .step = 2, .on = {{MeshDim::cp, 1}}}});
  expect_first(report, 2, "backward", "h.1.mlp.c_fc.weight", "pp 0");  // the cp sum: every cp rank wrong
}

TEST(DivergenceFinder, NamesASkippedTiedEmbeddingSum) {
  SL_SKIP_UNLESS_WORLD(2);
  // The last stage's wte copy contributes nothing to the sum between the stages.
  const DivergenceReport report = find({.name = "pp2", .pp = 2, .micro = 2},
                                       {{.kind = Kind::scale_gradient, .target = "wte.weight", .factor = 0, .step = 0,
                                         .on = {{MeshDim::pp, 1}}}});
  expect_first(report, 0, "backward", "wte.weight", "dp_shard 0");
  EXPECT_EQ(report.at_same_place(*report.first()).size(), 2u) << "both stages' copies: " << first_divergence_text(report);
}

TEST(DivergenceFinder, NamesAStageHandedAnotherMicroBatch) {
  SL_SKIP_UNLESS_WORLD(2);
  // The second stage's first block returns micro-batch 0's output for micro-batch 1.
  const DivergenceReport report = find({.name = "pp2", .pp = 2, .micro = 2},
                                       {{.kind = Kind::reuse_output, .target = "h.1", .step = 1,
                                         .on = {{MeshDim::pp, 1}}, .from_call = 0, .at_call = 1}});
  expect_first(report, 1, "forward", "h.1", "pp 1");
}

// The layout's state as the finder gathers it: owned pieces placed by their regions (two halves of a
// tensor make it whole, a replica is not read), loaded exactly; a tensor no rank held whole is refused
// by name, nothing loaded.
TEST(DivergenceFinder, GathersTheLayoutsStateFromOwnedPiecesOnly) {
  TrainRun run;
  prepare_run(run, options_of({.name = "serial"}), /*writer=*/false);
  const std::unique_ptr<nn::GPT> model = initial_model(run);
  nn::AdamW adamw(model->parameters());
  const std::vector<StatePiece> serial = whole_state_pieces(*model, adamw);  // exp_avg: zeros
  LayoutState state(serial);
  std::vector<StatePiece> ranks;
  for (const StatePiece& piece : serial) {
    if (piece.tensor != "h.0.attn.c_attn.weight") {
      ranks.push_back(piece);
      continue;
    }
    // [3C, C] in two pieces: elements [0, n/2) and [n/2, n) of the whole box, and a wrong replica
    const int64_t n = piece.region.numel(), half = n / 2;
    StatePiece first = piece, second = piece, replica = piece;
    first.region.flat_end = half, first.data = piece.data.flat_view(0, {half});
    second.region.flat_begin = half, second.data = piece.data.flat_view(half, {n - half});
    replica.data = zeros_like(piece.data), replica.owner = false;
    ranks.insert(ranks.end(), {first, second, replica});
  }
  state.add(ranks);
  const std::unique_ptr<nn::GPT> other = initial_model(run);
  nn::AdamW other_adamw(other->parameters());
  {
    NoGradGuard no_grad;
    for (const auto& [name, p] : other->named_parameters()) p.detach().copy_(zeros_like(p));
  }
  state.load_into(whole_state_pieces(*other, other_adamw));
  const nn::NamedTensors loaded = other->named_parameters();
  size_t i = 0;
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_EQ(loaded.at(i++).second.detach().to_vector(), p.detach().to_vector()) << name;

  state.clear();
  std::erase_if(ranks, [](const StatePiece& p) { return p.tensor == "h.0.attn.c_attn.weight" && p.region.flat_begin > 0; });
  state.add(ranks);
  expect_error([&] { state.load_into(whole_state_pieces(*other, other_adamw)); },
               "leave 384 of 768 elements of h.0.attn.c_attn.weight unheld");
}

TEST(DivergenceFinder, ReadsAFaultFromItsWords) {
  const ProbeFault g = parse_probe_fault("scale-grad h.0.attn.c_attn.weight tp=1 step=1 x2");
  EXPECT_EQ(g.kind, Kind::scale_gradient);
  EXPECT_EQ(g.target, "h.0.attn.c_attn.weight");
  EXPECT_EQ(g.factor, 2);
  EXPECT_EQ(g.step, 1);
  ASSERT_EQ(g.on.size(), 1u);
  EXPECT_EQ(g.on[0], std::make_pair(MeshDim::tp, 1));
  const ProbeFault o = parse_probe_fault("  scale-output h.1.attn cp=1 pp=0 x0.5 ");
  EXPECT_EQ(o.kind, Kind::scale_output);
  EXPECT_EQ(o.factor, 0.5);
  EXPECT_EQ(o.step, -1);
  EXPECT_EQ(o.on.size(), 2u);
  const ProbeFault r = parse_probe_fault("reuse-output h.1 pp=1 step=1 call=2 from=0");
  EXPECT_EQ(r.kind, Kind::reuse_output);
  EXPECT_EQ(r.at_call, 2);
  EXPECT_EQ(r.from_call, 0);
  expect_error([] { parse_probe_fault("scale-grad w tp=1"); }, "no factor");
  expect_error([] { parse_probe_fault("scale w x2"); }, "unknown fault 'scale'");
  expect_error([] { parse_probe_fault("scale-grad w tq=1 x2"); }, "'tq=' is not step=");
  expect_error([] { parse_probe_fault("scale-grad w step=1a x2"); }, "step must be a number, got '1a'");
  expect_error([] { parse_probe_fault("scale-grad w x"); }, "the factor after x must be a number");
  expect_error([] { parse_probe_fault("reuse-output h.1 call=1"); }, "needs call=A and from=B");
  expect_error([] { parse_probe_fault("reuse-output h.1 call=0 from=1"); }, "from=1 must come before call=0");
}

TEST(DivergenceFinder, RefusesAFaultOnATargetTheModelLacks) {
  TrainRun run;
  prepare_run(run, options_of({.name = "dp2", .dp = 2}), /*writer=*/false);
  expect_error([&] { find_divergence(run, {parse_probe_fault("scale-grad h.0.attn.nope x2")}); },
               "the model has no parameter 'h.0.attn.nope'");
  expect_error([&] { find_divergence(run, {parse_probe_fault("scale-output h.9 x2")}); }, "the model has no module 'h.9'");
}

// Every gradient doubled after DDP's average (the sum left undivided): named at the parameter nearest the loss.
TEST(DivergenceFinder, NamesAnUnaveragedDataParallelSum) {
  SL_SKIP_UNLESS_WORLD(2);
  TrainRun run;
  prepare_run(run, options_of({.name = "dp2", .dp = 2}), /*writer=*/false);
  const DivergenceReport report = find_divergence(run, {parse_probe_fault("scale-grad * step=0 x2")});
  expect_first(report, 0, "backward", "ln_f.bias", "pp 0");
  EXPECT_EQ(report.at_same_place(*report.first()).size(), 2u) << first_divergence_text(report);
}

TEST(DivergenceFinder, RefusesWhatItCannotCompare) {
  TrainOptions o = options_of({.name = "dp2", .dp = 2});
  o.naive_dp = true;
  expect_error([&] { check_comparable(o); }, "--naive-dp runs its passes inside its strategy");
  o = options_of({.name = "serial"});
  o.dropout = 0.1;
  expect_error([&] { check_comparable(o); }, "each rank draws its own masks");
}

}  // namespace
}  // namespace sl::parallel
