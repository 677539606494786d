// test_data_parallel.cpp — naive DP and DDP against the serial run (losses, gradients, parameters
// over 5 AdamW steps with clipping; again at lr 1e-2 and weight decay 0.1, DataParallelWeightDecay), their
// communication against the formulas (ledger), DDP's memory (16Ψ per rank), gradient accumulation under no_sync, the
// bucket timeline, and misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "tensor/ledger.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::at;
using test_support::expect_close;
using test_support::named_grads;

constexpr int64_t kBatch = 12;  // divisible by 1, 2, 3, 4
constexpr int kSteps = 5;
constexpr test_support::Tolerance kTol{.atol = 1e-5, .rtol = 1.3e-6};
constexpr uint64_t kSeed = 5;

nn::GPTConfig small_config() { return nn::GPTConfig{32, 8, 2, 2, 16, 0.0}; }
// lr 1e-3, not 1e-2: AdamW divides by sqrt(v) + eps, so a gradient that is mathematically zero (the
// key bias: softmax ignores a shift shared by all keys) is float noise of ~1e-11 that AdamW turns
// into an update of up to lr · noise / eps. Any change of summation order (the ring's, the split
// batch's) changes that noise: at lr 1e-2 it alone reaches the 1e-5 tolerance on parameters, at 1e-3
// it stays near 7% of it. The gradients themselves agree within ~2% of the tolerance.
nn::AdamWOptions adamw_options() {
  nn::AdamWOptions options;
  options.lr = 1e-3;
  return options;
}

// The token stream of tests/parallel/zero/test_zero.cpp: the same serial reference for every data-parallel layout.
const nn::TokenStream& tokens() {
  static const nn::TokenStream stream = parity_tokens();
  return stream;
}

// The micro-batch j of optimizer step s when each step takes `micro` of them.
nn::Batch batch_for(int64_t step, int micro, int j, int64_t row_begin = 0, int64_t row_end = -1) {
  return tokens().get_batch(step * micro + j, kBatch, small_config().block_size, row_begin, row_end);
}

// The serial reference (tests/support/serial_run.h): one model, the whole batch (the `micro`
// micro-batches concatenated, their mean loss in one backward), clipped at 1.
test_support::SerialRun run_serial(int micro = 1, const nn::AdamWOptions& options = adamw_options()) {
  const test_support::SerialOptions serial{
      .config = small_config(), .seed = kSeed, .adamw = options, .steps = kSteps, .clip = 1.0};
  return test_support::serial_run(serial, [&](int s) {
    std::vector<Tensor> inputs, targets;
    for (int j = 0; j < micro; ++j) {
      nn::Batch b = batch_for(s, micro, j);
      inputs.push_back(b.inputs);
      targets.push_back(b.targets);
    }
    return nn::Batch{cat(inputs, 0), cat(targets, 0)};  // the mean over micro·B rows
  });
}

// ---- parallel == serial ----------------------------------------------------------------------------

enum class Mode { naive, ddp };
struct LayoutCase {
  Mode mode;
  int world;
  int64_t bucket_bytes;  // DDP only
  const char* bucket_name;
};

std::string layout_name(const testing::TestParamInfo<LayoutCase>& info) {
  const LayoutCase& c = info.param;
  if (c.mode == Mode::naive) return "naive_world" + std::to_string(c.world);
  return "ddp_world" + std::to_string(c.world) + "_bucket_" + c.bucket_name;
}

std::vector<LayoutCase> layout_cases() {
  std::vector<LayoutCase> cases;
  for (int world : {1, 2, 3, 4}) {
    cases.push_back({Mode::naive, world, 0, ""});
    cases.push_back({Mode::ddp, world, DDPOptions::kBucketPerParameter, "per_parameter"});
    cases.push_back({Mode::ddp, world, 4096, "4KiB"});
    cases.push_back({Mode::ddp, world, DDPOptions{}.bucket_bytes, "default"});
    cases.push_back({Mode::ddp, world, DDPOptions::kOneBucket, "one"});
  }
  return cases;
}

class DataParallel : public testing::TestWithParam<LayoutCase> {};

