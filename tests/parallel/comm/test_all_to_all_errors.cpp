// test_all_to_all_errors.cpp — how all_to_all fails on the threads backend (worlds 2-5):
//
//   bad arguments              -> sl::Error on the calling rank, naming the sizes, before any byte moves
//                                 (in place too; and the group still works: no sequence number was used)
//   ranks call other ops       -> debug mode: CollectiveMismatch on every rank, both fingerprints named
//   split sizes disagree       -> without debug mode too: the receiver (or a rank disagreeing with
//                                 itself) raises CollectiveMismatch naming both byte counts, every other
//                                 rank raises too, none waiting for its timeout; debug mode names the
//                                 pair on every rank
#include <chrono>

#include "tests/support/all_to_all.h"

namespace sl::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// How each rank's function ended (tests/support/parallel.h): launch must have thrown.
std::vector<RankOutcome> run_and_record(int n, const LaunchOptions& options,
                                        const std::function<void(RankContext&)>& fn) {
  std::vector<RankOutcome> outcomes;
  if (launch_recording(n, options, outcomes, fn) == kLaunchReturned) ADD_FAILURE() << "launch returned normally";
  return outcomes;
}

class AllToAllErrors : public testing::TestWithParam<int> {};

TEST_P(AllToAllErrors, BadArgumentsRaiseNamingTheSizes) {
  const int n = GetParam();
  const std::string N = std::to_string(n), rows = std::to_string(2 * n + 1);
  launch(
      n,
      [&](RankContext& ctx) {
        ProcessGroup& g = *ctx.world;
        // The equal form: dim 0 must split over n; output must have input's shape; one dtype.
        expect_error(
            [&] {
              g.all_to_all(zeros({2 * n + 1, 3}), zeros({2 * n + 1, 3}));
            },
            "input [" + rows + ", 3] has " + rows + " rows, which do not split equally over " + N + " ranks");
        expect_error(
            [&] {
              g.all_to_all(zeros({2 * n, 4}), zeros({2 * n, 3}));
            },
            "output [" + std::to_string(2 * n) + ", 4] must have input's shape [" + std::to_string(2 * n) + ", 3]");
        expect_error(
            [&] {
              g.all_to_all(zeros({2 * n, 3}, DType::f64), zeros({2 * n, 3}));
            },
            "output dtype f64 != input dtype f32");
        // The uneven form: n splits each, none negative, summing to each tensor's dim 0; rows of one shape.
        const std::vector<int64_t> ones(n, 1);
        std::vector<int64_t> one_too_many = ones, negative = ones;
        one_too_many.push_back(0);
        negative[0] = -1, negative[n - 1] += 2;  // still sums to n
        expect_error(
            [&] {
              g.all_to_all(zeros({n, 3}), zeros({n, 3}), ones, one_too_many);
            },
            "input splits list " + std::to_string(n + 1) + " sizes for a group of " + N);
        expect_error(
            [&] {
              g.all_to_all(zeros({n, 3}), zeros({n, 3}), std::vector<int64_t>(n - 1, 1), ones);
            },
            "output splits list " + std::to_string(n - 1) + " sizes for a group of " + N);
        expect_error(
            [&] {
              g.all_to_all(zeros({n, 3}), zeros({n, 3}), ones, negative);
            },
            "input split 0 is -1 (must be >= 0)");
        expect_error(
            [&] {
              g.all_to_all(zeros({n + 1, 3}), zeros({n, 3}), ones, ones);
            },
            "the output splits sum to " + N + " rows but the output [" + std::to_string(n + 1) + ", 3] has " +
                std::to_string(n + 1));
        expect_error(
            [&] {
              g.all_to_all(zeros({n, 3}), zeros({n + 2, 3}), ones, ones);
            },
            "the input splits sum to " + N + " rows but the input [" + std::to_string(n + 2) + ", 3] has " +
                std::to_string(n + 2));
        expect_error([&] { g.all_to_all(zeros({n, 4}), zeros({n, 3}), ones, ones); }, "must have rows of one shape");
        expect_error(
            [&] {
              g.all_to_all(zeros({n, 3}, DType::i64), zeros({n, 3}), ones, ones);
            },
            "output dtype i64 != input dtype f32");
        expect_error([&] { g.all_to_all(zeros({3 * n}), zeros({n, 3}), ones, ones); }, "the same number of dims");
        // In place would receive into rows not yet sent: refused, for a view of the input too.
        Tensor t = zeros({2 * n, 3}), head = t.flat_view(0, Shape({n, 3})), shifted = t.flat_view(3, Shape({n, 3}));
        expect_error([&] { g.all_to_all(t, t); }, "overlap in memory");
        expect_error([&] { g.all_to_all(shifted, head, ones, ones); }, "overlap in memory");
        // None of them was counted or numbered: the next all_to_all is #0 on every rank, and works.
        EXPECT_EQ(g.collectives_issued(), 0u);
        EXPECT_EQ(g.ledger()[CommOp::all_to_all].calls, 0);
        Tensor out = zeros({n, 3});
        g.all_to_all(out, input_of(ctx.rank, ones, Shape({3}), DType::f32), ones, ones);
        EXPECT_EQ(out.to_vector(), expected_output(ctx.rank, ones, 3));
      },
      threads_options(5000, /*debug=*/true));
}

