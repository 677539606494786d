// test_comm_hook.cpp — DDP communication hooks (parallel/data_parallel/comm_hook.h): a hook that
// all-reduces and multiplies by 1/N gives the built-in's gradients bitwise; reduce-scatter + all-gather
// and the library's two-level all-reduce give them to rounding, the two-level one with the bytes of its
// formula; a hook runs once per bucket of each synced backward, never under no_sync; a hook reaches DDP
// through train's options, and the divergence finder names a wrong one; refusals.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/data_parallel/comm_hook.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/nd/parallelize_options.h"
#include "parallel/runner/micro_batches.h"
#include "parallel/train/divergence.h"
#include "parallel/train/train_run.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

constexpr int64_t kBatch = 12;
constexpr uint64_t kSeed = 5;
nn::GPTConfig small_config() { return nn::GPTConfig{32, 8, 2, 2, 16, 0.0}; }

const nn::TokenStream& tokens() {
  static const nn::TokenStream stream = parity_tokens();
  return stream;
}

// Every rank's gradients (flat, in parameter order) after one backward of its rows under DDP with
// `hook` (empty: the built-in all-reduce) and 4 KiB buckets (several per model).
std::vector<std::vector<float>> ddp_gradients(int world, const CommHookFactory& hook) {
  std::vector<std::vector<float>> grads(world);
  launch(
      world,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{.bucket_bytes = 4096, .comm_hook = hook});
        ASSERT_GT(ddp.num_buckets(), 2);
        const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
        const nn::Batch batch = tokens().get_batch(0, kBatch, small_config().block_size, rows.begin, rows.end);
        model.loss(batch.inputs, batch.targets).backward();
        for (const Tensor& p : model.parameters()) {
          const std::vector<double> g = p.grad().to_vector();
          grads[ctx.rank].insert(grads[ctx.rank].end(), g.begin(), g.end());
        }
      },
      quick(10000));
  return grads;
}

// reduce_scatter (sum) of the bucket padded to a multiple of N, all_gather, then × 1/N.
CommHookFactory reduce_scatter_all_gather_hook() {
  return [](const ProcessGroupPtr& group) -> CommHook {
    return [group](const Tensor& bucket) {
      const int n = group->size();
      const int64_t chunk = (bucket.numel() + n - 1) / n;
      Tensor padded = zeros(Shape({chunk * n}), bucket.options()), mine = zeros(Shape({chunk}), bucket.options());
      padded.flat_view(0, bucket.shape()).copy_(bucket);
      group->reduce_scatter(mine, padded, ReduceOp::sum);
      group->all_gather(padded, mine);
      bucket.copy_(padded.flat_view(0, bucket.shape()));
      bucket.mul_(1.0 / n);
    };
  };
}

class CommHookWorld : public testing::TestWithParam<int> {};

TEST_P(CommHookWorld, AllReduceThenOneOverNEqualsTheBuiltInBitwise) {
  const int world = GetParam();
  SL_SKIP_UNDER_MPI("compares two DDP runs of thread ranks");
  const std::vector<std::vector<float>> built_in = ddp_gradients(world, {}), hooked = ddp_gradients(world, all_reduce_hook());
  for (int r = 0; r < world; ++r) EXPECT_EQ(hooked[r], built_in[r]) << "rank " << r;
}

// The ring reduce-scatter starts chunk c's sum at rank c+1, the all-reduce at rank c: the same terms
// added in another order, so equal to rounding, not bitwise.
TEST_P(CommHookWorld, ReduceScatterAllGatherMatchesTheBuiltIn) {
  const int world = GetParam();
  SL_SKIP_UNDER_MPI("compares two DDP runs of thread ranks");
  const std::vector<std::vector<float>> built_in = ddp_gradients(world, {});
  const std::vector<std::vector<float>> hooked = ddp_gradients(world, reduce_scatter_all_gather_hook());
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(hooked[r].size(), built_in[r].size());
    for (size_t i = 0; i < hooked[r].size(); ++i)
      ASSERT_NEAR(hooked[r][i], built_in[r][i], 1e-7 + 1e-5 * std::abs(built_in[r][i])) << "rank " << r << " element " << i;
    EXPECT_EQ(hooked[r], hooked[0]) << "rank " << r << ": every replica holds the same average";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommHookWorld, testing::Values(2, 3, 4), world_name);

// Pairs at worlds 2, 4, 6: the built-in's values to rounding.
TEST(CommHook, TwoLevelAllReduceMatchesTheBuiltIn) {
  SL_SKIP_UNDER_MPI("compares two DDP runs of thread ranks");
  for (int world : {2, 4, 6}) {
    const std::vector<std::vector<float>> built_in = ddp_gradients(world, {});
    const std::vector<std::vector<float>> hooked = ddp_gradients(world, two_level_all_reduce_hook(2));
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < hooked[r].size(); ++i)
        ASSERT_NEAR(hooked[r][i], built_in[r][i], 1e-7 + 1e-5 * std::abs(built_in[r][i]))
            << "world " << world << " rank " << r << " element " << i;
  }
}