// Runs the layout for kSteps steps with `options` and compares every rank with the serial records.
void expect_matches_serial(const LayoutCase& c, const test_support::SerialRun& serial,
                           const nn::AdamWOptions& options) {
  launch(
      c.world,
      [&](RankContext& ctx) {
        // Replicas start from different weights: the broadcast from rank 0 must make them equal.
        nn::GPT model(small_config(), kSeed + 100 * ctx.rank);
        const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
        const std::vector<Tensor> params = model.parameters();
        if (c.mode == Mode::naive) {
          NaiveDataParallel dp(model, ctx.world, kBatch, small_config().block_size);
          std::unique_ptr<nn::AdamW> optimizer;  // rank 0's alone
          if (ctx.rank == 0) optimizer = std::make_unique<nn::AdamW>(params, options);
          for (int s = 0; s < kSteps; ++s) {
            if (optimizer) optimizer->zero_grad();
            double loss = dp.forward_backward(ctx.rank == 0 ? batch_for(s, 1, 0) : nn::Batch{});
            const test_support::SerialStep& want = serial.steps[s];
            EXPECT_TRUE(kTol.admits(loss, want.loss)) << "loss " << loss << " vs " << want.loss;
            if (ctx.rank != 0) continue;
            expect_close(named_grads(model), want.grads, kTol, at("gradient", ctx.rank, s));
            nn::clip_grad_norm(params, 1.0);
            optimizer->step();
            expect_close(model.named_parameters(), want.params, kTol, at("parameter", ctx.rank, s));
          }
          dp.replicate();  // the workers see the last update only now
          expect_close(model.named_parameters(), serial.steps.back().params, kTol,
                       at("replicated parameter", ctx.rank, kSteps));
          return;
        }
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{c.bucket_bytes});
        nn::AdamW optimizer(params, options);
        for (int s = 0; s < kSteps; ++s) {
          ddp.zero_grad();
          nn::Batch batch = batch_for(s, 1, 0, rows.begin, rows.end);
          Tensor loss = model.loss(batch.inputs, batch.targets);  // the mean over this rank's rows
          loss.backward();
          Tensor global_loss = loss.detach().clone();
          ctx.world->all_reduce(global_loss, ReduceOp::avg);
          const test_support::SerialStep& want = serial.steps[s];
          EXPECT_TRUE(kTol.admits(global_loss.item(), want.loss)) << global_loss.item() << " vs " << want.loss;
          expect_close(named_grads(model), want.grads, kTol, at("gradient", ctx.rank, s));
          nn::clip_grad_norm(params, 1.0);  // the averaged gradients are the same everywhere: so is the clip
          ddp.step(optimizer);
          expect_close(model.named_parameters(), want.params, kTol, at("parameter", ctx.rank, s));
        }
      },
      on_test_device(quick(20000), c.world));  // SL_TEST_DEVICE=cuda: on the GPU(s)
}

// SL_TEST_DEVICE=cuda (tests/support/parallel.h): the serial reference on cuda:0, the DDP ranks on
// the GPU(s); naive DP skips (its scatter and gather pack host buffers).
TEST_P(DataParallel, MatchesSerial) {
  const LayoutCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  if (c.mode == Mode::naive) SL_SKIP_ON_TEST_CUDA("naive DP packs its scatter and gather in host buffers");
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(c.world);
  const DeviceGuard on_device(test_device());
  expect_matches_serial(c, run_serial(), adamw_options());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallel, testing::ValuesIn(layout_cases()), layout_name);

// ---- weight decay at lr 1e-2, wd 0.1 ---------------------------------------------------------------
// At the default lr 1e-3 decay moves a weight by lr·wd·p = 1e-4·p per step, near the tolerance. Here
// it is 1e-3·p: LayerNorm's weights (1.0) would move by 1e-3 a step if decayed, 100 x atol.
// (eps 1e-6: at lr 1e-2, see the note on adamw_options.)
nn::AdamWOptions decay_options(double weight_decay = 0.1) {
  nn::AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = weight_decay;
  options.eps = 1e-6;
  return options;
}

