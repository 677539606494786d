// test_zero.cpp — FlatParams (flatten, pad, bucket, shard) and ZeRO-1/2 with and without offload
// against the serial GPT + nn::AdamW + nn::clip_grad_norm run at lr 1e-2 and weight decay 0.1 (so a
// lost or misplaced decay shows): losses, norms, gradients, parameters and the full optimizer state
// after every step, at worlds 1-4 (world 3 pads). The ledger's memory held between steps, the peak
// gradient memory during backward and the bytes each step moves are derived here from Ψ, ⌈Ψ/N⌉ and
// the paper's formulas (ZeRO-1/2 move DDP's 2(N-1)/N·4Ψ), never read back from the implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/zero/zero_adamw.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::expect_close;
using test_support::flat_values;

// ---- FlatParams ------------------------------------------------------------------------------------

TEST(FlatParams, LayoutPadsAndCutsSegmentsAtShardEdges) {
  // 6 + 5 + 4 = 15 elements over 4 ranks: S = 4, one element of padding at 15.
  FlatLayout layout({Shape({3, 2}), Shape({5}), Shape({2, 2})}, 4);
  EXPECT_EQ(layout.numel, 15);
  EXPECT_EQ(layout.padded_numel, 16);
  EXPECT_EQ(layout.shard_numel, 4);
  ASSERT_EQ(layout.segments.size(), 3u);
  EXPECT_EQ(layout.segments[1].offset, 6);
  EXPECT_TRUE(layout.segments[0].decay);
  EXPECT_FALSE(layout.segments[1].decay);
  EXPECT_TRUE(layout.segments[2].decay);
  auto r1 = layout.shard_pieces(1);  // [4, 8): seg 0 [4, 6) + seg 1 [6, 8)
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].segment, 0u);
  EXPECT_EQ(r1[0].shard_offset, 0);
  EXPECT_EQ(r1[0].segment_offset, 4);
  EXPECT_EQ(r1[0].numel, 2);
  EXPECT_EQ(r1[1].segment, 1u);
  EXPECT_EQ(r1[1].shard_offset, 2);
  EXPECT_EQ(r1[1].segment_offset, 0);
  EXPECT_EQ(r1[1].numel, 2);
  auto r3 = layout.shard_pieces(3);  // [12, 16): seg 2 [12, 15), then padding (never handed out)
  ASSERT_EQ(r3.size(), 1u);
  EXPECT_EQ(r3[0].segment, 2u);
  EXPECT_EQ(r3[0].segment_offset, 1);
  EXPECT_EQ(r3[0].numel, 3);
  expect_error([&] { layout.shard_pieces(4); }, "rank 4 is not in [0, 4)");
  expect_error([] { FlatLayout({Shape({2})}, 0); }, "world size must be at least 1 (got 0)");
}

TEST(FlatParams, BucketsInReverseOrderEachCutIntoOneChunkPerRank) {
  // 4-byte floats over 2 ranks, buckets closing at >= 12 bytes, filled from the last parameter:
  // bucket 0 = p3 [2], p2 [1] (12 bytes: 3 elements, padded to 4), bucket 1 = p1 [2], p0 [2] (4).
  FlatLayout layout({Shape({2}), Shape({2}), Shape({1}), Shape({2})}, 2, 12);
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(layout.buckets[0].segments, std::vector<size_t>({3, 2}));
  EXPECT_EQ(layout.buckets[1].segments, std::vector<size_t>({1, 0}));
  EXPECT_EQ(layout.segments[3].offset, 0);
  EXPECT_EQ(layout.segments[2].offset, 2);
  EXPECT_EQ(layout.buckets[1].offset, 4);  // after bucket 0's element of padding
  EXPECT_EQ(layout.segments[1].offset, 4);
  EXPECT_EQ(layout.segments[0].offset, 6);
  EXPECT_EQ(layout.padded_numel, 8);
  EXPECT_EQ(layout.shard_numel, 4);
  // Rank 1 owns chunk 1 of each bucket: flat [2, 4) = p2 + padding, then flat [6, 8) = p0.
  auto r1 = layout.shard_pieces(1);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].segment, 2u);
  EXPECT_EQ(r1[0].shard_offset, 0);
  EXPECT_EQ(r1[0].flat_offset, 2);
  EXPECT_EQ(r1[0].numel, 1);
  EXPECT_EQ(r1[1].segment, 0u);
  EXPECT_EQ(r1[1].shard_offset, 2);  // after rank 1's 2-element chunk of bucket 0
  EXPECT_EQ(r1[1].flat_offset, 6);
  EXPECT_EQ(r1[1].numel, 2);
}

