// test_tensor_parallel.cpp — the GPT's tp slice as `train --tp N [--sp]` runs it (apply_tensor_parallel
// composed by parallel/nd/parallelize.h; Megatron TP, with and without sequence parallelism, alone
// and under DDP / ZeRO-1) against an independent serial nn::GPT + nn::AdamW:
// losses every step, the gathered gradients of the last step and the parameters after 5 steps,
// within TP's tolerances (rtol 1e-5, atol 4e-5); and, after 5 steps, the replicated parameters
// bitwise equal on every tp rank. Then the refusals (before any communication).
//
// What makes it able to fail:
//   * lr 1e-2, weight decay 0.1, a loss-masked stream whose rows count unequal numbers of targets
//     (a wrong weighting of micro-batches or dp ranks moves the gradient);
//   * vocabularies not divisible by tp (padded shards: a padded logit in the softmax moves every loss);
//   * gradients compared, not only weights (Adam hides a constant factor);
//   * under SP the LayerNorm and c_proj-bias gradients are partial on each rank: without
//     finish_gradients()' all-reduce they differ from serial, and the replicas drift apart.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/nd/parallelize.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/train/trainer.h"
#include "parallel/zero/zero_adamw.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::at;
using test_support::expect_close;
using test_support::state_of;

constexpr int kSteps = 5;
constexpr int64_t kBatch = 4;
constexpr test_support::Tolerance kTol{.atol = 4e-5, .rtol = 1e-5};
constexpr uint64_t kSeed = 5;

enum class DataParallel { none, ddp, zero1 };

struct TPCase {
  std::string name;
  nn::GPTConfig config;
  int64_t T;  // sequence length of the batches
  int tp;
  bool sp;
  int dp = 1;
  DataParallel data_parallel = DataParallel::none;
  int micro_batches = 1;
  double clip = 0;  // > 0: clip_grad_norm every step (parallel: over runner.mesh_grads(), the placements)
};

void PrintTo(const TPCase& c, std::ostream* out) { *out << c.name; }
std::string case_name(const testing::TestParamInfo<TPCase>& info) { return info.param.name; }

// Targets count when i % 8 < 1 + (i / 8) % 5: rows and micro-batches count unequal numbers.
nn::TokenStream masked_tokens(int64_t vocab) {
  nn::TokenStream s;
  s.vocab_size = vocab;
  for (int i = 0; i < 600; ++i) {
    s.tokens.push_back(static_cast<int32_t>((i * 7 + i / 5 + (i * i) % 11) % vocab));
    s.loss_mask.push_back(i % 8 < 1 + (i / 8) % 5 ? 1 : 0);
  }
  return s;
}

// The serial reference (tests/support/serial_run.h), clipped as the case clips.
test_support::SerialRun run_serial(const TPCase& c) {
  const nn::TokenStream data = masked_tokens(c.config.vocab_size);
  return test_support::serial_run(
      {.config = c.config, .seed = kSeed, .adamw = parity_adamw(), .steps = kSteps, .clip = c.clip},
      [&](int s) { return data.get_batch(s, kBatch, c.T); });
}

// Every parameter that is not sharded holds the same bytes on every tp rank.
void expect_replicas_bitwise_equal(nn::Module& module, const ProcessGroupPtr& tp, int rank) {
  const auto placements = module.named_placements();
  size_t i = 0;
  for (const auto& [name, param] : module.named_parameters()) {
    const nn::Placement& placement = placements[i++].second;
    if (placement.kind == nn::Placement::Kind::sharded) continue;
    Tensor all = Tensor::empty({tp->size(), param.numel()}, TensorOptions(param.dtype(), param.device()));
    tp->all_gather(all, param.detach().reshape({param.numel()}));
    const Tensor host_all = all.to(Device::cpu()), host_param = param.detach().to(Device::cpu());  // from a GPU too
    const char* bytes = static_cast<const char*>(host_all.raw_data());
    for (int r = 0; r < tp->size(); ++r)
      EXPECT_EQ(std::memcmp(bytes + r * param.nbytes(), host_param.raw_data(), static_cast<size_t>(param.nbytes())), 0)
          << name << " (" << placement.str() << ") differs between tp rank " << rank << " and tp rank " << r;
  }
}