// The rule both sides share, checked on its own so that breaking it in nn::AdamW cannot pass as
// "parallel == serial": one step from the same weights and gradients with wd 0.1 and with wd 0
// differs by exactly lr·wd·p0 on the matrices (rank >= 2) and not at all on biases and LayerNorm.
void expect_decay_only_on_matrices() {
  nn::GPT decayed(small_config(), kSeed), plain(small_config(), kSeed);
  const std::vector<float> before = [&] {
    std::vector<float> all;
    for (const Tensor& p : decayed.parameters()) {
      std::vector<float> v = p.values<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }();
  for (nn::GPT* model : {&decayed, &plain}) {
    nn::AdamW optimizer(model->parameters(), decay_options(model == &decayed ? 0.1 : 0.0));
    nn::Batch batch = batch_for(0, 1, 0);
    model->loss(batch.inputs, batch.targets).backward();
    optimizer.step();
  }
  const nn::NamedTensors a = decayed.named_parameters(), b = plain.named_parameters();
  size_t offset = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    std::vector<float> x = a[t].second.values<float>(), y = b[t].second.values<float>();
    const bool matrix = a[t].second.dim() >= 2;
    for (size_t i = 0; i < x.size(); ++i) {
      // p' = p0 - lr·wd·p0 - adam, against p0 - adam: the difference is lr·wd·p0 (to f32 rounding).
      const double want = matrix ? -1e-2 * 0.1 * before[offset + i] : 0.0;
      ASSERT_NEAR(static_cast<double>(x[i]) - y[i], want, matrix ? 1e-7 + 1e-3 * std::abs(want) : 0.0)
          << a[t].first << "[" << i << "]: " << (matrix ? "decay missing or wrong" : "decayed, but it is not a matrix");
    }
    offset += x.size();
  }
}

class DataParallelWeightDecay : public testing::TestWithParam<LayoutCase> {};

TEST_P(DataParallelWeightDecay, MatchesSerialOverFiveStepsAtLr1e2Wd01) {
  const LayoutCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  expect_decay_only_on_matrices();
  expect_matches_serial(c, run_serial(1, decay_options()), decay_options());
}

