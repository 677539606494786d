// test_collectives.cpp — every collective on every backend against values worked out here, and the
// ledger against the ring formulas. Runs on the threads backend (worlds 1-4) and, under
// tools/mpi_tests.sh, on the MPI backend (the world mpirun gives; other worlds skip).
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/launch.h"
#include "parallel_test_util.h"
#include "tensor/ops.h"
#include "test_util.h"

namespace sl::parallel {
namespace {

// Rank r's value at element i: an integer in [-5, 5], exact in every dtype (bf16 included), whose
// largest and smallest value sit on different ranks for different i (7r mod 11 is 0, 7, 3, 10 for
// ranks 0-3), so a max that always takes the last rank, or a min the first, is caught.
double value(int r, int64_t i) { return static_cast<double>((7 * r + 3 * (i % 11)) % 11) - 5; }

Tensor rank_tensor(int r, int64_t numel, DType dtype) {
  std::vector<double> v(numel);
  for (int64_t i = 0; i < numel; ++i) v[i] = value(r, i);
  return from_vector(v, Shape({numel}), TensorOptions{dtype});
}

double reduced(ReduceOp op, int n, int64_t i) {
  double s = 0, mx = value(0, i), mn = value(0, i);
  for (int r = 0; r < n; ++r) {
    s += value(r, i);
    mx = std::max(mx, value(r, i));
    mn = std::min(mn, value(r, i));
  }
  switch (op) {
    case ReduceOp::sum: return s;
    case ReduceOp::avg: return s / n;
    case ReduceOp::max: return mx;
    case ReduceOp::min: return mn;
  }
  return 0;
}

// sum, max and min of integers of magnitude <= 20 are exact in every dtype: compared with ==. avg
// divides by n, which rounds once in the dtype (and bf16/f16 are computed in float, then rounded):
// within one unit in the last place of the expected value (2^-7 relative in bf16, 2^-10 in f16).
double tolerance(ReduceOp op, DType dtype, double expected) {
  if (op != ReduceOp::avg) return 0;
  double ulp = dtype == DType::bf16 ? 0x1p-7 : dtype == DType::f16 ? 0x1p-10 : dtype == DType::f32 ? 0x1p-23 : 0x1p-52;
  return ulp * std::abs(expected);
}

struct ReduceCase {
  int world;
  DType dtype;
  ReduceOp op;
  int64_t numel;
};

class AllReduce : public testing::TestWithParam<ReduceCase> {};

TEST_P(AllReduce, MatchesWorkedOutValues) {
  ReduceCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  launch(c.world, [&](RankContext& ctx) {
    Tensor t = rank_tensor(ctx.rank, c.numel, c.dtype);
    ctx.world->all_reduce(t, c.op);
    std::vector<double> got = t.to_vector();
    for (int64_t i = 0; i < c.numel; ++i) {
      const double expected = reduced(c.op, c.world, i);
      if (tolerance(c.op, c.dtype, expected) == 0)
        ASSERT_EQ(got[i], expected) << "element " << i;
      else
        ASSERT_NEAR(got[i], expected, tolerance(c.op, c.dtype, expected)) << "element " << i;
    }
  }, quick());
}

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> cases;
  for (int world : {1, 2, 3, 4})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        if (op == ReduceOp::avg && !is_floating(dtype)) continue;
        // 7 elements: uneven chunks for worlds 2-4; 2 elements at world 4: empty chunks.
        cases.push_back({world, dtype, op, dtype == DType::f32 ? 1003 : 7});
        if (world == 4 && dtype == DType::f32) cases.push_back({world, dtype, op, 2});
        // 3 MiB and a bit: the ring runs in several 1 MiB-per-rank segments, the last one uneven.
        if (world >= 2 && dtype == DType::f32 && op != ReduceOp::min) cases.push_back({world, dtype, op, (3 << 18) * world + 7});
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllReduce, testing::ValuesIn(reduce_cases()),
                         [](const testing::TestParamInfo<ReduceCase>& info) {
                           const ReduceCase& c = info.param;
                           return "world" + std::to_string(c.world) + "_" + dtype_name(c.dtype) + "_" +
                                  reduce_op_name(c.op) + "_n" + std::to_string(c.numel);
                         });

class Collectives : public testing::TestWithParam<int> {};

TEST_P(Collectives, AllGatherIntoOneTensorAndIntoAList) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(n, [&](RankContext& ctx) {
    Tensor mine = rank_tensor(ctx.rank, 6, DType::f32).reshape({2, 3});
    Tensor all = zeros({n, 2, 3});
    ctx.world->all_gather(all, mine);
    std::vector<Tensor> pieces;
    for (int r = 0; r < n; ++r) pieces.push_back(zeros({2, 3}));
    ctx.world->all_gather(pieces, mine);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < 6; ++i) {
        EXPECT_EQ(all.to_vector()[r * 6 + i], value(r, i));
        EXPECT_EQ(pieces[r].to_vector()[i], value(r, i));
      }
  }, quick());
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsChunk) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    launch(n, [&](RankContext& ctx) {
      const int64_t m = 5;
      Tensor input = rank_tensor(ctx.rank, n * m, DType::f32);
      Tensor before = input.clone();
      Tensor out = zeros({m});
      ctx.world->reduce_scatter(out, input, op);
      for (int64_t i = 0; i < m; ++i) {
        const double expected = reduced(op, n, ctx.rank * m + i);
        EXPECT_NEAR(out.to_vector()[i], expected, tolerance(op, DType::f32, expected)) << reduce_op_name(op) << " " << i;
      }
      EXPECT_EQ(input.to_vector(), before.to_vector()) << "reduce_scatter must not modify its input";
    }, quick());
  }
}