// Debug mode: rank 0 calls all_to_all where the others call all_gather -> every rank names both.
TEST_P(AllToAllErrors, DebugModeNamesAnotherOpOnEveryRank) {
  const int n = GetParam();
  auto outcomes = run_and_record(n, threads_options(5000, /*debug=*/true), [&](RankContext& ctx) {
    Tensor t = zeros({2 * n, 3});
    if (ctx.rank == 0)
      ctx.world->all_to_all(zeros({2 * n, 3}), t);
    else
      ctx.world->all_gather(zeros({n * 2 * n, 3}), t);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].type, "mismatch") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("all_to_all #0 f32[" + std::to_string(2 * n) + ", 3]"), std::string::npos)
        << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("all_gather #0"), std::string::npos) << outcomes[r].message;
  }
}

// Debug mode: the equal form with another shape on the last rank -> every rank names both shapes.
TEST_P(AllToAllErrors, DebugModeNamesAnotherShapeOnEveryRank) {
  const int n = GetParam();
  auto outcomes = run_and_record(n, threads_options(5000, /*debug=*/true), [&](RankContext& ctx) {
    const int64_t rows = ctx.rank == n - 1 ? 4 * n : 2 * n;
    ctx.world->all_to_all(zeros({rows, 3}), zeros({rows, 3}));
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].type, "mismatch") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("f32[" + std::to_string(2 * n) + ", 3]"), std::string::npos)
        << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("f32[" + std::to_string(4 * n) + ", 3]"), std::string::npos)
        << outcomes[r].message;
  }
}

// No debug mode: rank 0 sends rank 1 one row more than rank 1's output_splits[0] expects. Rank 1
// names both byte counts; every rank fails (a rank whose own exchange went through fails in the
// barrier after it) without waiting for its timeout: nobody waits for a message that will not come.
// Every wait's deadline is its op's start + the timeout, so a rank that did wait for one would end
// the launch no sooner than the timeout after it began: the launch taking less than the timeout
// shows that none did, on any machine (a loaded one, a sanitizer's 5-20x), with no bound to tune.
TEST_P(AllToAllErrors, SplitSizesThatDisagreeFailEveryRankWithoutDebugMode) {
  const int n = GetParam();
  const SplitRule rule = split_rules()[0];
  const int64_t row_bytes = 3 * 4;
  constexpr int kTimeoutMs = 20000;
  const auto start = Clock::now();
  auto outcomes = run_and_record(n, threads_options(kTimeoutMs), [&](RankContext& ctx) {
    const int r = ctx.rank;
    std::vector<int64_t> sends = rows_sent_by(rule, r, n), receives = rows_received_by(rule, r, n);
    if (r == 0) sends[1] += 1;  // rank 1 still expects rule.rows(0, 1)
    Tensor output = zeros(stacked(sum_of(receives), Shape({3})));
    ctx.world->all_to_all(output, input_of(r, sends, Shape({3}), DType::f32), receives, sends);
    ctx.world->barrier();
  });
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(kTimeoutMs)) << "some rank waited for its timeout";
  const std::string sent = std::to_string((rule.rows(0, 1) + 1) * row_bytes),
                    expected = std::to_string(rule.rows(0, 1) * row_bytes);
  ASSERT_EQ(outcomes[1].type, "mismatch") << outcomes[1].message;
  EXPECT_NE(outcomes[1].message.find("all_to_all #0 on rank 1: rank 0 sent " + sent + " bytes where " + expected +
                                     " were expected"),
            std::string::npos)
      << outcomes[1].message;
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    // The threads backend passes rank 1's finding on as a CollectiveMismatch; a RemoteError also names it.
    EXPECT_TRUE(outcomes[r].type == "mismatch" || outcomes[r].type == "remote")
        << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("rank 1"), std::string::npos) << "rank " << r << ": " << outcomes[r].message;
  }
}

