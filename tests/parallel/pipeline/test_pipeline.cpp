// test_pipeline.cpp — PipelineRunner (what train calls) against an independent serial run: its own
// nn::GPT and nn::AdamW, with the same micro-batches and with one micro-batch, over p ∈ {2, 3, 4},
// every schedule, v ∈ {1, 2}, n_layer not divisible by p; DP 2 x PP 2 with DDP and ZeRO-1; the
// activation peak per rank (GPipe ∝ m, 1F1B ∝ min(p-r, m)); and the configurations it refuses.
//
// What makes the comparison able to fail:
//   * a loss-masked stream, so micro-batches count different numbers of targets: weighting each
//     micro-batch's mean by 1 (picotron) or 1/m instead of counted_m/C gives another gradient;
//   * gradients are compared every step, not only the weights after AdamW (which divides by sqrt(v));
//   * the two copies of wte (first stage, last stage's head) are compared bitwise after every step.
//
// Bitwise vs tolerance. A pipeline changes only the order of execution, and backwards run in
// micro-batch order per chunk, so with one micro-batch every schedule equals serial bit for bit,
// and all schedules equal each other bit for bit for any m. With m > 1 one sum differs from serial:
// serial adds the head's and the embedding's wte gradients per micro-batch, Σ_m (h_m + e_m), where
// the pipeline sums each stage's micro-batches and then the two stages once, Σ e_m + Σ h_m (one
// all-reduce per step, as Megatron's embedding group does). So there the first step's gradients
// other than wte are bitwise and the rest is compared at TP/PP's rtol 1e-5, atol 4e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/train/trainer.h"
#include "parallel/zero/zero_adamw.h"
#include "tensor/ledger.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::expect_close;  // every element within kTol of the serial one

constexpr int kSteps = 5;
constexpr int64_t kRowsPerMicro = 2, kBlock = 8;
constexpr uint64_t kSeed = 7;
constexpr test_support::Tolerance kTol{.atol = 4e-5, .rtol = 1e-5};

nn::GPTConfig config_with(int64_t n_layer) {
  nn::GPTConfig c = parity_config();
  c.n_layer = n_layer;
  return c;
}

PipelineOptions options(ScheduleKind schedule, int v = 1, std::vector<int64_t> stage_layers = {}) {
  PipelineOptions o;
  o.schedule = schedule;
  o.virtual_stages = v;
  o.stage_layers = std::move(stage_layers);
  return o;
}

// The rank whose results the test keeps: rank 0 on threads; under mpirun each process's own rank
// (every rank holds the loss and the gathered gradients and parameters after the collectives).
bool reports(const RankContext& ctx) { return ctx.rank == 0 || under_mpirun(); }

// Every target whose position is 3 mod 7 is ignored: rows and micro-batches count different numbers.
nn::TokenStream masked_tokens() {
  nn::TokenStream s = parity_tokens();
  s.loss_mask.resize(s.tokens.size());
  for (size_t i = 0; i < s.tokens.size(); ++i) s.loss_mask[i] = (i % 7 == 3 || i % 11 == 5) ? 0 : 1;
  return s;
}

struct TrainingRun {
  std::vector<double> losses;
  std::vector<nn::StateDict> grads;  // per step, before AdamW
  nn::StateDict params;              // after the last step
  bool tied_equal = true;            // pipeline: both wte copies bitwise equal after every step
  std::vector<int> peak_in_flight;   // pipeline: per rank, the last step's
  std::vector<int64_t> peak_activations;  // pipeline: per rank, ledger bytes above the step's start
};

double counted(const std::vector<nn::TokenStream::MicroBatch>& micros) {
  double c = 0;
  for (const auto& m : micros) c += static_cast<double>(m.counted);
  return c;
}

