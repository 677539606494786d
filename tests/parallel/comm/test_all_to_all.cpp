// test_all_to_all.cpp — all_to_all on the threads backend, worlds 2-5 (and 1), against values worked
// out here: every element says which rank sent it to which, so a chunk in the wrong slot, from the
// wrong rank or shifted by a row is named by the first wrong value.
//
//   in  (rank r) = [c_r0 | c_r1 | ... | c_r,n-1]      c_rd: the rows rank r sends rank d
//   out (rank r) = [c_0r | c_1r | ... | c_n-1,r]      the transpose of the chunks over ranks
//
// The ledger is checked against what must leave each rank (its chunks for the others), worked out
// from n and the shapes. The argument errors and the cross-rank mismatches are in
// test_all_to_all_errors.cpp; the MPI backend's cases in test_mpi_all_to_all.cpp, NCCL's in test_nccl.cpp.
#include "tests/support/all_to_all.h"

namespace sl::parallel {
namespace {

class AllToAll : public testing::TestWithParam<int> {};

// Equal chunks of 2 rows each, for rows of several shapes (a 2-D and a 3-D tensor) and dtypes.
TEST_P(AllToAll, EqualChunksArriveTransposed) {
  const int n = GetParam();
  struct Case {
    DType dtype;
    Shape row;
  };
  for (const Case& c : {Case{DType::f32, Shape({3})}, Case{DType::f32, Shape({2, 3})}, Case{DType::f64, Shape({3})},
                        Case{DType::i64, Shape({2, 2})}}) {
    const std::vector<int64_t> two_each(n, 2);
    launch(
        n,
        [&](RankContext& ctx) {
          const int r = ctx.rank;
          Tensor input = input_of(r, two_each, c.row, c.dtype);
          const std::vector<double> before = input.to_vector();
          Tensor output = zeros(input.shape(), c.dtype);
          ctx.world->all_to_all(output, input);
          EXPECT_EQ(output.shape(), input.shape());
          EXPECT_EQ(output.to_vector(), expected_output(r, two_each, c.row.numel())) << "rank " << r << ", " << c.row;
          EXPECT_EQ(input.to_vector(), before) << "all_to_all must not modify its input";
          // What leaves the rank: every chunk but its own, (n-1)/n of S, worked out from the shape.
          const int64_t S = 2 * n * c.row.numel() * static_cast<int64_t>(dtype_size(c.dtype));
          const CommStats stats = ctx.world->ledger()[CommOp::all_to_all];
          EXPECT_EQ(stats.calls, 1);
          EXPECT_EQ(stats.bytes_sent, (n - 1) * S / n);
          EXPECT_EQ(stats.bytes_received, (n - 1) * S / n);
        },
        threads_options());
  }
}

// Uneven chunks from the rules (some chunks of 0 rows; "rank 0 sends nothing": an input of 0 rows),
// with and without debug mode: uneven inputs differ in dim 0 across ranks, which debug mode allows.
TEST_P(AllToAll, UnevenChunksArriveTransposed) {
  const int n = GetParam();
  const Shape row({2, 3});
  const int64_t row_bytes = 6 * 4;  // f32
  for (const SplitRule& rule : split_rules())
    for (bool debug : {false, true}) {
      launch(
          n,
          [&](RankContext& ctx) {
            const int r = ctx.rank;
            const std::vector<int64_t> sends = rows_sent_by(rule, r, n), receives = rows_received_by(rule, r, n);
            Tensor input = input_of(r, sends, row, DType::f32);
            Tensor output = full(stacked(sum_of(receives), row), -1.0);
            ctx.world->all_to_all(output, input, receives, sends);
            EXPECT_EQ(output.to_vector(), expected_output(r, receives, row.numel()))
                << rule.name << ", rank " << r << (debug ? ", debug" : "");
            // Σ_{d≠r} of the rows rank r sends d, and Σ_{s≠r} of the rows it gets from s.
            int64_t rows_out = 0, rows_in = 0;
            for (int q = 0; q < n; ++q)
              if (q != r) rows_out += rule.rows(r, q), rows_in += rule.rows(q, r);
            const CommStats stats = ctx.world->ledger()[CommOp::all_to_all];
            EXPECT_EQ(stats.calls, 1);
            EXPECT_EQ(stats.bytes_sent, rows_out * row_bytes) << rule.name;
            EXPECT_EQ(stats.bytes_received, rows_in * row_bytes) << rule.name;
          },
          threads_options(5000, debug));
    }
}

// Sub-groups: the members exchange among themselves in their group's rank order (reversed here, so
// that a group rank taken for a world rank sends to the wrong thread), and the world counts nothing.
TEST_P(AllToAll, SubGroupsExchangeAmongTheirMembersOnly) {
  const int n = GetParam();
  const Shape row({3});
  auto exchange_in = [&](ProcessGroup& group) {
    const int g = group.rank(), m = group.size();
    const SplitRule rule = split_rules()[0];
    const std::vector<int64_t> sends = rows_sent_by(rule, g, m), receives = rows_received_by(rule, g, m);
    Tensor output = zeros(stacked(sum_of(receives), row));
    group.all_to_all(output, input_of(g, sends, row, DType::f32), receives, sends);
    EXPECT_EQ(output.to_vector(), expected_output(g, receives, row.numel())) << "group rank " << g << " of " << m;
    int64_t rows_out = 0;
    for (int q = 0; q < m; ++q) rows_out += q == g ? 0 : rule.rows(g, q);
    EXPECT_EQ(group.ledger()[CommOp::all_to_all].bytes_sent, rows_out * 3 * 4);
  };
  launch(
      n,
      [&](RankContext& ctx) {
        // Even and odd world ranks, each group ordered by descending world rank.
        ProcessGroupPtr parity = ctx.world->split(ctx.rank % 2, n - ctx.rank);
        ASSERT_NE(parity, nullptr);
        ASSERT_EQ(parity->global_rank(parity->rank()), ctx.rank);
        exchange_in(*parity);
        // Every rank but 0: rank 0 is not a member and takes no part.
        std::vector<int> all_but_0;
        for (int q = 1; q < n; ++q) all_but_0.push_back(q);
        ProcessGroupPtr rest = ctx.world->new_group(all_but_0);
        ASSERT_EQ(rest != nullptr, ctx.rank != 0);
        if (rest) exchange_in(*rest);
        EXPECT_EQ(ctx.world->ledger()[CommOp::all_to_all].calls, 0);
      },
      threads_options());
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllToAll, testing::Values(2, 3, 4, 5), world_name);

// World 1: both forms are a copy of the input, and nothing leaves the rank.
TEST(AllToAllWorld1, IsACopy) {
  launch(
      1,
      [](RankContext& ctx) {
        Tensor input = input_of(0, {3}, Shape({2}), DType::f64);
        Tensor equal = zeros({3, 2}, DType::f64), uneven = zeros({3, 2}, DType::f64);
        ctx.world->all_to_all(equal, input);
        ctx.world->all_to_all(uneven, input, {3}, {3});
        EXPECT_EQ(equal.to_vector(), input.to_vector());
        EXPECT_EQ(uneven.to_vector(), input.to_vector());
        Tensor empty = zeros({0, 2});
        ctx.world->all_to_all(empty, zeros({0, 2}), {0}, {0});  // no rows at all: nothing to do, no error
        const CommStats stats = ctx.world->ledger()[CommOp::all_to_all];
        EXPECT_EQ(stats.calls, 3);
        EXPECT_EQ(stats.bytes_sent, 0);
        EXPECT_EQ(stats.bytes_received, 0);
      },
      threads_options());
}

}  // namespace
}  // namespace sl::parallel