// Rank 0 sends itself one row more than its own output_splits[0] says: it names both counts, as a
// CollectiveMismatch like a disagreement with a peer (and like the MPI backend), and the rest fail too.
TEST_P(AllToAllErrors, SplitSizesARankDisagreesWithItselfOnFailEveryRank) {
  const int n = GetParam();
  const SplitRule rule = split_rules()[0];
  auto outcomes = run_and_record(n, threads_options(20000), [&](RankContext& ctx) {
    const int r = ctx.rank;
    std::vector<int64_t> sends = rows_sent_by(rule, r, n), receives = rows_received_by(rule, r, n);
    if (r == 0) sends[0] += 1;
    Tensor output = zeros(stacked(sum_of(receives), Shape({3})));
    ctx.world->all_to_all(output, input_of(r, sends, Shape({3}), DType::f32), receives, sends);
    ctx.world->barrier();
  });
  ASSERT_EQ(outcomes[0].type, "mismatch") << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("this rank sends itself " + std::to_string((rule.rows(0, 0) + 1) * 12) +
                                     " bytes but expects " + std::to_string(rule.rows(0, 0) * 12)),
            std::string::npos)
      << outcomes[0].message;
  for (int r = 1; r < n; ++r)
    EXPECT_NE(outcomes[r].message.find("rank 0"), std::string::npos) << "rank " << r << ": " << outcomes[r].message;
}

// Debug mode compares the split sizes of every pair before a byte moves (for NCCL, which has no
// other check, the only way to name them): every rank fails inside all_to_all, naming the pair.
TEST_P(AllToAllErrors, DebugModeNamesSplitSizesThatDisagreeOnEveryRank) {
  const int n = GetParam();
  const SplitRule rule = split_rules()[0];
  auto outcomes = run_and_record(n, threads_options(20000, /*debug=*/true), [&](RankContext& ctx) {
    const int r = ctx.rank;
    std::vector<int64_t> sends = rows_sent_by(rule, r, n), receives = rows_received_by(rule, r, n);
    if (r == 0) sends[1] += 1;
    Tensor output = zeros(stacked(sum_of(receives), Shape({3})));
    try {
      ctx.world->all_to_all(output, input_of(r, sends, Shape({3}), DType::f32), receives, sends);
    } catch (const CollectiveMismatch&) {
      EXPECT_EQ(ctx.world->ledger()[CommOp::all_to_all].bytes_sent, 0) << "no byte moved on rank " << r;
      throw;
    }
  });
  const std::string wanted = "rank 0 sends rank 1 " + std::to_string((rule.rows(0, 1) + 1) * 12) +
                             " bytes but rank 1 expects " + std::to_string(rule.rows(0, 1) * 12);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].type, "mismatch") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("all_to_all #0"), std::string::npos) << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find(wanted), std::string::npos) << outcomes[r].message;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllToAllErrors, testing::Values(2, 3, 4, 5), world_name);

}  // namespace
}  // namespace sl::parallel