// The reference (tests/support/serial_run.h): a whole nn::GPT and nn::AdamW, micro-batches weighted
// by counted_m / C.
TrainingRun serial(const nn::GPTConfig& config, int64_t rows, int micro, double clip = 0) {
  const nn::TokenStream data = masked_tokens();
  const test_support::SerialRun reference = test_support::serial_run_micro(
      {.config = config, .seed = kSeed, .adamw = parity_adamw(), .steps = kSteps, .clip = clip}, [&](int step) {
        const auto micros = data.micro_batches(step, rows, kBlock, micro);
        const double C = counted(micros);
        std::vector<test_support::WeightedBatch> weighted;
        for (const auto& m : micros) weighted.push_back({m.batch, static_cast<double>(m.counted) / C});
        return weighted;
      });
  TrainingRun run;
  for (const test_support::SerialStep& step : reference.steps) {
    run.losses.push_back(step.loss);
    run.grads.push_back(test_support::state_of(step.grads));  // before the clip and AdamW
  }
  run.params = test_support::state_of(reference.steps.back().params);
  return run;
}

struct Layout {
  int p;
  int m;
  ScheduleKind schedule;
  int v = 1;
  std::string name() const {
    std::string kind = schedule_name(schedule);
    std::replace(kind.begin(), kind.end(), '-', '_');  // "zero-bubble": a test name is an identifier
    return kind + "_p" + std::to_string(p) + "_m" + std::to_string(m) +
           (v > 1 ? "_v" + std::to_string(v) : "");
  }
};

// The pipeline: world p, mesh pp = p, PipelineRunner + nn::AdamW over its module.
TrainingRun pipelined(const nn::GPTConfig& config, const Layout& layout, const std::vector<int64_t>& stage_layers = {},
                      bool free_sent_outputs = true) {
  const nn::TokenStream data = masked_tokens();
  const int64_t rows = kRowsPerMicro * layout.m;
  TrainingRun run;
  run.peak_in_flight.resize(layout.p);
  run.peak_activations.resize(layout.p);
  std::vector<std::vector<int>> tied_flags(layout.p);
  launch(layout.p, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.pp = layout.p});
    PipelineOptions opts = options(layout.schedule, layout.v, stage_layers);
    opts.engine.free_sent_outputs = free_sent_outputs;
    PipelineRunner runner(config, kSeed, mesh, opts);
    nn::AdamW adamw(runner.module().parameters(), parity_adamw());
    ProcessGroupPtr pp = mesh.group(MeshDim::pp);
    for (int step = 0; step < kSteps; ++step) {
      adamw.zero_grad();
      auto micros = data.micro_batches(step, rows, kBlock, layout.m);
      MemoryLedger& ledger = MemoryLedger::instance();
      const int64_t before = ledger.current(ctx.device, MemoryCategory::activations);
      ledger.reset_peak(ctx.device);
      Tensor loss = full({1}, runner.forward_backward(micros, counted(micros), 1, {}), TensorOptions(DType::f64));
      run.peak_activations[ctx.rank] = ledger.peak(ctx.device, MemoryCategory::activations) - before;
      runner.finish_gradients();
      pp->all_reduce(loss);  // the last stage's share is the loss; the others add 0
      nn::StateDict grads = runner.full_gradients();
      adamw.step();
      // Both copies of wte, bitwise: the last stage's compared with the first's (broadcast over pp).
      Tensor wte = runner.module().state_dict().count("wte.weight") ? runner.module().state_dict().at("wte.weight").clone()
                                                                     : Tensor::empty({config.vocab_size, config.n_embd});
      Tensor first = wte.clone();
      pp->broadcast(first, 0);
      if (runner.module().state_dict().count("wte.weight"))
        tied_flags[ctx.rank].push_back(first.values<float>() == wte.values<float>());
      if (reports(ctx)) {
        run.losses.push_back(loss.item());
        run.grads.push_back(grads);
      }
    }
    nn::StateDict params = runner.full_state_dict();
    if (reports(ctx)) run.params = params;
    run.peak_in_flight[ctx.rank] = runner.peak_in_flight();
  }, quick(20000));
  for (const auto& flags : tied_flags)
    for (int f : flags) run.tied_equal = run.tied_equal && f;
  return run;
}