TEST(FlatParams, ParametersBecomeViewsOfOnePaddedBuffer) {
  DeviceGuard device(Device::cpu(71));
  auto& ledger = MemoryLedger::instance();
  int64_t before = ledger.current(Device::cpu(71), MemoryCategory::weights);
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, Shape({2, 3})).set_requires_grad();
  Tensor b = from_vector({7, 8}, Shape({2})).set_requires_grad();
  Tensor a_elsewhere = a;  // another handle, as a layer holds one
  {
    FlatParams flat({a, b}, 3);  // 8 elements -> 9 (S = 3)
    EXPECT_EQ(flat.buffer().numel(), 9);
    EXPECT_EQ(flat.buffer().to_vector(), std::vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 0}));
    EXPECT_EQ(a.to_vector(), std::vector<double>({1, 2, 3, 4, 5, 6}));
    flat.shard(2).fill_(-1);  // elements 6..8: b and the padding
    EXPECT_EQ(b.to_vector(), std::vector<double>({-1, -1}));
    flat.buffer().flat_view(0, {1}).fill_(42);
    EXPECT_EQ(a_elsewhere.to_vector()[0], 42);
    // Charged to weights: the buffer's 9 floats (a's and b's old storages are gone).
    EXPECT_EQ(ledger.current(Device::cpu(71), MemoryCategory::weights) - before, 9 * 4);

    Tensor grads = zeros({9});
    flat.bind_grads(grads);
    (a * 2.0).sum().backward();
    (b * 3.0).sum().backward();
    EXPECT_EQ(grads.to_vector(), std::vector<double>({2, 2, 2, 2, 2, 2, 3, 3, 0}));
    EXPECT_EQ(flat.shard_of(grads, 1).to_vector(), std::vector<double>({2, 2, 2}));
    flat.release_grads();
    EXPECT_FALSE(a.grad().defined());

    Tensor other = full({9}, 5.0);
    flat.bind(other);
    EXPECT_EQ(b.to_vector(), std::vector<double>({5, 5}));
    flat.release();
    EXPECT_FALSE(flat.buffer().defined());
    expect_error([&] { flat.bind(zeros({8})); }, "expected a floating buffer of 9 elements (8 parameters padded");
  }
}

TEST(FlatParams, RejectsWhatCannotBeFlattened) {
  Tensor p = zeros({2}).set_requires_grad();
  expect_error([&] { FlatParams({}, 2); }, "the parameter list is empty");
  expect_error([&] { FlatParams({p, p}, 2); }, "parameter 1 appears twice");
  expect_error([&] { FlatParams({zeros({2}, DType::f64).set_requires_grad()}, 2); }, "parameter 0 is f64");
}

// ---- the serial reference ----------------------------------------------------------------------------

constexpr int kSteps = 5;
constexpr int64_t kBatch = 12, kBlock = 8;
constexpr double kMaxNorm = 0.5;
constexpr uint64_t kSeed = 5;
constexpr test_support::Tolerance kTol{.atol = 1e-5, .rtol = 1.3e-6};  // every comparison with the serial run

nn::GPTConfig small_config() { return parity_config(); }
nn::AdamWOptions adamw_options() { return parity_adamw(); }  // lr 1e-2, wd 0.1, eps 1e-6: tests/support/parallel.h says why
constexpr int64_t kSmallBuckets = 4096;  // bytes: the small GPT's 100k bytes of parameters in ~10 buckets

const nn::TokenStream& stream() {
  static const nn::TokenStream tokens = parity_tokens();
  return tokens;
}

// Host copies of what a run made on SL_TEST_DEVICE (a GPU's tensors come down; CPU ones are themselves).
Tensor on_host(const Tensor& t) { return t.device().is_cuda() ? t.to(Device::cpu()) : t; }
std::vector<float> host_values(const nn::NamedTensors& named) {
  nn::NamedTensors host;
  for (const auto& [name, t] : named) host.emplace_back(name, on_host(t));
  return flat_values(host);
}

struct Trace {  // one run, step by step; vectors are the flat (unpadded) parameter order
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> grads, params;
  nn::StateDict state;  // the optimizer's full state after the last step
};

// The serial run (tests/support/serial_run.h), clipped at kMaxNorm: the gradients the update used.
const Trace& serial() {
  static const Trace trace = [] {
    // SL_TEST_DEVICE=cuda: on cuda:0, as the ranks; else away from the ranks' cpu:0..3.
    DeviceGuard device(test_on_cuda() ? Device::cuda(0) : Device::cpu(70));
    const test_support::SerialRun run =
        test_support::serial_run({.config = small_config(),
                                  .seed = kSeed,
                                  .adamw = adamw_options(),
                                  .steps = kSteps,
                                  .clip = kMaxNorm,
                                  .grads_after_clip = true},
                                 [](int step) { return stream().get_batch(step, kBatch, kBlock); });
    Trace t;
    for (const test_support::SerialStep& step : run.steps) {
      t.losses.push_back(step.loss);
      t.norms.push_back(step.norm);
      t.grads.push_back(host_values(step.grads));
      t.params.push_back(host_values(step.params));
    }
    for (const auto& [key, tensor] : run.optimizer_state) t.state[key] = on_host(tensor);
    return t;
  }();
  return trace;
}

TEST(ZeroSerial, ReferenceClips) {
  int clipped = 0;
  for (double norm : serial().norms) clipped += norm > kMaxNorm;
  EXPECT_GT(clipped, 0) << "max_norm " << kMaxNorm << " never clips: the test would not test clipping";
}

// ---- parallel == serial ---------------------------------------------------------------------------------

struct ZeroCase {
  int stage;
  int world;
  bool offload;
  int64_t bucket_bytes = kSmallBuckets;
  bool bf16 = false;  // mixed precision: a bf16 model, bf16 gradients, an f32 master shard
};