// Rank r's bucket holds r + 1: after the hook every rank holds the mean (exact in f32), and each rank
// sent the bytes of comm_hook.h's formula: a pair's first rank S (broadcast) + 2(P-1)/P·S (across),
// its second rank S (send), S = 4·numel, P pairs.
TEST(CommHook, TwoLevelAllReduceSendsTheBytesOfItsFormula) {
  SL_SKIP_UNDER_MPI("reads each thread rank's sub-group ledgers");
  for (int world : {2, 4, 8}) {
    const int pairs = world / 2;
    const int64_t numel = 1000, S = 4 * numel;
    launch(
        world,
        [&](RankContext& ctx) {
          const TwoLevelGroups g = make_two_level_groups(ctx.world, 2);
          ASSERT_EQ(g.across != nullptr, ctx.rank % 2 == 0) << "rank " << ctx.rank;
          EXPECT_EQ(g.local->global_rank(0), ctx.rank / 2 * 2);
          Tensor bucket = full(Shape({numel}), static_cast<double>(ctx.rank + 1));
          two_level_all_reduce(bucket, g);
          EXPECT_EQ(bucket.to_vector(), std::vector<double>(numel, (world + 1) / 2.0)) << "rank " << ctx.rank;
          const CommLedger& local = g.local->ledger();
          const int64_t across = g.across ? g.across->ledger()[CommOp::all_reduce].bytes_sent : 0;
          if (ctx.rank % 2 == 0) {
            EXPECT_EQ(local[CommOp::broadcast].bytes_sent, S) << "world " << world << " rank " << ctx.rank;
            EXPECT_EQ(local[CommOp::send].bytes_sent, 0);
            EXPECT_EQ(across, 2 * (pairs - 1) * S / pairs) << "world " << world << " rank " << ctx.rank;
          } else {
            EXPECT_EQ(local[CommOp::send].bytes_sent, S) << "world " << world << " rank " << ctx.rank;
            EXPECT_EQ(local[CommOp::broadcast].bytes_sent, 0);
          }
        },
        quick(10000));
  }
}

// A hook runs once per bucket in a synced backward, in bucket order, and never under no_sync.
TEST(CommHook, RunsOncePerBucketOfASyncedBackward) {
  SL_SKIP_UNDER_MPI("counts calls on thread ranks");
  launch(
      2,
      [&](RankContext& ctx) {
        std::vector<int64_t> sizes;
        CommHookFactory counting = [&sizes](const ProcessGroupPtr& group) -> CommHook {
          CommHook inner = all_reduce_hook()(group);
          return [&sizes, inner](const Tensor& bucket) {
            sizes.push_back(bucket.numel());
            inner(bucket);
          };
        };
        nn::GPT model(small_config(), kSeed);
        DistributedDataParallel ddp(model, ctx.world, DDPOptions{.bucket_bytes = 4096, .comm_hook = counting});
        const nn::Batch batch = tokens().get_batch(0, 2, small_config().block_size, ctx.rank, ctx.rank + 1);
        {
          auto guard = ddp.no_sync();
          model.loss(batch.inputs, batch.targets).backward();
        }
        EXPECT_TRUE(sizes.empty()) << "no hook under no_sync";
        model.loss(batch.inputs, batch.targets).backward();
        std::vector<int64_t> want;
        for (const BucketLayout& b : ddp.bucket_layout()) want.push_back(b.numel);
        EXPECT_EQ(sizes, want);
        EXPECT_EQ(ddp.timeline().buckets.size(), want.size());
      },
      quick(10000));
}

// train's options carry a hook into the layout find_divergence builds: the library's two-level hook
// over dp 4 stays within the bounds; a hook that forgets the 1/N is named at step 0's gradients.
TrainOptions finder_options(int dp, const CommHookFactory& hook) {
  TrainOptions o;
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 16;
  o.batch_size = 8, o.steps = 2, o.warmup_steps = 0, o.lr = 1e-2;
  o.dp = dp;
  o.ddp_comm_hook = hook;
  o.resolve();
  o.validate();
  return o;
}

DivergenceReport find_with(int dp, const CommHookFactory& hook) {
  TrainRun run;
  prepare_run(run, finder_options(dp, hook), /*writer=*/false);
  return find_divergence(run);
}

TEST(CommHookInALayout, TwoLevelHookShowsNoDivergence) {
  SL_SKIP_UNDER_MPI("the finder runs thread ranks");
  std::atomic<int> built{0};
  CommHookFactory two_level = [&built](const ProcessGroupPtr& group) {
    ++built;
    return two_level_all_reduce_hook(2)(group);
  };
  const DivergenceReport report = find_with(4, two_level);
  EXPECT_EQ(report.first(), nullptr) << first_divergence_text(report);
  EXPECT_EQ(built.load(), 4) << "one hook per rank";
}

TEST(CommHookInALayout, TheFinderNamesAHookThatSumsWithoutAveraging) {
  SL_SKIP_UNDER_MPI("the finder runs thread ranks");
  CommHookFactory sum_only = [](const ProcessGroupPtr& group) -> CommHook {
    return [group](const Tensor& bucket) { group->all_reduce(bucket, ReduceOp::sum); };
  };
  const DivergenceReport report = find_with(2, sum_only);
  const Comparison* first = report.first();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->step, 0);
  EXPECT_EQ(first->phase, "backward");
  EXPECT_EQ(report.at_same_place(*first).size(), 2u) << "both replicas hold twice the gradient";
}

TEST(CommHookErrors, RefusedWithoutDDPAndGroupsThatDoNotSplit) {
  ParallelizeOptions zero1;
  zero1.parallelism.dp_shard = 2;
  zero1.dp_strategy = DpStrategy::zero1;
  zero1.ddp_comm_hook = all_reduce_hook();
  expect_error([&] { check_layout(zero1, 2); },
               "a DDP communication hook reduces DDP's buckets, but the data-parallel strategy is zero1");
  SL_SKIP_UNDER_MPI("builds DDP on thread ranks");
  expect_error(
      [] {
        launch(
            4,
            [](RankContext& ctx) {
              nn::GPT model(small_config(), kSeed);
              DistributedDataParallel ddp(model, ctx.world, DDPOptions{.comm_hook = two_level_all_reduce_hook(3)});
            },
            quick(10000));
      },
      "the data-parallel group's 4 ranks do not split into groups of 3");
}

}  // namespace
}  // namespace sl::parallel