void expect_bitwise(const nn::StateDict& got, const nn::StateDict& want, const std::string& what, bool skip_wte = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    if (skip_wte && name == "wte.weight") continue;
    ASSERT_TRUE(got.count(name)) << what << ": " << name << " missing";
    EXPECT_EQ(got.at(name).values<float>(), w.values<float>()) << what << ": " << name << " is not bitwise equal";
  }
}

int64_t layers_for(const Layout& l) { return static_cast<int64_t>(l.p) * l.v + 1; }  // never divisible by p·v

class PipelineParity : public testing::TestWithParam<Layout> {};

TEST_P(PipelineParity, MatchesSerial) {
  SL_SKIP_UNLESS_WORLD(GetParam().p);
  const Layout l = GetParam();
  const nn::GPTConfig config = config_with(layers_for(l));
  const TrainingRun pipe = pipelined(config, l);
  const TrainingRun same = serial(config, kRowsPerMicro * l.m, l.m);
  const TrainingRun one = serial(config, kRowsPerMicro * l.m, 1);
  EXPECT_TRUE(pipe.tied_equal) << "the two wte copies drifted apart";
  ASSERT_EQ(pipe.losses.size(), static_cast<size_t>(kSteps));
  if (l.m == 1) {
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(pipe.losses[s], same.losses[s]) << "step " << s;
      expect_bitwise(pipe.grads[s], same.grads[s], "gradients, step " + std::to_string(s));
    }
    expect_bitwise(pipe.params, same.params, "parameters");
  } else {
    expect_bitwise(pipe.grads[0], same.grads[0], "first step's gradients but wte", /*skip_wte=*/true);
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(pipe.losses[s], same.losses[s], kTol.bound(same.losses[s])) << "step " << s;
      expect_close(pipe.grads[s], same.grads[s], kTol,
                   "gradients vs serial with the same micro-batches, step " + std::to_string(s));
    }
    expect_close(pipe.params, same.params, kTol, "parameters vs serial with the same micro-batches");
  }
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(pipe.losses[s], one.losses[s], kTol.bound(one.losses[s])) << "step " << s;
    expect_close(pipe.grads[s], one.grads[s], kTol,
                 "gradients vs serial with one micro-batch, step " + std::to_string(s));
  }
  expect_close(pipe.params, one.params, kTol, "parameters vs serial with one micro-batch");
}

// Every schedule at p = 2 and interleaved at p = 2-4; the Long set (left out of sanitized runs) repeats
// the four other schedules at p = 3 and 4 over the same micro-batch counts.
std::vector<Layout> parity_grid(bool long_set) {
  std::vector<Layout> grid;
  for (int p : {2, 3, 4}) {
    if ((p > 2) == long_set)
      for (int m : {1, p - 1, p, p + 1, 2 * p + 1})
        for (auto s : {ScheduleKind::naive, ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zero_bubble})
          grid.push_back({p, m, s});
    if (!long_set)
      for (int m : {p, 2 * p}) grid.push_back({p, m, ScheduleKind::interleaved, 2});
  }
  // p - 1 = 1 for p = 2 repeats m = 1: drop the duplicates.
  std::vector<Layout> unique;
  for (const Layout& l : grid) {
    bool seen = false;
    for (const Layout& u : unique) seen = seen || u.name() == l.name();
    if (!seen) unique.push_back(l);
  }
  return unique;
}

std::string layout_name(const testing::TestParamInfo<Layout>& info) { return info.param.name(); }
INSTANTIATE_TEST_SUITE_P(Grid, PipelineParity, testing::ValuesIn(parity_grid(false)), layout_name);
INSTANTIATE_TEST_SUITE_P(Long, PipelineParity, testing::ValuesIn(parity_grid(true)), layout_name);

// Only the order changes: every schedule gives the same bits as every other.
TEST(PipelineSchedules, BitwiseEqualToEachOther) {
  SL_SKIP_UNLESS_WORLD(3);
  const nn::GPTConfig config = config_with(7);
  const TrainingRun reference = pipelined(config, {3, 6, ScheduleKind::gpipe});
  for (const Layout& l : {Layout{3, 6, ScheduleKind::naive}, Layout{3, 6, ScheduleKind::one_f_one_b},
                          Layout{3, 6, ScheduleKind::interleaved, 2}, Layout{3, 6, ScheduleKind::zero_bubble}}) {
    const TrainingRun run = pipelined(config, l);
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(run.losses[s], reference.losses[s]) << l.name() << " step " << s;
      expect_bitwise(run.grads[s], reference.grads[s], l.name() + " gradients, step " + std::to_string(s));
    }
    expect_bitwise(run.params, reference.params, l.name() + " parameters");
  }
}