class TensorParallelParity : public testing::TestWithParam<TPCase> {};

// This rank's tp slice of the GPT on `mesh`, run by the plain micro-batch loop: what parallelize
// builds for `train --tp N [--sp]` (apply_tensor_parallel on the part, parallel/nd/parallelize.h).
std::unique_ptr<ModelRunner> tp_runner(const nn::GPTConfig& config, const DeviceMesh& mesh, bool sp = false) {
  return parallelize_model(config, kSeed, mesh, {.parallelism = mesh.config(), .sequence_parallel = sp});
}

TEST_P(TensorParallelParity, MatchesSerialAfterFiveAdamWSteps) {
  const TPCase c = GetParam();
  const int world = c.tp * c.dp;
  SL_SKIP_UNLESS_WORLD(world);
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(world);
  const DeviceGuard on_device(test_device());  // SL_TEST_DEVICE=cuda: the serial run on cuda:0
  const test_support::SerialRun serial = run_serial(c);
  const test_support::SerialStep& last_step = serial.steps.back();  // its gradients are compared, before its update
  const nn::TokenStream data = masked_tokens(c.config.vocab_size);
  launch(
      world,
      [&](RankContext& ctx) {
        ParallelismConfig parallelism{.tp = c.tp};
        if (c.data_parallel == DataParallel::ddp) parallelism.dp_replicate = c.dp;
        if (c.data_parallel == DataParallel::zero1) parallelism.dp_shard = c.dp;
        DeviceMesh mesh(ctx.world, parallelism);
        std::unique_ptr<ModelRunner> owned = tp_runner(c.config, mesh, c.sp);
        ModelRunner& runner = *owned;
        nn::Module& module = runner.module();
        std::unique_ptr<nn::AdamW> adamw;
        std::unique_ptr<DistributedDataParallel> ddp;
        std::unique_ptr<ZeroAdamW> zero;
        if (c.data_parallel == DataParallel::zero1) {
          zero = std::make_unique<ZeroAdamW>(module.parameters(), mesh.group(MeshDim::dp),
                                             ZeroOptions{.stage = 1, .adamw = parity_adamw()});
        } else {
          adamw = std::make_unique<nn::AdamW>(module.parameters(), parity_adamw());
          if (c.data_parallel == DataParallel::ddp)
            ddp = std::make_unique<DistributedDataParallel>(module, mesh.group(MeshDim::dp));
        }
        const RowRange rows = data_parallel_rows(kBatch, mesh.dp_rank(), c.dp);
        for (int s = 0; s < kSteps; ++s) {
          if (zero)
            zero->zero_grad();
          else if (ddp)
            ddp->zero_grad();
          else
            adamw->zero_grad();
          const double global_count = static_cast<double>(nn::counted_targets(data.get_batch(s, kBatch, c.T).targets));
          auto micros = data.micro_batches(s, kBatch, c.T, c.micro_batches, rows.begin, rows.end);
          std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync;
          BackwardHooks hooks{[&](bool last) {
            no_sync.reset();
            if (ddp && !last) no_sync = std::make_unique<DistributedDataParallel::NoSyncGuard>(*ddp);
          }};
          Tensor loss =
              full({1}, runner.forward_backward(micros, global_count, c.dp, hooks), TensorOptions(DType::f64));
          no_sync.reset();
          runner.finish_gradients();
          ctx.world->all_reduce(loss);  // only tp rank 0 of each dp rank holds a share
          EXPECT_NEAR(loss.item(), serial.steps[s].loss, kTol.bound(serial.steps[s].loss)) << "step " << s;
          if (s == kSteps - 1 && !zero)
            expect_close(runner.full_gradients(), state_of(last_step.grads), kTol, at("gradient", ctx.rank, s));
          if (c.clip > 0) {  // each element once: shards on every tp rank, replicas on tp rank 0, padding is 0
            const double norm = clip_grad_norm(runner.mesh_grads(), c.clip, mesh);
            EXPECT_NEAR(norm, serial.steps[s].norm, 1e-5 * serial.steps[s].norm) << "step " << s;
          }
          if (zero)
            zero->step();
          else if (ddp)
            ddp->step(*adamw);
          else
            adamw->step();
        }
        expect_close(runner.full_state_dict(), state_of(last_step.params), kTol, at("parameter", ctx.rank, kSteps - 1));
        expect_replicas_bitwise_equal(module, mesh.group(MeshDim::tp), mesh.tp_rank());
      },
      on_test_device(quick(20000), world));
}

