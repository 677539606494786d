// test_mpi_all_to_all.cpp — all_to_all on the MPI backend (MPI_Ialltoallv, after an uncounted exchange
// of the split sizes), one process per rank, in the world mpirun gives. The same worked-out values as
// the threads tests (tests/support/all_to_all.h); run with the other MPI suites:
//   tools/mpi_tests.sh build/tests/shardlab_tests          (mpirun -np 2, then -np 4)
// Outside mpirun these tests skip. Every rank asserts what it sees itself; mpirun fails when any rank does.
#include <chrono>

#include "tests/support/all_to_all.h"
#include "tests/support/mpi.h"

namespace sl::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Equal chunks of 2 rows for rows of several shapes and dtypes: exact values, and the ledger counts
// what left the rank, (n-1)/n of the input, as measured bytes (not the ring model of the other collectives).
TEST(MpiAllToAll, EqualChunksExactValuesAndLedger) {
  SKIP_UNLESS_UNDER_MPIRUN();
  launch(
      mpirun_world_size(),
      [](RankContext& ctx) {
        const int n = ctx.world_size, r = ctx.rank;
        const std::vector<int64_t> two_each(n, 2);
        int64_t total_bytes = 0;
        for (auto [dtype, row] : {std::pair{DType::f32, Shape({2, 3})}, std::pair{DType::f64, Shape({3})},
                                  std::pair{DType::i64, Shape({2, 2})}}) {
          Tensor input = input_of(r, two_each, row, dtype), output = zeros(input.shape(), dtype);
          ctx.world->all_to_all(output, input);
          EXPECT_EQ(output.to_vector(), expected_output(r, two_each, row.numel())) << "rank " << r << ", " << row;
          total_bytes += 2 * n * row.numel() * static_cast<int64_t>(dtype_size(dtype));
        }
        const CommStats stats = ctx.world->ledger()[CommOp::all_to_all];
        EXPECT_EQ(stats.calls, 3);
        EXPECT_EQ(stats.bytes_sent, (n - 1) * total_bytes / n);
        EXPECT_EQ(stats.bytes_received, (n - 1) * total_bytes / n);
        const std::string report = ctx.world->ledger().report();
        const size_t line = report.find("all_to_all");
        ASSERT_NE(line, std::string::npos) << report;
        EXPECT_EQ(report.substr(line, report.find('\n', line) - line).find("model"), std::string::npos) << report;
      },
      mpi_options());
}

// Uneven chunks from both rules (empty chunks, and rank 0 sending nothing at all), on the world and on
// a sub-group in reversed rank order: exact values, and the bytes of the rows that left the rank.
TEST(MpiAllToAll, UnevenChunksOnTheWorldAndASubGroup) {
  SKIP_UNLESS_UNDER_MPIRUN();
  launch(
      mpirun_world_size(),
      [](RankContext& ctx) {
        const Shape row({3});
        auto exchange_in = [&](ProcessGroup& group, const SplitRule& rule) {
          const int g = group.rank(), m = group.size();
          const std::vector<int64_t> sends = rows_sent_by(rule, g, m), receives = rows_received_by(rule, g, m);
          Tensor output = full(stacked(sum_of(receives), row), -1.0);
          const int64_t sent_before = group.ledger()[CommOp::all_to_all].bytes_sent;
          group.all_to_all(output, input_of(g, sends, row, DType::f32), receives, sends);
          EXPECT_EQ(output.to_vector(), expected_output(g, receives, row.numel())) << rule.name << ", rank " << g;
          int64_t rows_out = 0;
          for (int q = 0; q < m; ++q) rows_out += q == g ? 0 : rule.rows(g, q);
          EXPECT_EQ(group.ledger()[CommOp::all_to_all].bytes_sent - sent_before, rows_out * 3 * 4) << rule.name;
        };
        for (const SplitRule& rule : split_rules()) exchange_in(*ctx.world, rule);
        ProcessGroupPtr reversed = ctx.world->split(ctx.rank % 2, ctx.world_size - ctx.rank);
        ASSERT_NE(reversed, nullptr);
        exchange_in(*reversed, split_rules()[0]);
      },
      mpi_options());
}

// Rank 0 sends rank 1 one row more than rank 1's output_splits[0] says. The split sizes are compared
// before MPI moves a byte (MPI would truncate, or leave rows unwritten): rank 1 raises
// CollectiveMismatch naming both byte counts, every other rank RemoteError naming rank 1, in seconds.
// In debug mode every rank compares every pair first and raises CollectiveMismatch naming it.
TEST(MpiAllToAll, SplitSizesThatDisagreeAreNamedOnEveryRank) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const int n = mpirun_world_size(), me = mpirun_rank();
  const SplitRule rule = split_rules()[0];
  const std::string sent = std::to_string((rule.rows(0, 1) + 1) * 12), expected = std::to_string(rule.rows(0, 1) * 12);
  for (bool debug : {false, true}) {
    std::string type = "none", message;
    const auto start = Clock::now();
    try {
      launch(
          n,
          [&](RankContext& ctx) {
            std::vector<int64_t> sends = rows_sent_by(rule, ctx.rank, n),
                                 receives = rows_received_by(rule, ctx.rank, n);
            if (ctx.rank == 0) sends[1] += 1;
            Tensor output = zeros(stacked(sum_of(receives), Shape({3})));
            ctx.world->all_to_all(output, input_of(ctx.rank, sends, Shape({3}), DType::f32), receives, sends);
          },
          mpi_options(std::chrono::milliseconds(20000), debug));
    } catch (const CollectiveMismatch& e) {
      type = "mismatch", message = e.what();
    } catch (const RemoteError& e) {
      type = "remote", message = e.what();
      EXPECT_EQ(e.failed_rank(), 1);
    } catch (const std::exception& e) {
      type = "other", message = e.what();
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "the 20 s timeout must not be what ended it";
    if (debug) {
      EXPECT_EQ(type, "mismatch") << message;
      EXPECT_NE(message.find("rank 0 sends rank 1 " + sent + " bytes but rank 1 expects " + expected),
                std::string::npos)
          << message;
    } else if (me == 1) {
      EXPECT_EQ(type, "mismatch") << message;
      EXPECT_NE(
          message.find("all_to_all #0 on rank 1: rank 0 sends " + sent + " bytes where " + expected + " were expected"),
          std::string::npos)
          << message;
    } else {
      EXPECT_EQ(type, "remote") << message;
      EXPECT_NE(message.find("all_to_all #0 on rank " + std::to_string(me) + ": aborted because rank 1 failed"),
                std::string::npos)
          << message;
    }
  }
}

}  // namespace
}  // namespace sl::parallel