// --stage-layers overrides the balance; the result is still the serial model.
TEST(PipelineStages, OverriddenSplitMatchesSerial) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig config = config_with(5);
  const TrainingRun pipe = pipelined(config, {2, 1, ScheduleKind::one_f_one_b}, {4, 1});
  const TrainingRun same = serial(config, kRowsPerMicro, 1);
  for (int s = 0; s < kSteps; ++s) expect_bitwise(pipe.grads[s], same.grads[s], "step " + std::to_string(s));
  expect_bitwise(pipe.params, same.params, "parameters");
}

// The activations each rank holds at its peak: GPipe every micro-batch, 1F1B min(p - r, m).
TEST(PipelineMemory, PeakActivationsFollowTheSchedule) {
  SL_SKIP_UNLESS_WORLD(4);
  const int p = 4, m = 8;
  const nn::GPTConfig config = config_with(4);  // one block per stage: every stage's micro-batch costs alike
  const TrainingRun gpipe = pipelined(config, {p, m, ScheduleKind::gpipe});
  const TrainingRun one_f_one_b = pipelined(config, {p, m, ScheduleKind::one_f_one_b});
  const TrainingRun single = pipelined(config, {p, 1, ScheduleKind::gpipe});
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe.peak_in_flight[r], m) << "rank " << r;
    EXPECT_EQ(one_f_one_b.peak_in_flight[r], std::min(p - r, m)) << "rank " << r;
    // Bytes: one micro-batch's activations on this stage (the m = 1 run's peak, rows scaled to this
    // run's micro-batch of the same size) times the count held; the backward's own temporaries ride on top.
    const double per_micro = static_cast<double>(single.peak_activations[r]);
    EXPECT_GT(gpipe.peak_activations[r], one_f_one_b.peak_activations[r] - 1) << "rank " << r;
    EXPECT_NEAR(gpipe.peak_activations[r] / per_micro, m, 0.1 * m) << "rank " << r;
    EXPECT_NEAR(one_f_one_b.peak_activations[r] / per_micro, std::min(p - r, m), 0.1 * std::min(p - r, m))
        << "rank " << r;
  }
  EXPECT_LT(one_f_one_b.peak_activations[0], gpipe.peak_activations[0]);
  EXPECT_LT(one_f_one_b.peak_activations[p - 1], one_f_one_b.peak_activations[0]);
}

// Zero-bubble (ZB-H1) keeps 1F1B's warm-up: rank r holds p - r micro-batches between F and B, plus
// up to r between B and W, which keep only what W needs (the linears' inputs and output gradients).
// The pipeline's peak (the most any rank holds) is 1F1B's: rank 0, which lets no W wait.
TEST(PipelineMemory, ZeroBubblePeakIsNoMoreThanOneFOneBs) {
  SL_SKIP_UNLESS_WORLD(4);
  const int p = 4, m = 8;
  const nn::GPTConfig config = config_with(4);
  const TrainingRun one_f_one_b = pipelined(config, {p, m, ScheduleKind::one_f_one_b});
  const TrainingRun zero_bubble = pipelined(config, {p, m, ScheduleKind::zero_bubble});
  const TrainingRun single = pipelined(config, {p, 1, ScheduleKind::gpipe});
  int64_t peak_1f1b = 0, peak_zb = 0;
  for (int r = 0; r < p; ++r) {
    const int held = peak_in_flight(make_schedule(ScheduleKind::zero_bubble, p, m))[r];  // F..W, any part
    EXPECT_EQ(zero_bubble.peak_in_flight[r], held) << "rank " << r;
    EXPECT_LE(held, p) << "rank " << r;
    // A micro-batch waiting for its W holds less than one waiting for its B.
    const double per_micro = static_cast<double>(single.peak_activations[r]);
    EXPECT_LE(zero_bubble.peak_activations[r], per_micro * held * 1.1) << "rank " << r;
    EXPECT_GE(zero_bubble.peak_activations[r], one_f_one_b.peak_activations[r] * 0.99) << "rank " << r;
    peak_1f1b = std::max(peak_1f1b, one_f_one_b.peak_activations[r]);
    peak_zb = std::max(peak_zb, zero_bubble.peak_activations[r]);
  }
  EXPECT_LE(peak_zb, peak_1f1b) << "zero-bubble's peak over the ranks exceeds 1F1B's";
  EXPECT_EQ(zero_bubble.peak_activations[0], one_f_one_b.peak_activations[0]);
}