// The same layouts through parallel::Trainer (what `train --tp N [--sp]` runs): built by parallelize,
// wrapped by DDP or ZeRO-1 over dp, the Trainer's clip over the placements.
TEST_P(TensorParallelParity, MatchesSerialThroughTheTrainer) {
  const TPCase c = GetParam();
  const int world = c.tp * c.dp;
  SL_SKIP_UNLESS_WORLD(world);
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(world);
  const DeviceGuard on_device(test_device());  // SL_TEST_DEVICE=cuda: the serial run on cuda:0
  const test_support::SerialRun serial = run_serial(c);
  const test_support::SerialStep& last_step = serial.steps.back();  // its gradients are compared, before its update
  const nn::TokenStream data = masked_tokens(c.config.vocab_size);
  TrainPlan plan;
  plan.parallelism.tp = c.tp;
  if (c.data_parallel == DataParallel::ddp) plan.parallelism.dp_replicate = c.dp;
  if (c.data_parallel == DataParallel::zero1) plan.parallelism.dp_shard = c.dp, plan.dp_strategy = DpStrategy::zero1;
  plan.micro_batches = c.micro_batches;
  plan.sequence_parallel = c.sp;
  launch(
      world,
      [&](RankContext& ctx) {
        Trainer trainer(ctx, plan, parallelize(c.config, kSeed, ctx.world, plan.parallelize_options(parity_adamw())));
        for (int s = 0; s < kSteps; ++s) {
          if (s == kSteps - 1) trainer.keep_gradients();
          const double loss = trainer.train_step(data, s, kBatch, c.T, parity_adamw().lr, c.clip);
          EXPECT_NEAR(loss, serial.steps[s].loss, kTol.bound(serial.steps[s].loss)) << "step " << s;
        }
        expect_close(trainer.full_gradients(), state_of(last_step.grads), kTol, at("gradient", ctx.rank, kSteps - 1));
        expect_close(trainer.full_state_dict(), state_of(last_step.params), kTol,
                     at("parameter", ctx.rank, kSteps - 1));
      },
      on_test_device(quick(20000), world));
}

nn::GPTConfig gpt(int64_t V, int64_t NH, int64_t C) {
  return {.vocab_size = V, .block_size = 8, .n_layer = 2, .n_head = NH, .n_embd = C};
}