std::vector<LayoutCase> decay_cases() {
  std::vector<LayoutCase> cases;
  for (int world : {2, 3}) {
    cases.push_back({Mode::naive, world, 0, ""});
    cases.push_back({Mode::ddp, world, 4096, "4KiB"});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelWeightDecay, testing::ValuesIn(decay_cases()), layout_name);

// ---- DDP: communication and memory from the ledgers ---------------------------------------------

// Bytes one rank sends and receives in a ring all-reduce of `count` f32 elements over n ranks,
// walking the ring's schedule: chunk i has count/n elements, plus one for the first count % n.
std::pair<int64_t, int64_t> ring_all_reduce_bytes(int64_t count, int n, int r) {
  if (n == 1) return {0, 0};
  auto size = [&](int i) { return count / n + (i < count % n ? 1 : 0); };
  auto mod = [&](int a) { return ((a % n) + n) % n; };
  int64_t sent = 0, received = 0;
  for (int k = 0; k < n - 1; ++k) {  // reduce-scatter, then all-gather
    sent += size(mod(r - k)) + size(mod(r + 1 - k));
    received += size(mod(r - k - 1)) + size(mod(r - k));
  }
  return {4 * sent, 4 * received};
}

class DDPLedger : public testing::TestWithParam<LayoutCase> {};

TEST_P(DDPLedger, AllReduceBytesAndMemoryMatchTheFormulas) {
  const LayoutCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  launch(
      c.world,
      [&](RankContext& ctx) {
        MemoryLedger& memory = MemoryLedger::instance();
        auto held = [&](MemoryCategory category) { return memory.current(ctx.device, category); };
        const int64_t weights0 = held(MemoryCategory::weights), grads0 = held(MemoryCategory::grads),
                      optimizer0 = held(MemoryCategory::optimizer);
        nn::GPT model(small_config(), kSeed);
        const int64_t psi = model.num_parameters();
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{c.bucket_bytes});
        nn::AdamW optimizer(model.parameters(), adamw_options());
        const int n = ctx.world_size, r = ctx.rank;

        int64_t want_sent = 0, want_received = 0;
        bool every_bucket_divides = true;
        for (const BucketLayout& bucket : ddp.bucket_layout()) {
          auto [sent, received] = ring_all_reduce_bytes(bucket.numel, n, r);
          want_sent += sent;
          want_received += received;
          every_bucket_divides = every_bucket_divides && bucket.numel % n == 0;
        }
        if (c.bucket_bytes == DDPOptions::kOneBucket) {
          EXPECT_EQ(ddp.num_buckets(), 1);
        }
        if (c.bucket_bytes == DDPOptions::kBucketPerParameter) {
          EXPECT_EQ(ddp.num_buckets(), static_cast<int>(model.parameters().size()));
        }
        const RowRange rows = data_parallel_rows(kBatch, r, n);
        for (int s = 0; s < 3; ++s) {
          ddp.zero_grad();
          nn::Batch batch = batch_for(s, 1, 0, rows.begin, rows.end);
          const CommStats before = ctx.world->ledger()[CommOp::all_reduce];
          model.loss(batch.inputs, batch.targets).backward();
          const CommStats after = ctx.world->ledger()[CommOp::all_reduce];
          EXPECT_EQ(after.calls - before.calls, ddp.num_buckets()) << "step " << s;
          EXPECT_EQ(after.bytes_sent - before.bytes_sent, want_sent) << "step " << s;
          EXPECT_EQ(after.bytes_received - before.bytes_received, want_received) << "step " << s;
          // The formula of the issue, exact when every bucket's chunks are equal.
          if (every_bucket_divides) {
            EXPECT_EQ(after.bytes_sent - before.bytes_sent, 2 * (n - 1) * 4 * psi / n);
          }
          nn::clip_grad_norm(model.parameters(), 1.0);
          ddp.step(optimizer);
        }
        // Held between steps: weights 4Ψ + gradients 4Ψ (the buckets) + AdamW's two moments 8Ψ = 16Ψ.
        EXPECT_EQ(held(MemoryCategory::weights) - weights0, 4 * psi);
        EXPECT_EQ(held(MemoryCategory::grads) - grads0, 4 * psi);
        EXPECT_EQ(held(MemoryCategory::optimizer) - optimizer0, 8 * psi);
        RecordProperty("rank" + std::to_string(r) + "_peak_bytes", std::to_string(memory.peak(ctx.device)));
      },
      quick(10000));
}

// The peak of every category over two steps, from before the model is built (f32, Ψ from the shapes):
// weights 4Ψ, grads 4Ψ (the buckets, which the all-reduces average in place), AdamW's moments 8Ψ,
// nothing offloaded. comm: building DDP broadcasts all the weights end to end through one flat copy
// (4Ψ); the steps' all-reduces run in place and need none.
// Mixed precision (a bf16 model, bf16 buckets, AdamW's f32 master), the paper's 2 + 2 + 12: weights 2Ψ,
// grads 2Ψ, optimizer 12Ψ; the broadcast's flat copy 2Ψ.
TEST_P(DDPLedger, PeakOfEveryCategoryIsThePapers) {
  const LayoutCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  int64_t psi = 0;
  for (const Tensor& p : nn::GPT(small_config(), kSeed).parameters()) psi += p.numel();
  for (bool bf16 : {false, true}) {
    launch(
        c.world,
        [&](RankContext& ctx) {
          MemoryLedger& memory = MemoryLedger::instance();
          auto peak = [&](MemoryCategory category) { return memory.peak(ctx.device, category); };
          std::array<int64_t, kNumMemoryCategories> start{};
          for (int k = 0; k < kNumMemoryCategories; ++k) start[k] = memory.current(ctx.device, MemoryCategory(k));
          memory.reset_peak(ctx.device);
          nn::GPTConfig config = small_config();
          nn::AdamWOptions adamw = adamw_options();
          if (bf16) {
            config.param_dtype = DType::bf16;
            adamw.master_weights = true;
          }
          nn::GPT model(config, kSeed);
          DistributedDataParallel ddp(model, ctx.world, DDPOptions{c.bucket_bytes});
          nn::AdamW optimizer(model.parameters(), adamw);
          const int64_t built_comm = peak(MemoryCategory::comm) - start[static_cast<int>(MemoryCategory::comm)];
          memory.reset_peak(ctx.device);
          const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
          for (int s = 0; s < 2; ++s) {
            ddp.zero_grad();
            nn::Batch batch = batch_for(s, 1, 0, rows.begin, rows.end);
            model.loss(batch.inputs, batch.targets).backward();
            nn::clip_grad_norm(model.parameters(), 1.0);
            ddp.step(optimizer);
          }
          auto above = [&](MemoryCategory k) { return peak(k) - start[static_cast<int>(k)]; };
          const int64_t e = bf16 ? 2 : 4, K = bf16 ? 12 : 8;  // bytes per weight/gradient; optimizer bytes
          const std::string when = bf16 ? "bf16" : "f32";
          EXPECT_EQ(above(MemoryCategory::weights), e * psi) << when;
          EXPECT_EQ(above(MemoryCategory::grads), e * psi) << when;
          EXPECT_EQ(above(MemoryCategory::optimizer), K * psi) << when;
          EXPECT_EQ(above(MemoryCategory::offload), 0) << when;
          EXPECT_EQ(above(MemoryCategory::comm), 0) << "the all-reduces average the buckets in place";
          EXPECT_EQ(built_comm, e * psi) << "the broadcast's flat copy of the weights";
        },
        quick(10000));
  }
}