// A sent output's bytes go at once: under GPipe stage 0 peaks right after its last forward, with
// the m-1 earlier outputs sent and freed (the last one not yet sent): (m-1)·B·T·C·4 bytes saved.
TEST(PipelineMemory, SentOutputsAreFreed) {
  SL_SKIP_UNLESS_WORLD(2);
  const int p = 2, m = 6;
  const nn::GPTConfig config = config_with(2);
  const TrainingRun freed = pipelined(config, {p, m, ScheduleKind::gpipe});
  const TrainingRun kept = pipelined(config, {p, m, ScheduleKind::gpipe}, {}, /*free_sent_outputs=*/false);
  const int64_t output_bytes = kRowsPerMicro * kBlock * config.n_embd * 4;  // [B, T, C] f32
  EXPECT_EQ(kept.peak_activations[0] - freed.peak_activations[0], (m - 1) * output_bytes);
  EXPECT_EQ(kept.peak_activations[1], freed.peak_activations[1]);  // the last stage sends no activation
  EXPECT_EQ(freed.params.at("h.1.mlp.c_fc.weight").values<float>(), kept.params.at("h.1.mlp.c_fc.weight").values<float>());
}


// DP 2 x PP 2: each data-parallel replica is a 2-stage pipeline over its half of the batch. DDP wraps
// the stage's module over the dp group and runs every backward but the rank's last under no_sync
// (the runner's before_backward hook); ZeRO-1 adds every micro-batch into its flat buffer and
// reduce-scatters once in step(). Either way the dp group is used once per step, whatever m is,
// on every rank, the last stage (no warm-up) included.
struct DataParallelRun {
  TrainingRun run;
  std::vector<int64_t> dp_calls_per_step;  // per rank: the dp group's calls in one step
};