TEST_P(Collectives, BroadcastFromEveryRootInSegments) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  const int64_t numel = (3 << 20) / 4 + 13;  // 3 MiB + a bit: several pipelined segments
  for (int root = 0; root < n; ++root) {
    launch(n, [&](RankContext& ctx) {
      Tensor t = ctx.rank == root ? arange(0.0, static_cast<double>(numel), 1.0) : zeros({numel});
      ctx.world->broadcast(t, root);
      std::vector<float> got = t.values<float>();
      for (int64_t i = 0; i < numel; i += 4099) ASSERT_EQ(got[i], static_cast<float>(i));
      ASSERT_EQ(got[numel - 1], static_cast<float>(numel - 1));
    }, quick());
  }
}

TEST_P(Collectives, SendRecvAroundTheRing) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  if (n == 1) GTEST_SKIP() << "a rank cannot send to itself";
  launch(n, [&](RankContext& ctx) {
    int right = (ctx.rank + 1) % n, left = (ctx.rank + n - 1) % n;
    Tensor out = full({4}, ctx.rank), in = zeros({4});
    WorkPtr sent = ctx.world->isend(out, right, /*tag=*/7);
    ctx.world->recv(in, left, 7);
    sent->wait();
    EXPECT_EQ(in.to_vector(), std::vector<double>(4, left));
    // Blocking send/recv in an order that cannot deadlock: even ranks send first.
    Tensor a = full({2}, 10 + ctx.rank), b = zeros({2});
    if (ctx.rank % 2 == 0) {
      if (ctx.rank + 1 < n) ctx.world->send(a, ctx.rank + 1, 3);
    } else {
      ctx.world->recv(b, ctx.rank - 1, 3);
      EXPECT_EQ(b.to_vector(), std::vector<double>(2, 10 + ctx.rank - 1));
    }
  }, quick());
}

TEST_P(Collectives, AsyncAllReducesCompleteInIssueOrder) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(n, [&](RankContext& ctx) {
    std::vector<Tensor> buckets;
    std::vector<WorkPtr> works;
    for (int b = 0; b < 5; ++b) {
      buckets.push_back(full({100 + b}, ctx.rank + b));
      works.push_back(ctx.world->all_reduce_async(buckets.back()));
    }
    Tensor sync = full({3}, 1.0);
    ctx.world->all_reduce(sync);  // runs after the queued ones
    for (int b = 0; b < 5; ++b) {
      works[b]->wait();
      EXPECT_TRUE(works[b]->is_completed());
      EXPECT_EQ(buckets[b].to_vector()[0], n * (n - 1) / 2.0 + n * b);
    }
    EXPECT_EQ(sync.to_vector()[0], n);
    ctx.world->barrier();
  }, quick());
}

TEST_P(Collectives, SubGroupsFromNewGroupAndSplit) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(n, [&](RankContext& ctx) {
    std::vector<int> evens;
    for (int r = 0; r < n; r += 2) evens.push_back(r);
    ProcessGroupPtr even = ctx.world->new_group(evens);
    ASSERT_EQ(even != nullptr, ctx.rank % 2 == 0);
    if (even) {
      Tensor t = full({1}, ctx.rank);
      even->all_reduce(t);
      double expected = 0;
      for (int r : evens) expected += r;
      EXPECT_EQ(t.item(), expected);
      EXPECT_EQ(even->rank(), ctx.rank / 2);
    }
    ProcessGroupPtr parity = ctx.world->split(ctx.rank % 2);
    ASSERT_NE(parity, nullptr);
    Tensor t = full({1}, 1.0);
    parity->all_reduce(t);
    EXPECT_EQ(t.item(), (n + 1 - ctx.rank % 2) / 2);
    EXPECT_EQ(parity->global_rank(parity->rank()), ctx.rank);
  }, quick());
}