std::vector<LayoutCase> ddp_cases() {
  std::vector<LayoutCase> cases;
  for (const LayoutCase& c : layout_cases())
    if (c.mode == Mode::ddp) cases.push_back(c);
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, DDPLedger, testing::ValuesIn(ddp_cases()), layout_name);

// ---- DDP: gradient accumulation under no_sync ------------------------------------------------------

class DDPNoSync : public testing::TestWithParam<LayoutCase> {};

// k = 2 micro-batches under no_sync, then one synced: each micro-batch's mean loss is scaled by
// 1/(k+1), so the accumulated, averaged gradient is the serial one of the 3 batches concatenated.
TEST_P(DDPNoSync, AccumulationMatchesSerialOnTheConcatenatedBatches) {
  const LayoutCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  constexpr int kMicro = 3;
  const test_support::SerialRun serial = run_serial(kMicro);
  launch(
      c.world,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        const std::vector<Tensor> params = model.parameters();
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{c.bucket_bytes});
        nn::AdamW optimizer(params, adamw_options());
        const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
        for (int s = 0; s < kSteps; ++s) {
          ddp.zero_grad();
          const int64_t calls_before = ctx.world->ledger()[CommOp::all_reduce].calls;
          for (int j = 0; j < kMicro; ++j) {
            nn::Batch batch = batch_for(s, kMicro, j, rows.begin, rows.end);
            auto backward = [&] { (model.loss(batch.inputs, batch.targets) * (1.0 / kMicro)).backward(); };
            if (j < kMicro - 1) {
              auto guard = ddp.no_sync();
              backward();
              EXPECT_EQ(ctx.world->ledger()[CommOp::all_reduce].calls, calls_before) << "no_sync launched a bucket";
            } else {
              backward();
            }
          }
          EXPECT_EQ(ctx.world->ledger()[CommOp::all_reduce].calls - calls_before, ddp.num_buckets());
          expect_close(named_grads(model), serial.steps[s].grads, kTol, at("gradient", ctx.rank, s));
          nn::clip_grad_norm(params, 1.0);
          ddp.step(optimizer);
          expect_close(model.named_parameters(), serial.steps[s].params, kTol, at("parameter", ctx.rank, s));
        }
      },
      quick(20000));
}