std::vector<TPCase> cases() {
  std::vector<TPCase> out;
  for (bool sp : {false, true}) {
    const std::string s = sp ? "_sp" : "";
    out.push_back({"tp2" + s, gpt(32, 2, 16), 8, 2, sp});
    out.push_back({"tp2_vocab31" + s, gpt(31, 2, 16), 8, 2, sp});
    nn::GPTConfig tp3 = gpt(32, 3, 12);
    if (sp) tp3.block_size = 6;  // SP splits the model's sequence over tp: 6 tokens over 3 ranks
    out.push_back({"tp3_vocab32_T6" + s, tp3, 6, 3, sp});
    out.push_back({"tp4_vocab30" + s, gpt(30, 4, 16), 8, 4, sp});
    out.push_back({"tp2_micro2" + s, gpt(32, 2, 16), 8, 2, sp, 1, DataParallel::none, 2});
    out.push_back({"dp2_ddp_tp2" + s, gpt(31, 2, 16), 8, 2, sp, 2, DataParallel::ddp});
    out.push_back({"dp2_zero1_tp2" + s, gpt(31, 2, 16), 8, 2, sp, 2, DataParallel::zero1});
    // clipping at 0.05 scales every step's gradient (norms ~0.3-1)
    out.push_back({"tp4_vocab30_clip" + s, gpt(30, 4, 16), 8, 4, sp, 1, DataParallel::none, 1, 0.05});
    out.push_back({"dp2_ddp_tp2_clip" + s, gpt(31, 2, 16), 8, 2, sp, 2, DataParallel::ddp, 1, 0.05});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelParity, testing::ValuesIn(cases()), case_name);

// ---- the shard is the serial model's slice -----------------------------------------------------------

TEST(TensorParallel, ShardsAreSlicesOfTheSerialDrawAndGatherToIt) {
  SL_SKIP_UNLESS_WORLD(4);
  const nn::GPTConfig config = gpt(30, 4, 16);
  nn::GPT serial(config, kSeed);
  launch(
      4,
      [&](RankContext& ctx) {
        TensorParallelGPT model(config, kSeed, ctx.world);
        EXPECT_EQ(model.gpt().wte->weight.size(0), 8);  // Vp = 32 over 4
        EXPECT_EQ(model.gpt().block(0).attn->n_head, 1);
        const int64_t L = 2, C = 16, t = 4, Vp = 32;  // weights per rank: tp_gpt.h's count
        EXPECT_EQ(model.gpt().num_parameters(), L * (12 * C * C / t + 7 * C / t + 6 * C) + Vp / t * C + 8 * C + 2 * C);
        for (const auto& [name, tensor] : model.full_state_dict()) {
          ASSERT_EQ(tensor.shape(), serial.state_dict().at(name).shape()) << name;
          EXPECT_EQ(max_abs_diff(tensor, serial.state_dict().at(name)), 0.0) << name << " is not the serial draw";
        }
      },
      quick());
}

// Under SP each rank normalises only its T/t rows: its LayerNorm (and c_proj bias) gradients are
// partial sums until finish_gradients() all-reduces them over tp (Megatron #1446, gpt-neox #1257).
TEST(TensorParallel, SequenceParallelLayerNormGradientsArePartialUntilFinished) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig config = gpt(32, 2, 16);
  const nn::TokenStream data = masked_tokens(32);
  nn::GPT serial(config, kSeed);
  nn::Batch batch = data.get_batch(0, kBatch, 8);
  serial.loss(batch.inputs, batch.targets).backward();
  const std::vector<std::string> partial = {"h.0.ln_1.weight", "h.1.ln_2.bias", "ln_f.weight", "h.0.attn.c_proj.bias",
                                            "h.1.mlp.c_proj.bias"};
  launch(
      2,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = 2});
        std::unique_ptr<ModelRunner> owned = tp_runner(config, mesh, true);
        ModelRunner& runner = *owned;
        const nn::Module& module = runner.module();
        EXPECT_EQ(module.placement("h.0.attn.c_attn.weight"), nn::Placement::sharded(0, name(MeshDim::tp)));
        EXPECT_EQ(module.placement("h.0.mlp.c_proj.weight"), nn::Placement::sharded(1, name(MeshDim::tp)));
        auto micros = data.micro_batches(0, kBatch, 8, 1);
        runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
        const nn::StateDict params = module.state_dict();
        for (const std::string& name : partial) {
          EXPECT_EQ(module.placement(name), nn::Placement::replicated().with_partial_grad(parallel::name(MeshDim::tp))) << name;
          EXPECT_GT(max_abs_diff(params.at(name).grad(), serial.state_dict().at(name).grad().to(ctx.device)), 1e-4)
              << name << " is already whole before the all-reduce";
        }
        runner.finish_gradients();
        for (const std::string& name : partial)
          EXPECT_LT(max_abs_diff(params.at(name).grad(), serial.state_dict().at(name).grad().to(ctx.device)), 1e-5)
              << name;
      },
      quick());
}