void PrintTo(const ZeroCase& c, std::ostream* out) {
  *out << "stage " << c.stage << ", world " << c.world << (c.offload ? ", offload" : "") << ", buckets of "
       << c.bucket_bytes << " bytes" << (c.bf16 ? ", bf16" : "");
}

std::string case_name(const testing::TestParamInfo<ZeroCase>& info) {
  return "stage" + std::to_string(info.param.stage) + "_world" + std::to_string(info.param.world) +
         (info.param.offload ? "_offload" : "") + (info.param.bf16 ? "_bf16" : "");
}

// What one rank measured, per step.
struct RankRecord {
  Trace trace;
  std::vector<std::array<int64_t, kNumMemoryCategories>> held;  // bytes above the start, after each step
  std::array<int64_t, kNumMemoryCategories> peak{};             // above the start, over the run
  std::vector<std::array<CommStats, 3>> comm;                   // all_reduce, all_gather, reduce_scatter
  std::vector<int64_t> host_transfers;                          // cpu:r -> cpu:r bytes
  bool ran = false;  // under mpirun a process runs one rank: the others' records stay empty
};

constexpr CommOp kCommOps[3] = {CommOp::all_reduce, CommOp::all_gather, CommOp::reduce_scatter};

void run_rank(RankContext& ctx, const ZeroCase& c, RankRecord& record) {
  auto& ledger = MemoryLedger::instance();
  std::array<int64_t, kNumMemoryCategories> start{};
  for (int k = 0; k < kNumMemoryCategories; ++k) start[k] = ledger.current(ctx.device, MemoryCategory(k));
  ledger.reset_peak(ctx.device);

  nn::GPT model(small_config(), kSeed);
  ZeroAdamW optimizer(
      model.parameters(), ctx.world,
      {.stage = c.stage, .offload = c.offload, .adamw = adamw_options(), .bucket_bytes = c.bucket_bytes});
  const int64_t rows = kBatch / c.world;
  ledger.reset_peak(ctx.device);  // the peaks below are those of the steps, not of the construction

  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    nn::Batch batch = stream().get_batch(step, kBatch, kBlock, ctx.rank * rows, (ctx.rank + 1) * rows);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    loss.backward();
    Tensor global_loss = loss.detach().clone();
    ctx.world->all_reduce(global_loss, ReduceOp::avg);  // for the record; outside the step's accounting
    record.trace.losses.push_back(global_loss.item());

    std::array<CommStats, 3> before;
    for (int k = 0; k < 3; ++k) before[k] = ctx.world->ledger()[kCommOps[k]];
    int64_t transfers_before = ledger.transferred(ctx.device, ctx.device);
    record.trace.norms.push_back(optimizer.clip_grad_norm(kMaxNorm));
    optimizer.step();
    std::array<CommStats, 3> moved;
    for (int k = 0; k < 3; ++k) {
      CommStats now = ctx.world->ledger()[kCommOps[k]];
      moved[k] = {now.calls - before[k].calls, now.bytes_sent - before[k].bytes_sent,
                  now.bytes_received - before[k].bytes_received};
    }
    record.comm.push_back(moved);
    record.host_transfers.push_back(ledger.transferred(ctx.device, ctx.device) - transfers_before);
    std::array<int64_t, kNumMemoryCategories> held{};
    for (int k = 0; k < kNumMemoryCategories; ++k) held[k] = ledger.current(ctx.device, MemoryCategory(k)) - start[k];
    record.held.push_back(held);

    // After the accounting: the gradients this step used (gathered at stage 2) and the new parameters.
    record.trace.grads.push_back(on_host(optimizer.gather_gradients()).values<float>());  // parameter order
    record.trace.params.push_back(host_values(model.named_parameters()));
  }
  for (int k = 0; k < kNumMemoryCategories; ++k) record.peak[k] = ledger.peak(ctx.device, MemoryCategory(k)) - start[k];
  for (const auto& [key, tensor] : optimizer.full_state_dict()) record.trace.state[key] = on_host(tensor);
  record.ran = true;
}

const RankRecord& first_that_ran(const std::vector<RankRecord>& records) {
  for (const RankRecord& record : records)
    if (record.ran) return record;
  return records.at(0);
}

class Zero : public testing::TestWithParam<ZeroCase> {};