std::vector<LayoutCase> no_sync_cases() {
  std::vector<LayoutCase> cases;
  for (int world : {1, 2, 3, 4}) {
    cases.push_back({Mode::ddp, world, DDPOptions::kBucketPerParameter, "per_parameter"});
    cases.push_back({Mode::ddp, world, DDPOptions{}.bucket_bytes, "default"});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, DDPNoSync, testing::ValuesIn(no_sync_cases()), layout_name);

// ---- DDP: the timeline of one backward -------------------------------------------------------------

TEST(DDPTimeline, BucketsLaunchInOrderAndFinishBeforeBackwardReturns) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{4096});
        ASSERT_GT(ddp.num_buckets(), 2);
        // The first bucket holds the last parameters (ln_f), the last one the first (wte).
        EXPECT_EQ(ddp.bucket_layout().front().names.front(), "ln_f.bias");
        EXPECT_EQ(ddp.bucket_layout().back().names.back(), "wte.weight");
        const RowRange rows = data_parallel_rows(kBatch, ctx.rank, 2);
        nn::Batch batch = batch_for(0, 1, 0, rows.begin, rows.end);
        Tensor loss = model.loss(batch.inputs, batch.targets);
        const auto before_backward = std::chrono::steady_clock::now();
        loss.backward();
        const auto after_backward = std::chrono::steady_clock::now();
        BackwardTimeline timeline = ddp.timeline();
        ASSERT_EQ(static_cast<int>(timeline.buckets.size()), ddp.num_buckets());
        EXPECT_LE(before_backward, timeline.first_gradient);
        EXPECT_LE(timeline.last_gradient, timeline.synchronized);
        EXPECT_LE(timeline.synchronized, after_backward);
        for (size_t b = 0; b < timeline.buckets.size(); ++b) {
          const BucketEvent& e = timeline.buckets[b];
          EXPECT_EQ(e.bucket, static_cast<int>(b));
          EXPECT_EQ(e.bytes, 4 * ddp.bucket_layout()[b].numel);
          EXPECT_LE(timeline.first_gradient, e.launched);
          EXPECT_LE(e.launched, e.finished);
          EXPECT_LE(e.finished, timeline.synchronized);
          if (b > 0) {
            EXPECT_LE(timeline.buckets[b - 1].launched, e.launched);
          }
        }
        // Every bucket but the last was launched before backward's compute ended: that is the overlap.
        EXPECT_LT(timeline.buckets.front().launched, timeline.last_gradient);
      },
      quick(10000));
}

// ---- naive DP: the five exchanges of every step ------------------------------------------------------

class NaiveDataParallelLedger : public testing::TestWithParam<int> {};

TEST_P(NaiveDataParallelLedger, FiveExchangesPerStep) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(
      n,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        const int64_t psi = model.num_parameters(), T = small_config().block_size, V = small_config().vocab_size;
        const int64_t R = kBatch / n;
        NaiveDataParallel dp(model, ctx.world, kBatch, T);
        const bool root = ctx.rank == 0;
        for (int s = 0; s < 2; ++s) {
          for (int e = 0; e < kNumExchanges; ++e) dp.ledger(static_cast<Exchange>(e)).reset();
          dp.forward_backward(root ? batch_for(s, 1, 0) : nn::Batch{});
          // {op, calls, bytes sent, bytes received} this rank should see in each exchange's group.
          struct Want {
            CommOp op;
            int64_t calls, sent, received;
          };
          auto p2p = [&](Exchange e, bool root_sends, int64_t bytes) {
            bool i_send = root == root_sends;
            int64_t count = root ? n - 1 : 1;
            CommLedger& ledger = dp.ledger(e);
            CommOp mine = i_send ? CommOp::send : CommOp::recv, other = i_send ? CommOp::recv : CommOp::send;
            EXPECT_EQ(ledger[mine].calls, count) << exchange_name(e);
            EXPECT_EQ(i_send ? ledger[mine].bytes_sent : ledger[mine].bytes_received, count * bytes)
                << exchange_name(e);
            EXPECT_EQ(ledger[other].calls, 0) << exchange_name(e);
            EXPECT_EQ(ledger.total().calls, count) << exchange_name(e);
          };
          if (n == 1) {  // nobody to talk to: only the (empty) broadcast is called
            for (int e = 0; e < kNumExchanges; ++e)
              EXPECT_EQ(dp.ledger(static_cast<Exchange>(e)).total().bytes_sent, 0);
            EXPECT_EQ(dp.ledger(Exchange::replicate_model)[CommOp::broadcast].calls, 1);
            continue;
          }
          p2p(Exchange::scatter_batch, true, R * T * 8);                // i64 inputs
          p2p(Exchange::gather_outputs, false, R * T * V * 4);          // f32 logits
          p2p(Exchange::scatter_loss_grad, true, (R * T * V + 1) * 4);  // f32 d loss / d logits, and the loss
          p2p(Exchange::gather_grads, false, 4 * psi);                  // f32 gradients
          CommStats broadcast = dp.ledger(Exchange::replicate_model)[CommOp::broadcast];
          EXPECT_EQ(broadcast.calls, 1);
          EXPECT_EQ(broadcast.bytes_sent, ctx.rank < n - 1 ? 4 * psi : 0);  // a chain 0 -> 1 -> ... -> n-1
          EXPECT_EQ(broadcast.bytes_received, root ? 0 : 4 * psi);
        }
      },
      quick(10000));
}