// The Trainer's contract (model_runner.h): before_backward(last) right before each backward, the
// loss share on tp rank 0 only (0 elsewhere), the shares summing to the serial loss.
TEST(TensorParallel, RunnerHooksAndLossShare) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig config = gpt(32, 2, 16);
  const nn::TokenStream data = masked_tokens(32);
  nn::GPT serial(config, kSeed);
  nn::Batch batch = data.get_batch(0, 6, 8);
  const double serial_loss = serial.loss(batch.inputs, batch.targets).item();
  launch(
      2,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = 2});
        std::unique_ptr<ModelRunner> owned = tp_runner(config, mesh);
        ModelRunner& runner = *owned;
        std::vector<bool> calls;
        auto micros = data.micro_batches(0, 6, 8, 3);
        const double global_count = static_cast<double>(nn::counted_targets(batch.targets));
        const double share = runner.forward_backward(
            micros, global_count, 1, {[&](bool last) {
              // the previous micro-batch's backward ran before this call: wte has a gradient from the 2nd call on
              EXPECT_EQ(runner.module().state_dict().at("wte.weight").grad().defined(), !calls.empty());
              calls.push_back(last);
            }});
        EXPECT_EQ(calls, (std::vector<bool>{false, false, true}));
        EXPECT_EQ(runner.holds_loss(), mesh.tp_rank() == 0);
        if (runner.holds_loss())
          EXPECT_NEAR(share, serial_loss, 1e-5 * serial_loss);
        else
          EXPECT_EQ(share, 0.0);
      },
      quick());
}

// train --init-from: a serial model's weights (another seed) cut into the shards, and back, bitwise;
// the TP loss on them is the serial loss.
TEST(TensorParallel, LoadsTheSerialWeightsIntoItsShards) {
  SL_SKIP_UNLESS_WORLD(4);
  const nn::GPTConfig config = gpt(30, 4, 16);
  nn::GPT serial(config, kSeed + 1);
  const nn::TokenStream data = masked_tokens(30);
  nn::Batch batch = data.get_batch(0, kBatch, 8);
  const double serial_loss = serial.loss(batch.inputs, batch.targets).item();
  launch(
      4,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = 4});
        std::unique_ptr<ModelRunner> owned = tp_runner(config, mesh, true);
        ModelRunner& runner = *owned;
        runner.load_full_state_dict(serial.state_dict());
        // detach(): the serial leaves are shared by every rank thread, and .to() on a leaf that
        // requires grad would record a graph edge on it from each of them at once (a data race).
        for (const auto& [name, tensor] : runner.full_state_dict())
          EXPECT_EQ(max_abs_diff(tensor, serial.state_dict().at(name).detach().to(ctx.device)), 0.0) << name;
        auto micros = data.micro_batches(0, kBatch, 8, 1);
        const double share = runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
        if (runner.holds_loss()) {
          EXPECT_NEAR(share, serial_loss, 1e-5 * serial_loss);
        }
        nn::StateDict wrong = serial.state_dict();
        wrong["h.0.mlp.c_fc.weight"] = zeros({32, 16});
        expect_error([&] { runner.load_full_state_dict(wrong); },
                     "'h.0.mlp.c_fc.weight' is [32, 16] in the serial weights, which does not give this rank's [16, 16]");
      },
      quick());
}

// ---- refusals, before any communication ----------------------------------------------------------------