// SL_TEST_DEVICE=cuda (tests/support/parallel.h): the serial run on cuda:0, the ranks on the GPU(s);
// offload keeps the optimizer state, the master and the update on each rank's host.
TEST_P(Zero, MatchesSerial) {
  const ZeroCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(c.world);
  const Trace& want = serial();
  std::vector<RankRecord> records(c.world);
  launch(
      c.world, [&](RankContext& ctx) { run_rank(ctx, c, records[ctx.rank]); }, on_test_device(quick(20000), c.world));

  for (int r = 0; r < c.world; ++r) {
    const RankRecord& got = records[r];
    if (!got.ran) continue;
    const std::string at = "rank " + std::to_string(r);
    for (int step = 0; step < kSteps; ++step) {
      const std::string when = at + " step " + std::to_string(step);
      EXPECT_NEAR(got.trace.losses[step], want.losses[step], kTol.bound(want.losses[step])) << when;
      EXPECT_NEAR(got.trace.norms[step], want.norms[step], kTol.bound(want.norms[step])) << when;
      expect_close(got.trace.grads[step], want.grads[step], kTol, when + " gradients");
      expect_close(got.trace.params[step], want.params[step], kTol, when + " parameters");
    }
    EXPECT_EQ(got.trace.norms, first_that_ran(records).trace.norms) << at << ": every rank must clip by the same norm";
    // The full optimizer state, in nn::AdamW's format.
    ASSERT_EQ(got.trace.state.size(), want.state.size()) << at;
    for (const auto& [name, tensor] : want.state) {
      ASSERT_TRUE(got.trace.state.count(name)) << at << " lacks " << name;
      const Tensor& mine = got.trace.state.at(name);
      ASSERT_EQ(mine.shape(), tensor.shape()) << name;
      if (tensor.dtype() == DType::i64)
        EXPECT_EQ(mine.item(), tensor.item()) << at << " " << name;
      else
        expect_close(mine.values<float>(), tensor.values<float>(), kTol, at + " " + name);
    }
  }
}

// Ψ and the largest parameter, from the model's shapes alone.
struct ModelFigures {
  int64_t psi = 0, largest = 0;
  std::vector<int64_t> numels;  // per parameter, in order
};
ModelFigures model_figures() {
  ModelFigures f;
  nn::GPT model(small_config(), kSeed);
  for (const Tensor& p : model.parameters()) {
    f.psi += p.numel();
    f.largest = std::max(f.largest, p.numel());
    f.numels.push_back(p.numel());
  }
  return f;
}

// The buckets' sizes by the rule of zero_adamw.h (DDP's): parameters in reverse order, a bucket closing
// once it holds bucket_bytes or more; each padded up to a multiple of N (its N chunks equal; the pad is
// zeros that belong to no parameter).
struct BucketFigures {
  int64_t padded = 0;         // P: Σ over buckets of N⌈Ψ_b/N⌉
  int64_t largest = 0;        // the largest bucket, padded
  int64_t largest_chunk = 0;  // its chunk: largest / N
};
BucketFigures bucket_figures(const ModelFigures& f, int64_t n, int64_t bucket_bytes) {
  std::vector<int64_t> buckets{0};
  for (size_t k = f.numels.size(); k-- > 0;) {
    if (4 * buckets.back() >= bucket_bytes) buckets.push_back(0);
    buckets.back() += f.numels[k];
  }
  BucketFigures b;
  for (int64_t numel : buckets) {
    const int64_t padded = (numel + n - 1) / n * n;
    b.padded += padded;
    b.largest = std::max(b.largest, padded);
  }
  b.largest_chunk = b.largest / n;
  return b;
}

// One bucket: P = N ⌈Ψ/N⌉ exactly, so every figure is a formula of Ψ and N.
TEST_P(Zero, MemoryAndCommunicationMatchTheFormulas) {
  ZeroCase c = GetParam();
  c.bucket_bytes = FlatLayout::kOneBucket;
  SL_SKIP_UNLESS_WORLD(c.world);
  std::vector<RankRecord> records(c.world);
  launch(
      c.world, [&](RankContext& ctx) { run_rank(ctx, c, records[ctx.rank]); }, quick());

  const int64_t n = c.world, psi = model_figures().psi;
  const int64_t S = (psi + n - 1) / n, P = n * S;  // ⌈Ψ/N⌉ and Ψ padded to N of them
  const int64_t ddp_bytes = 2 * (n - 1) * 4 * S;   // DDP's ring all-reduce 2(N-1)/N·4P
  for (int r = 0; r < c.world; ++r) {
    const RankRecord& got = records[r];
    if (!got.ran) continue;
    auto held_of = [&](int step, MemoryCategory k) { return got.held[step][static_cast<int>(k)]; };
    for (int step = 0; step < kSteps; ++step) {
      const std::string when = "rank " + std::to_string(r) + " after step " + std::to_string(step);
      EXPECT_EQ(held_of(step, MemoryCategory::weights), 4 * P) << when;
      // Stage 1: the flat buffer (my shard is a view of it); stage 2: the shard only.
      EXPECT_EQ(held_of(step, MemoryCategory::grads), c.stage == 1 ? 4 * P : 4 * S) << when;
      EXPECT_EQ(held_of(step, MemoryCategory::optimizer), c.offload ? 0 : 8 * S) << when;
      // Offload: exp_avg, exp_avg_sq, the master weight shard and the gradient shard on the host.
      EXPECT_EQ(held_of(step, MemoryCategory::offload), c.offload ? 16 * S : 0) << when;

      const std::array<CommStats, 3>& moved = got.comm[step];
      const CommStats &all_reduce = moved[0], &all_gather = moved[1], &reduce_scatter = moved[2];
      EXPECT_EQ(all_reduce.calls, 0) << when;
      EXPECT_EQ(reduce_scatter.calls, c.stage == 1 ? 1 : 0) << when;  // stage 2 reduced during backward
      EXPECT_EQ(all_gather.calls, 2) << when;                         // the norm's partial sums, then the parameters
      // The weights' all-gather plus the gradients' reduce-scatter are DDP's all-reduce, byte for byte.
      const int64_t weights_gathered = all_gather.bytes_sent - (n - 1) * 8;
      EXPECT_EQ(weights_gathered, (n - 1) * 4 * S) << when;
      if (c.stage == 1) {
        EXPECT_EQ(reduce_scatter.bytes_sent + weights_gathered, ddp_bytes) << when;
      }
      EXPECT_EQ(all_gather.bytes_received, all_gather.bytes_sent) << when;
      // Offload: the gradient shard down, the weight shard up (cpu:r -> cpu:r on this build).
      EXPECT_EQ(got.host_transfers[step], c.offload ? 2 * 4 * S : 0) << when;
    }
    // Stage 2's gradient bytes over the whole run: the reduce-scatters ran inside backward.
    const int64_t grads_peak = got.peak[static_cast<int>(MemoryCategory::grads)];
    if (c.stage == 1)
      EXPECT_EQ(grads_peak, 4 * P);  // the flat buffer: the reduce-scatter lands in it
    else  // the shard + the one bucket (the whole model) + the first gradient, which arrives before it
      EXPECT_LE(grads_peak, 4 * S + 4 * P + 4 * model_figures().largest);
  }
}