INSTANTIATE_TEST_SUITE_P(Worlds, NaiveDataParallelLedger, testing::Values(1, 2, 3, 4), world_name);

// ---- misuse ----------------------------------------------------------------------------------------

TEST(DataParallelErrors, BatchRowsMustDivideByTheWorld) {
  expect_error([] { data_parallel_rows(10, 0, 3); },
               "data parallel: the global batch of 10 rows cannot be split evenly over 3 ranks (10 % 3 = 1)");
  EXPECT_EQ(data_parallel_rows(12, 2, 4).begin, 6);
  EXPECT_EQ(data_parallel_rows(12, 2, 4).end, 9);
  SL_SKIP_UNLESS_WORLD(3);
  // Every rank checks before communicating, so all of them fail alike and nobody hangs.
  expect_error(
      [] {
        launch(
            3,
            [](RankContext& ctx) {
              nn::GPT model(small_config(), kSeed);
              NaiveDataParallel dp(model, ctx.world, 10, small_config().block_size);
            },
            quick(5000));
      },
      "the global batch of 10 rows cannot be split evenly over 3 ranks");
}

TEST(DDPErrors, BucketBytesMustBePositive) {
  SL_SKIP_UNLESS_WORLD(1);
  for (int64_t bytes : {int64_t{0}, int64_t{-5}})
    expect_error(
        [&] {
          launch(
              1,
              [&](RankContext& ctx) {
                nn::GPT model(small_config(), kSeed);
                DistributedDataParallel ddp(model, ctx.world, DDPOptions{bytes});
              },
              quick(5000));
        },
        "DistributedDataParallel: bucket_bytes must be positive (got " + std::to_string(bytes) + ")");
}

TEST(DDPErrors, StepWithBucketsNotReducedNamesTheParametersWithoutGradient) {
  SL_SKIP_UNLESS_WORLD(1);
  launch(
      1,
      [](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{DDPOptions::kBucketPerParameter});
        nn::AdamW optimizer(model.parameters(), adamw_options());
        model.ln_f->weight.sum().backward();  // one parameter gets a gradient, the others none
        expect_error([&] { ddp.step(optimizer); }, "these parameters got no gradient: wte.weight, wpe.weight");
        expect_error([&] { ddp.zero_grad(); }, "unused parameters are not supported");
      },
      quick(5000));
}

TEST(NaiveDataParallelErrors, RankZeroMustPassTheDeclaredBatch) {
  SL_SKIP_UNLESS_WORLD(1);
  launch(
      1,
      [](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        NaiveDataParallel dp(model, ctx.world, kBatch, small_config().block_size);
        expect_error([&] { dp.forward_backward(nn::Batch{}); }, "rank 0 must pass the global batch");
        expect_error([&] { dp.forward_backward(tokens().get_batch(0, 6, 8)); },
                     "the batch has inputs [6, 8] and targets [6, 8] but [12, 8] was declared");
      },
      quick(5000));
}

}  // namespace
}  // namespace sl::parallel