DataParallelRun pipelined_with_dp(const nn::GPTConfig& config, int m, bool zero1,
                                  ScheduleKind schedule = ScheduleKind::one_f_one_b) {
  const nn::TokenStream data = masked_tokens();
  const int dp = 2, p = 2;
  const int64_t rows = kRowsPerMicro * m * dp;
  DataParallelRun out;
  out.dp_calls_per_step.resize(dp * p);
  std::vector<std::vector<int>> tied_flags(dp * p);
  launch(dp * p, [&](RankContext& ctx) {
    ParallelismConfig layout{.pp = p};
    (zero1 ? layout.dp_shard : layout.dp_replicate) = dp;
    DeviceMesh mesh(ctx.world, layout);
    PipelineRunner runner(config, kSeed, mesh, options(schedule));
    ProcessGroupPtr dp_group = mesh.group(MeshDim::dp), pp = mesh.group(MeshDim::pp);
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<nn::AdamW> adamw;
    std::unique_ptr<ZeroAdamW> zero;
    if (zero1) {
      zero = std::make_unique<ZeroAdamW>(runner.module().parameters(), dp_group,
                                         ZeroOptions{.stage = 1, .adamw = parity_adamw()});
    } else {
      ddp = std::make_unique<DistributedDataParallel>(runner.module(), dp_group);
      adamw = std::make_unique<nn::AdamW>(runner.module().parameters(), parity_adamw());
    }
    std::optional<DistributedDataParallel::NoSyncGuard> local_only;
    BackwardHooks hooks;
    if (ddp)
      hooks.before_backward = [&](bool last) {
        local_only.reset();
        if (!last) local_only.emplace(*ddp);
      };
    const RowRange mine = data_parallel_rows(rows, mesh.dp_rank(), dp);
    for (int step = 0; step < kSteps; ++step) {
      if (ddp) ddp->zero_grad();
      if (zero) zero->zero_grad();
      const double C = counted(data.micro_batches(step, rows, kBlock, 1));  // the global batch's count
      auto micros = data.micro_batches(step, rows, kBlock, m, mine.begin, mine.end);
      const int64_t calls_before = dp_group->ledger().total().calls;
      Tensor loss = full({1}, runner.forward_backward(micros, C, dp, hooks), TensorOptions(DType::f64));
      local_only.reset();
      if (ddp) ddp->synchronize();  // the last backward's all-reduces, before the tied sum touches wte
      runner.finish_gradients();
      if (zero) zero->step();
      if (ddp) ddp->step(*adamw);
      out.dp_calls_per_step[ctx.rank] = dp_group->ledger().total().calls - calls_before;
      ctx.world->all_reduce(loss);  // the two last stages' shares of their halves
      Tensor wte = runner.module().state_dict().count("wte.weight") ? runner.module().state_dict().at("wte.weight").clone()
                                                                     : Tensor::empty({config.vocab_size, config.n_embd});
      Tensor first = wte.clone();
      pp->broadcast(first, 0);
      if (runner.module().state_dict().count("wte.weight"))
        tied_flags[ctx.rank].push_back(first.values<float>() == wte.values<float>());
      if (reports(ctx)) out.run.losses.push_back(loss.item());
    }
    nn::StateDict params = runner.full_state_dict();
    if (reports(ctx)) out.run.params = params;
  }, quick(20000));
  for (const auto& flags : tied_flags)
    for (int f : flags) out.run.tied_equal = out.run.tied_equal && f;
  return out;
}

// (zero1, schedule): zero-bubble fills the gradients in its W's, so the sync fires from the last W.
class PipelineDataParallel : public testing::TestWithParam<std::tuple<bool, ScheduleKind>> {};

TEST_P(PipelineDataParallel, Dp2Pp2MatchesSerialAndSyncsOncePerStep) {
  SL_SKIP_UNLESS_WORLD(4);
  const auto [zero1, schedule] = GetParam();
  const nn::GPTConfig config = config_with(3);
  const int m = 3;
  const DataParallelRun one = pipelined_with_dp(config, 1, zero1, schedule);
  const DataParallelRun many = pipelined_with_dp(config, m, zero1, schedule);
  const TrainingRun reference = serial(config, kRowsPerMicro * m * 2, 1);
  EXPECT_TRUE(many.run.tied_equal);
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(many.run.losses[s], reference.losses[s], kTol.bound(reference.losses[s])) << "step " << s;
  expect_close(many.run.params, reference.params, kTol, zero1 ? "ZeRO-1 x PP parameters" : "DDP x PP parameters");
  // m micro-batches cost the dp group exactly what one does: the sync runs after the last backward.
  for (size_t r = 0; r < many.dp_calls_per_step.size(); ++r) {
    if (under_mpirun() && static_cast<int>(r) != mpirun_rank()) continue;  // another process's rank
    EXPECT_EQ(many.dp_calls_per_step[r], one.dp_calls_per_step[r]) << "rank " << r;
    EXPECT_GT(many.dp_calls_per_step[r], 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sync, PipelineDataParallel,
                         testing::Combine(testing::Values(false, true),
                                          testing::Values(ScheduleKind::one_f_one_b, ScheduleKind::zero_bubble)),
                         [](const testing::TestParamInfo<std::tuple<bool, ScheduleKind>>& info) {
                           return std::string(std::get<0>(info.param) ? "zero1" : "ddp") +
                                  (std::get<1>(info.param) == ScheduleKind::zero_bubble ? "_zero_bubble" : "");
                         });

// Refused before any communication, naming the values.
TEST(PipelineRunnerConfig, RefusesInvalidConfigurationsBeforeCommunicating) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig config = config_with(3);
  launch(2, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.pp = 2});
    ProcessGroupPtr pp = mesh.group(MeshDim::pp);
    const int64_t calls = pp->ledger().total().calls;
    expect_error([&] { PipelineRunner(config, kSeed, mesh, options(ScheduleKind::gpipe, 2)); },
                 "--virtual-stages 2 needs --schedule interleaved (got gpipe)");
    expect_error([&] { PipelineRunner(config, kSeed, mesh, options(ScheduleKind::interleaved, 2)); },
                 "4 chunks (stages x virtual stages) need at least one layer each, but n_layer is 3");
    expect_error([&] { PipelineRunner(config, kSeed, mesh, options(ScheduleKind::one_f_one_b, 1, {1, 1})); },
                 "--stage-layers adds up to 2 layers, but n_layer is 3");
    EXPECT_EQ(pp->ledger().total().calls, calls) << "an invalid configuration communicated";
    PipelineRunner interleaved(config_with(4), kSeed, mesh, options(ScheduleKind::interleaved, 2));
    const int64_t before = pp->ledger().total().calls;
    const nn::TokenStream data = masked_tokens();
    auto micros = data.micro_batches(0, 3 * kRowsPerMicro, kBlock, 3);
    expect_error([&] { interleaved.forward_backward(micros, counted(micros), 1, {}); },
                 "micro-batches (3) to be a multiple of stages (2)");
    EXPECT_EQ(pp->ledger().total().calls, before) << "a refused step communicated";
  }, quick());
}