// The ledger counts what the ring algorithm sends (threads: what its steps passed; MPI: the ring's
// model of what OpenMPI moved, labelled so): tests divide S by n exactly.
TEST_P(Collectives, LedgerMatchesTheRingFormulas) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(n, [&](RankContext& ctx) {
    const int64_t S = 12 * 1024 * 4;  // bytes of the f32 tensor, divisible by 1..4
    Tensor t = ones({S / 4});
    ctx.world->all_reduce(t);
    CommStats ar = ctx.world->ledger()[CommOp::all_reduce];
    EXPECT_EQ(ar.calls, 1);
    EXPECT_EQ(ar.bytes_sent, 2 * (n - 1) * S / n);
    EXPECT_EQ(ar.bytes_received, 2 * (n - 1) * S / n);

    Tensor gathered = zeros({S / 4});
    ctx.world->all_gather(gathered, ones({S / 4 / n}));
    EXPECT_EQ(ctx.world->ledger()[CommOp::all_gather].bytes_sent, (n - 1) * S / n);
    EXPECT_EQ(ctx.world->ledger()[CommOp::all_gather].bytes_received, (n - 1) * S / n);

    ctx.world->reduce_scatter(zeros({S / 4 / n}), ones({S / 4}));
    EXPECT_EQ(ctx.world->ledger()[CommOp::reduce_scatter].bytes_sent, (n - 1) * S / n);
    EXPECT_EQ(ctx.world->ledger()[CommOp::reduce_scatter].bytes_received, (n - 1) * S / n);

    ctx.world->broadcast(t, 0);  // a chain: the root only sends, the last rank only receives
    CommStats bc = ctx.world->ledger()[CommOp::broadcast];
    EXPECT_EQ(bc.bytes_sent, n > 1 && ctx.rank < n - 1 ? S : 0);
    EXPECT_EQ(bc.bytes_received, ctx.rank > 0 ? S : 0);

    if (n > 1) {
      if (ctx.rank == 0) ctx.world->send(t, 1);
      if (ctx.rank == 1) ctx.world->recv(t, 0);
      EXPECT_EQ(ctx.world->ledger()[CommOp::send].bytes_sent, ctx.rank == 0 ? S : 0);
      EXPECT_EQ(ctx.world->ledger()[CommOp::recv].bytes_received, ctx.rank == 1 ? S : 0);
    }
    ctx.world->barrier();
    EXPECT_EQ(ctx.world->ledger()[CommOp::barrier].calls, 1);
    EXPECT_EQ(ctx.world->ledger()[CommOp::barrier].bytes_sent, 0);
    const std::string report = ctx.world->ledger().report();
    EXPECT_NE(report.find("all_reduce"), std::string::npos);
    // The threads backend counts what its ring steps passed; MPI's (and NCCL's) library chose its own
    // algorithm, so their figures are the ring's model, and the report says so.
    const bool modelled = ctx.world->backend_name() != "threads";
    EXPECT_EQ(ctx.world->ledger().collectives_modelled(), modelled);
    auto line_of = [&](const std::string& op) {  // "" when op was not called
      const size_t begin = report.find(op);
      return begin == std::string::npos ? std::string() : report.substr(begin, report.find('\n', begin) - begin);
    };
    EXPECT_EQ(line_of("all_reduce").find("(ring model)") != std::string::npos, modelled) << report;
    EXPECT_EQ(line_of("reduce_scatter").find("(ring model)") != std::string::npos, modelled) << report;
    EXPECT_EQ(line_of("broadcast").find("(chain model)") != std::string::npos, modelled) << report;
    EXPECT_EQ(line_of("send").find("model"), std::string::npos) << "send counts the bytes it passed: " << report;
  }, quick());
}

TEST_P(Collectives, BadArgumentsRaiseNamingSizes) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  launch(n, [&](RankContext& ctx) {
    expect_error([&] { ctx.world->all_gather(zeros({n * 4 + 1}), zeros({4})); },
                 "has " + std::to_string(n * 4 + 1) + " elements but must hold group size " + std::to_string(n) +
                     " x input [4] = " + std::to_string(n * 4));
    expect_error([&] { ctx.world->reduce_scatter(zeros({3}), zeros({n * 3 + 2})); }, "must hold group size");
    expect_error([&] { ctx.world->all_gather(zeros({n * 2}), zeros({2}, DType::f64)); }, "dtype f32 != input dtype f64");
    expect_error([&] { ctx.world->broadcast(zeros({2}), n); }, "root " + std::to_string(n) + " is not a rank");
    expect_error([&] { ctx.world->send(zeros({2}), ctx.rank); }, "cannot talk to itself");
    expect_error([&] { ctx.world->all_reduce(zeros({2}, DType::i32), ReduceOp::avg); }, "avg needs a floating dtype");
    expect_error([&] { ctx.world->new_group({0, 0}); }, "listed twice");
  }, quick());
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, testing::Values(1, 2, 3, 4), world_name);

}  // namespace
}  // namespace sl::parallel