// Stage 2 with small buckets: during backward a rank holds its gradient shard and a bounded number of
// buckets (those launched and not yet waited, kBucketsInFlight, and the one being filled), never the
// whole 4Ψ. A bucket closes at >= bucket_bytes, so it holds at most bucket_bytes + the largest
// parameter, plus N-1 elements of padding.
TEST(ZeroStage2, PeakGradientMemoryIsTheShardPlusBoundedBuckets) {
  for (int world : {2, 4}) {
    SL_SKIP_UNLESS_WORLD(world);
    std::vector<int64_t> peaks(world, -1);
    launch(
        world,
        [&](RankContext& ctx) {
          auto& ledger = MemoryLedger::instance();
          const int64_t start = ledger.current(ctx.device, MemoryCategory::grads);
          nn::GPT model(small_config(), kSeed);
          ZeroAdamW optimizer(model.parameters(), ctx.world,
                              {.stage = 2, .adamw = adamw_options(), .bucket_bytes = kSmallBuckets});
          ledger.reset_peak(ctx.device);
          for (int step = 0; step < 2; ++step) {
            optimizer.zero_grad();
            const int64_t rows = kBatch / world;
            nn::Batch batch = stream().get_batch(step, kBatch, kBlock, ctx.rank * rows, (ctx.rank + 1) * rows);
            model.loss(batch.inputs, batch.targets).backward();
            optimizer.step();
          }
          peaks[ctx.rank] = ledger.peak(ctx.device, MemoryCategory::grads) - start;
        },
        quick());
    const ModelFigures f = model_figures();
    const int64_t n = world;
    const int64_t bucket_bound = kSmallBuckets + 4 * f.largest + 4 * (n - 1);
    // 4Ψ/N, padded per bucket (fewer than 20 buckets of 4 KiB in this model's 30 KB)
    const int64_t bound =
        4 * ((f.psi + n - 1) / n) + 4 * 20 * (n - 1) + (ZeroAdamW::kBucketsInFlight + 1) * bucket_bound + 4 * f.largest;
    for (int r = 0; r < world; ++r) {
      if (peaks[r] < 0) continue;
      EXPECT_LE(peaks[r], bound) << "world " << world << " rank " << r << ": 4Ψ = " << 4 * f.psi;
      EXPECT_GE(peaks[r], 4 * f.psi / n) << "world " << world << " rank " << r;
      EXPECT_LT(peaks[r], 4 * f.psi) << "stage 2 must never hold the whole gradient";
    }
    std::printf("[   info   ] world %d: peak gradient bytes %lld, bound %lld, 4Ψ/N %lld, 4Ψ %lld\n", world,
                (long long)peaks[0], (long long)bound, (long long)(4 * f.psi / n), (long long)(4 * f.psi));
  }
}