TEST(TensorParallel, RejectsHeadsNotDivisibleByTp) {
  SL_SKIP_UNLESS_WORLD(3);
  launch(
      3,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = 3});
        const uint64_t before = mesh.group(MeshDim::tp)->collectives_issued();
        expect_error([&] { tp_runner(gpt(32, 4, 16), mesh); },
                     "tensor parallel: n_head 4 does not split over tp 3");
        EXPECT_EQ(mesh.group(MeshDim::tp)->collectives_issued(), before);
      },
      quick());
}

TEST(TensorParallel, RejectsSequenceNotDivisibleByTpUnderSP) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = 2});
        std::unique_ptr<ModelRunner> runner = tp_runner(gpt(32, 2, 16), mesh, true);
        const uint64_t before = mesh.group(MeshDim::tp)->collectives_issued();
        const nn::TokenStream data = masked_tokens(32);
        auto micros = data.micro_batches(0, 2, 7, 1);
        expect_error([&] { runner->forward_backward(micros, 10, 1, {}); },
                     "sequence parallel needs T / cp (7 / 1) divisible by tp 2");
        EXPECT_EQ(mesh.group(MeshDim::tp)->collectives_issued(), before);
      },
      quick());
}

// ---- communication and activation memory, from the ledgers, against formulas ----------------------------

struct CostCase {
  int tp;
  bool sp;
};
std::string cost_name(const testing::TestParamInfo<CostCase>& info) {
  return "tp" + std::to_string(info.param.tp) + (info.param.sp ? "_sp" : "");
}
class TensorParallelCost : public testing::TestWithParam<CostCase> {};

// One forward + backward of B x T tokens on an L-layer GPT: the tp group's ledger.
//   without SP: all-reduces of S = B·T·C floats: 2 per block forward (the g's after c_proj) and 2
//     backward (the f's after ln_1, ln_2), the embedding's g, the head's f (backward); plus the
//     cross-entropy's 3 of B·T floats. Ring: 2(n-1)/n · bytes each.
//   with SP: each of the block/head all-reduces becomes an all-gather + reduce-scatter pair, (n-1)/n
//     · bytes each: the same bytes. The embedding is still all-reduced (then scattered, whose
//     backward is one more all-gather) and the loss still costs 3 all-reduces of B·T.
TEST_P(TensorParallelCost, CommunicationPerBlockMatchesMegatron) {
  const auto [tp, sp] = GetParam();
  SL_SKIP_UNLESS_WORLD(tp);
  const int64_t B = 4, T = 8, C = 16, L = 2;
  const nn::GPTConfig config{.vocab_size = 32, .block_size = T, .n_layer = L, .n_head = 4, .n_embd = C};
  const nn::TokenStream data = masked_tokens(32);
  launch(
      tp,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, {.tp = tp});
        std::unique_ptr<ModelRunner> owned = tp_runner(config, mesh, sp);
        ModelRunner& runner = *owned;
        CommLedger& ledger = mesh.group(MeshDim::tp)->ledger();
        ledger.reset();
        auto micros = data.micro_batches(0, B, T, 1);
        runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
        const double n = tp, act = B * T * C * 4.0, ce = B * T * 4.0;
        const double ring = 2 * (n - 1) / n, half = (n - 1) / n;
        const CommStats ar = ledger[CommOp::all_reduce], ag = ledger[CommOp::all_gather],
                        rs = ledger[CommOp::reduce_scatter];
        if (!sp) {
          EXPECT_EQ(ar.calls, 4 * L + 2 + 3);
          EXPECT_EQ(ar.bytes_sent, static_cast<int64_t>((4 * L + 2) * ring * act + 3 * ring * ce));
          EXPECT_EQ(ag.calls, 0);
          EXPECT_EQ(rs.calls, 0);
        } else {
          EXPECT_EQ(ar.calls, 1 + 3);
          EXPECT_EQ(ar.bytes_sent, static_cast<int64_t>(ring * act + 3 * ring * ce));
          EXPECT_EQ(ag.calls, 4 * L + 1 + 1);  // blocks, ln_f's gather, the embedding scatter's backward
          EXPECT_EQ(rs.calls, 4 * L + 1);      // blocks, the backward of ln_f's gather
          EXPECT_EQ(ag.bytes_sent, static_cast<int64_t>((4 * L + 2) * half * act));
          EXPECT_EQ(rs.bytes_sent, static_cast<int64_t>((4 * L + 1) * half * act));
          // the blocks' AG + RS move what their all-reduces would: 4L·ring·act
          EXPECT_EQ(static_cast<int64_t>(4 * L * half * act * 2), static_cast<int64_t>(4 * L * ring * act));
        }
      },
      quick());
}