// What train will run: parallel::Trainer over a pp x dp mesh with the PipelineRunner parallelize
// builds, wrapped by DDP or ZeRO-1, against the serial run on the whole batch.
class PipelineTrainer : public testing::TestWithParam<int> {};

TEST_P(PipelineTrainer, TrainerWithPipelineRunnerMatchesSerial) {
  SL_SKIP_UNLESS_WORLD(4);
  const int zero = GetParam(), m = 2;
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(4);
  const DeviceGuard on_device(test_device());  // SL_TEST_DEVICE=cuda: the serial run on cuda:0
  const nn::GPTConfig config = config_with(3);
  const nn::TokenStream data = masked_tokens();
  const int64_t rows = kRowsPerMicro * m * 2;
  // Clipping at 0.05 (below this model's gradient norm): the norm over the stages must count the
  // tied wte once (mesh_grads' placements), or every step scales differently from serial.
  constexpr double kClip = 0.05;
  const TrainingRun reference = serial(config, rows, 1, kClip);
  std::vector<double> losses;
  nn::StateDict params;
  launch(4, [&](RankContext& ctx) {
    TrainPlan plan;
    plan.parallelism.pp = 2;
    (zero ? plan.parallelism.dp_shard : plan.parallelism.dp_replicate) = 2;
    plan.dp_strategy = zero_stage_strategy(zero);
    plan.micro_batches = m;
    plan.schedule = ScheduleKind::one_f_one_b;
    Trainer trainer(ctx, plan, parallelize(config, kSeed, ctx.world, plan.parallelize_options(parity_adamw())));
    ASSERT_NE(dynamic_cast<PipelineRunner*>(trainer.runner()), nullptr);
    for (int step = 0; step < kSteps; ++step) {
      const double loss = trainer.train_step(data, step, rows, kBlock, parity_adamw().lr, kClip);
      if (reports(ctx)) losses.push_back(loss);
    }
    nn::StateDict full = trainer.full_state_dict();
    if (reports(ctx)) params = full;
  }, on_test_device(quick(20000), 4));
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(losses[s], reference.losses[s], kTol.bound(reference.losses[s])) << "step " << s;
  expect_close(params, reference.params, kTol, zero ? "Trainer ZeRO-1 x PP" : "Trainer DDP x PP");
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineTrainer, testing::Values(0, 1),
                         [](const testing::TestParamInfo<int>& info) { return info.param ? "zero1_pp2" : "ddp_pp2"; });

}  // namespace
}  // namespace sl::parallel