// ZeRO-2's bound at the peak (zero.h). Between steps a rank holds e·S bytes of gradients: its shard
// (e = 4 in f32, 2 in bf16; S = P/N, P = Ψ padded per bucket). During backward it holds that plus the
// buckets in flight: kBucketsInFlight reduce-scatters launched and not yet waited, and the bucket
// being filled, each at most the largest bucket B_max, plus one gradient that arrived before its
// bucket existed (at most the largest parameter, Ψ_max):
//     peak − held  ≤  (kBucketsInFlight + 1) · e · B_max  +  e · Ψ_max
// B_max, P and Ψ_max come from the model's shapes and the bucket rule (bucket_figures above); the
// peaks from the ledger's "grads" of each rank's device. The buckets hold the same number of elements
// in both dtypes, so the bound stays below holding every bucket (e·P), which it must catch.
TEST(ZeroStage2, PeakAboveHeldIsAtMostTheBucketsInFlight) {
  for (bool bf16 : {false, true})
    for (int world : {2, 4}) {
      SL_SKIP_UNLESS_WORLD(world);
      std::vector<int64_t> held(world, -1), peak(world, -1);
      launch(
          world,
          [&](RankContext& ctx) {
            auto& ledger = MemoryLedger::instance();
            nn::GPTConfig config = small_config();
            nn::AdamWOptions adamw = adamw_options();
            if (bf16) {
              config.param_dtype = DType::bf16;
              adamw.master_weights = true;
            }
            nn::GPT model(config, kSeed);
            const int64_t start = ledger.current(ctx.device, MemoryCategory::grads);
            ZeroAdamW optimizer(model.parameters(), ctx.world,
                                {.stage = 2, .adamw = adamw, .bucket_bytes = kSmallBuckets * (bf16 ? 2 : 4) / 4});
            const int64_t rows = kBatch / world;
            for (int step = 0; step < 2; ++step) {
              optimizer.zero_grad();
              held[ctx.rank] = ledger.current(ctx.device, MemoryCategory::grads) - start;  // between steps
              ledger.reset_peak(ctx.device);
              nn::Batch batch = stream().get_batch(step, kBatch, kBlock, ctx.rank * rows, (ctx.rank + 1) * rows);
              model.loss(batch.inputs, batch.targets).backward();
              optimizer.clip_grad_norm(kMaxNorm);
              optimizer.step();
              peak[ctx.rank] = std::max(peak[ctx.rank], ledger.peak(ctx.device, MemoryCategory::grads) - start);
            }
          },
          quick());
      const ModelFigures f = model_figures();
      const int64_t n = world, e = bf16 ? 2 : 4;
      // Buckets of kSmallBuckets·e/4 bytes: the same elements per bucket in both dtypes (kSmallBuckets/4).
      const BucketFigures b = bucket_figures(f, n, kSmallBuckets);
      const int64_t S = b.padded / n;
      const int64_t bound = (ZeroAdamW::kBucketsInFlight + 1) * e * b.largest + e * f.largest;
      ASSERT_LT(bound, e * b.padded) << "the bound must be below holding every bucket, or the test could not fail";
      for (int r = 0; r < world; ++r) {
        if (peak[r] < 0) continue;
        const std::string who = (bf16 ? "bf16" : "f32") + std::string(" world ") + std::to_string(world) +
                                " rank " + std::to_string(r);
        EXPECT_EQ(held[r], e * S) << who << ": between steps, the gradient shard alone";
        EXPECT_LE(peak[r] - held[r], bound) << who << ": peak " << peak[r] << ", held " << held[r];
        EXPECT_GT(peak[r] - held[r], 0) << who << ": backward fills buckets";
      }
      std::printf("[   info   ] %s world %d: peak - held %lld <= bound %lld (every bucket: %lld)\n",
                  bf16 ? "bf16" : "f32", world, (long long)(peak[0] - held[0]), (long long)bound,
                  (long long)(e * b.padded));
    }
}

// The peak of every category, from before the model is built through two steps, as the paper has it
// (f32, Ψ from the shapes, N ranks, buckets of kSmallBuckets bytes, P = Ψ padded per bucket, S = P/N).
// Mixed precision (bf16 cases) is the same table with e = 2 bytes per weight and gradient element and
// the optimizer's 12S (master + moments); the 16-bit gradients are read in f32 a block at a time, so
// no f32 gradient shard appears; the f32 model that GPT draws before rounding is not ZeRO's, so the
// peaks are taken from after the model is built:
//   weights    4P; while the model moves into the flat buffers, at most 4P + one bucket (never 8Ψ)
//   grads      ZeRO-1: 4P, the flat buffer, its reduce-scatter in place (no shard beside it)
//              ZeRO-2: 4S + the buckets in flight (kBucketsInFlight launched + the one filling, each
//              at most the largest bucket) + one gradient that arrives before its bucket exists
//   optimizer  8S (offload: 0)        offload  16S: m, v, the master weight shard, the gradient shard
//   comm       one reduce-scatter's ring scratch at a time (two chunks of the largest bucket); the
//              all-gathers write into the weights in place
class ZeroPeak : public testing::TestWithParam<ZeroCase> {};

void print_peaks(const std::string& who, const std::array<int64_t, kNumMemoryCategories>& stepped,
                 const std::array<int64_t, kNumMemoryCategories>& built, int64_t e, int64_t P, int64_t S,
                 int64_t largest) {
  auto at = [](const std::array<int64_t, kNumMemoryCategories>& a, MemoryCategory k) { return a[static_cast<int>(k)]; };
  std::printf(
      "[   info   ] %s: peaks weights %lld (built %lld) grads %lld optimizer %lld offload %lld comm %lld;"
      " %lldP %lld %lldS %lld largest bucket %lld\n",
      who.c_str(), (long long)at(stepped, MemoryCategory::weights), (long long)at(built, MemoryCategory::weights),
      (long long)at(stepped, MemoryCategory::grads), (long long)at(stepped, MemoryCategory::optimizer),
      (long long)at(stepped, MemoryCategory::offload), (long long)at(stepped, MemoryCategory::comm), (long long)e,
      (long long)(e * P), (long long)e, (long long)(e * S), (long long)(e * largest));
}