// Activations one block keeps for backward, per rank: the ledger's "activations" after the forward
// of an L=4 model minus an L=2 one, halved. Korthikanti et al. (2022), Table 2, in bytes for fp16
// activations and 1-byte dropout masks, per layer (s = T, b = B, h = C, a = NH):
//   tensor parallel:            sbh(10 + 24/t + 5as/(ht))
//   tensor + sequence parallel: sbh(34 + 5as/h) / t
// In f32 with dropout 0 the masks (2sbh + as²b bytes) and the attention-dropout output (2as²b) do
// not exist, and every other term doubles. The softmax (2as²b/t) is not kept either: the blockwise
// attention core (causal_attention_packed) keeps the rows' lse [b, a/t, s] instead, 4asb/t bytes
// (its output, the heads side by side, is c_proj's input and counted there already):
//   tensor parallel:            4 · sbh(4 + 12/t) + 4asb / t
//   tensor + sequence parallel: 4 · sbh · 16 / t  + 4asb / t
// What shardlab keeps besides: LayerNorm's mean and rstd (2 floats per row, 2 LayerNorms: 16sb/t'
// bytes, t' = t under SP, else 1); and under SP the all-gathered LayerNorm outputs that c_attn and
// c_fc save, whole (2 · 4sbh), where Megatron keeps the shard and all-gathers again in backward.
TEST_P(TensorParallelCost, ActivationMemoryPerLayerMatchesKorthikanti) {
  const auto [tp, sp] = GetParam();
  SL_SKIP_UNLESS_WORLD(tp);
  const int64_t b = 2, s = 8, h = 16, a = 4;
  const nn::TokenStream data = masked_tokens(32);
  launch(
      tp,
      [&](RankContext& ctx) {
        auto kept = [&](int64_t layers) {
          const nn::GPTConfig config{.vocab_size = 32, .block_size = s, .n_layer = layers, .n_head = a, .n_embd = h};
          TensorParallelGPT model(config, kSeed, ctx.world, {.sequence_parallel = sp});
          nn::Batch batch = data.get_batch(0, b, s);
          const int64_t before = MemoryLedger::instance().current(ctx.device, MemoryCategory::activations);
          Tensor out = model.hidden(batch.inputs);
          return MemoryLedger::instance().current(ctx.device, MemoryCategory::activations) - before;
        };
        const double per_layer = static_cast<double>(kept(4) - kept(2)) / 2;
        const double t = tp, sbh = s * b * h, sb = s * b;
        const double lse = 4.0 * a * s * b / t;  // the attention core's, per rank
        const double korthikanti = (sp ? 4 * sbh * 16 / t : 4 * sbh * (4 + 12 / t)) + lse;
        const double layer_norm_stats = sp ? 16 * sb / t : 16 * sb;
        const double gathered_inputs = sp ? 2 * 4 * sbh * (1 - 1 / t) : 0;  // kept whole, not as T/t rows
        EXPECT_EQ(per_layer, korthikanti + layer_norm_stats + gathered_inputs)
            << "Korthikanti f32: " << korthikanti << " + LayerNorm stats " << layer_norm_stats << " + gathered inputs "
            << gathered_inputs;
      },
      quick());
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelCost,
                         testing::Values(CostCase{2, false}, CostCase{2, true}, CostCase{4, false}, CostCase{4, true}),
                         cost_name);

}  // namespace
}  // namespace sl::parallel