TEST_P(ZeroPeak, EveryCategoryAsThePaper) {
  const ZeroCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  std::vector<std::array<int64_t, kNumMemoryCategories>> built(c.world), stepped(c.world);
  std::vector<int64_t> transferred(c.world, 0);  // cpu:r -> cpu:r: offload's link on this build
  std::vector<char> ran(c.world, 0);
  launch(
      c.world,
      [&](RankContext& ctx) {
        auto& ledger = MemoryLedger::instance();
        std::array<int64_t, kNumMemoryCategories> start{};
        for (int k = 0; k < kNumMemoryCategories; ++k) start[k] = ledger.current(ctx.device, MemoryCategory(k));
        ledger.reset_peak(ctx.device);
        nn::GPTConfig config = small_config();
        nn::AdamWOptions adamw = adamw_options();
        if (c.bf16) {
          config.param_dtype = DType::bf16;
          adamw.master_weights = true;
        }
        nn::GPT model(config, kSeed);
        if (c.bf16) ledger.reset_peak(ctx.device);
        ZeroAdamW optimizer(model.parameters(), ctx.world,
                            {.stage = c.stage, .offload = c.offload, .adamw = adamw, .bucket_bytes = c.bucket_bytes});
        for (int k = 0; k < kNumMemoryCategories; ++k)
          built[ctx.rank][k] = ledger.peak(ctx.device, MemoryCategory(k)) - start[k];
        ledger.reset_peak(ctx.device);
        const int64_t rows = kBatch / c.world;
        const int64_t moved0 = ledger.transferred(ctx.device, ctx.device);
        for (int step = 0; step < 2; ++step) {
          optimizer.zero_grad();
          nn::Batch batch = stream().get_batch(step, kBatch, kBlock, ctx.rank * rows, (ctx.rank + 1) * rows);
          model.loss(batch.inputs, batch.targets).backward();
          optimizer.clip_grad_norm(kMaxNorm);
          optimizer.step();
        }
        for (int k = 0; k < kNumMemoryCategories; ++k)
          stepped[ctx.rank][k] = ledger.peak(ctx.device, MemoryCategory(k)) - start[k];
        transferred[ctx.rank] = ledger.transferred(ctx.device, ctx.device) - moved0;
        ran[ctx.rank] = 1;
      },
      quick());

  const ModelFigures f = model_figures();
  const int64_t n = c.world;
  const int64_t e = c.bf16 ? 2 : 4, K = c.bf16 ? 12 : 8;                 // bytes per weight/gradient; optimizer bytes
  const BucketFigures b = bucket_figures(f, n, c.bucket_bytes * 4 / e);  // buckets close at bucket_bytes / e elements
  const int64_t P = b.padded, S = P / n;
  ASSERT_GE(P, f.psi);
  ASSERT_LT(P, f.psi + n * f.psi / (c.bucket_bytes / e) + n);  // at most N-1 pad elements per bucket
  auto at = [](const std::array<int64_t, kNumMemoryCategories>& a, MemoryCategory k) { return a[static_cast<int>(k)]; };
  for (int r = 0; r < c.world; ++r) {
    if (!ran[r]) continue;
    const std::string who = "rank " + std::to_string(r);
    EXPECT_LE(at(built[r], MemoryCategory::weights), e * P + e * b.largest)
        << who << ": built, the weights + one bucket";
    EXPECT_LT(at(built[r], MemoryCategory::weights), 2 * e * f.psi) << who << ": built, never two copies";
    EXPECT_EQ(at(stepped[r], MemoryCategory::weights), e * P) << who;
    if (c.stage == 1) {
      EXPECT_EQ(at(stepped[r], MemoryCategory::grads), e * P) << who;
    } else {
      const int64_t in_flight = (ZeroAdamW::kBucketsInFlight + 1) * e * b.largest + e * f.largest;
      EXPECT_LE(at(stepped[r], MemoryCategory::grads), e * S + in_flight) << who;
      EXPECT_GE(at(stepped[r], MemoryCategory::grads), e * S) << who;
    }
    // Offload's host: the f32 master, the f32 gradient the update reads, and the moments (16S either way).
    EXPECT_EQ(at(stepped[r], MemoryCategory::optimizer), c.offload ? 0 : K * S) << who;
    EXPECT_EQ(at(stepped[r], MemoryCategory::offload), c.offload ? 16 * S : 0) << who;
    EXPECT_LE(at(stepped[r], MemoryCategory::comm), n == 1 ? 0 : 2 * e * b.largest_chunk) << who;
    // Offload's link per step (zero.h): the gradient shard down and the weight shard up, each in the
    // device's dtype (e S bytes: 2S in bf16, as DeepSpeed moves 16-bit gradients and weights); two steps.
    EXPECT_EQ(transferred[r], c.offload ? 2 * (e * S + e * S) : 0) << who << ": bytes over the host link";
    print_peaks(who, stepped[r], built[r], e, P, S, b.largest);
  }
}

std::vector<ZeroCase> all_cases() {
  std::vector<ZeroCase> cases;
  for (bool offload : {false, true})
    for (int stage : {1, 2})
      for (int world : {1, 2, 3, 4}) cases.push_back({stage, world, offload});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Stages, Zero, testing::ValuesIn(all_cases()), case_name);
std::vector<ZeroCase> peak_cases() {
  std::vector<ZeroCase> cases = all_cases();
  for (bool offload : {false, true})
    for (int stage : {1, 2})
      for (int world : {2, 3}) cases.push_back({stage, world, offload, kSmallBuckets, /*bf16=*/true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroPeak, testing::ValuesIn(peak_cases()), case_name);

// ---- the rest of the contract ---------------------------------------------------------------------------

// Gradients that backward put outside the flat buffer (the model's own zero_grad() dropped the views)
// are copied in: the step equals the one with optimizer.zero_grad().
TEST(ZeroUsage, GradientsOutsideTheFlatBufferAreCollected) {
  SL_SKIP_UNLESS_WORLD(2);
  for (int stage : {1, 2}) {
    std::vector<std::vector<float>> params(2);
    launch(
        2,
        [&](RankContext& ctx) {
          for (int variant = 0; variant < 2; ++variant) {
            nn::GPT model(small_config(), kSeed);
            ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = stage, .adamw = adamw_options()});
            for (int step = 0; step < 2; ++step) {
              if (variant == 0)
                optimizer.zero_grad();
              else
                model.zero_grad();
              nn::Batch batch = stream().get_batch(step, kBatch, kBlock, ctx.rank * 6, ctx.rank * 6 + 6);
              model.loss(batch.inputs, batch.targets).backward();
              optimizer.clip_grad_norm(kMaxNorm);
              optimizer.step();
            }
            if (ctx.rank == 0) params[variant] = flat_values(model.named_parameters());
          }
        },
        quick());
    EXPECT_EQ(params[0], params[1]) << "stage " << stage;
  }
}

// Micro-batches between zero_grad() and step() accumulate, also when a reduce ran between them.
TEST(ZeroUsage, GradientAccumulationAcrossAReduce) {
  SL_SKIP_UNLESS_WORLD(2);
  for (int stage : {1, 2}) {
    std::vector<std::vector<float>> params(2);
    launch(
        2,
        [&](RankContext& ctx) {
          for (int variant = 0; variant < 2; ++variant) {
            nn::GPT model(small_config(), kSeed);
            ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = stage, .adamw = adamw_options()});
            optimizer.zero_grad();
            for (int micro = 0; micro < 2; ++micro) {  // rows [6r + 3m, 6r + 3m + 3)
              nn::Batch batch =
                  stream().get_batch(0, kBatch, kBlock, ctx.rank * 6 + micro * 3, ctx.rank * 6 + micro * 3 + 3);
              (model.loss(batch.inputs, batch.targets) * 0.5).backward();
              if (variant == 1 && micro == 0) optimizer.reduce_gradients();
            }
            optimizer.step();
            if (ctx.rank == 0) params[variant] = flat_values(model.named_parameters());
          }
        },
        quick());
    expect_close(params[1], params[0], kTol, "stage " + std::to_string(stage) + " reduced between micro-batches");
  }
}

// A sharded state loads from nn::AdamW's state dict and gives it back whole.
TEST(ZeroUsage, FullStateDictRoundTripsThroughLoad) {
  SL_SKIP_UNLESS_WORLD(3);
  const nn::StateDict& serial_state = serial().state;
  launch(
      3,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = 2, .offload = true, .adamw = adamw_options()});
        EXPECT_TRUE(optimizer.full_state_dict().empty());  // as nn::AdamW before its first step
        optimizer.load_full_state_dict(serial_state);
        EXPECT_EQ(optimizer.step_count(), kSteps);
        nn::StateDict back = optimizer.full_state_dict();
        ASSERT_EQ(back.size(), serial_state.size());
        for (const auto& [name, tensor] : serial_state)
          EXPECT_EQ(back.at(name).to_vector(), tensor.to_vector()) << name;
        // ...and what it gives back loads into the serial optimizer.
        nn::AdamW serial_optimizer(model.parameters(), adamw_options());
        serial_optimizer.load_state_dict(back);
        EXPECT_EQ(serial_optimizer.state(3).buffers.at("exp_avg_sq").to_vector(),
                  serial_state.at("state.3.exp_avg_sq").to_vector());
        EXPECT_EQ(serial_optimizer.state(3).step, kSteps);
      },
      quick());
}

TEST(ZeroUsage, MisuseRaisesClearErrors) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        expect_error([&] { ZeroAdamW(model.parameters(), nullptr); }, "ZeroAdamW: the process group is null");
        expect_error([&] { ZeroAdamW(model.parameters(), ctx.world, {.stage = 3}); }, "stage must be 1 or 2 (got 3)");
        expect_error(
            [&] {
              ZeroAdamW({zeros({2, 2})}, ctx.world);
            },
            "parameter 0 (shape [2, 2]) does not require grad");
        expect_error([&] { ZeroAdamW(model.parameters(), ctx.world, {.adamw = {.lr = -1}}); }, "must not be negative");
        ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = 1});
        optimizer.zero_grad();
        expect_error([&] { optimizer.grad_shard(); }, "have not been reduced since the last zero_grad() or backward");
        expect_error([&] { optimizer.clip_grad_norm(0); }, "max_norm must be positive (got 0)");
        nn::StateDict state = serial().state;
        state.erase("state.3.exp_avg");
        expect_error([&] { optimizer.load_full_state_dict(state); }, "'state.3.exp_avg' is missing");
        state["state.3.exp_avg"] = zeros({2, 2});
        expect_error([&] { optimizer.load_full_state_dict(state); }, "'state.3.exp_avg' is f32 [2, 2] but parameter 3");
      },
      quick());
}

}  // namespace
}  // namespace sl::parallel
