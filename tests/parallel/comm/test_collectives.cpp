// test_collectives.cpp — every collective on every backend against values worked out here, and the
// ledger against the ring formulas. Runs on the threads backend (worlds 1-4) and, under
// tools/mpi_tests.sh, on the MPI backend (the world mpirun gives; other worlds skip).
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

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

// The Long set (left out of sanitized runs): the multi-segment sizes but one, world 3's sum.
std::vector<ReduceCase> reduce_cases(bool long_set) {
  std::vector<ReduceCase> cases;
  for (int world : {1, 2, 3, 4})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        if (op == ReduceOp::avg && !is_floating(dtype)) continue;
        if (!long_set) {
          // 7 elements: uneven chunks for worlds 2-4; 2 elements at world 4: empty chunks.
          cases.push_back({world, dtype, op, dtype == DType::f32 ? 1003 : 7});
          if (world == 4 && dtype == DType::f32) cases.push_back({world, dtype, op, 2});
        }
        // 3 MiB and a bit: the ring runs in several 1 MiB-per-rank segments, the last one uneven.
        if (world >= 2 && dtype == DType::f32 && op != ReduceOp::min &&
            long_set != (world == 3 && op == ReduceOp::sum))
          cases.push_back({world, dtype, op, (3 << 18) * world + 7});
      }
  return cases;
}

std::string reduce_case_name(const testing::TestParamInfo<ReduceCase>& info) {
  const ReduceCase& c = info.param;
  return "world" + std::to_string(c.world) + "_" + dtype_name(c.dtype) + "_" + reduce_op_name(c.op) + "_n" +
         std::to_string(c.numel);
}
INSTANTIATE_TEST_SUITE_P(Collectives, AllReduce, testing::ValuesIn(reduce_cases(false)), reduce_case_name);
INSTANTIATE_TEST_SUITE_P(Long, AllReduce, testing::ValuesIn(reduce_cases(true)), reduce_case_name);

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

// ---- the point-to-point contract: issue order, tags checked in debug mode, no deadlock -------------------

// Three messages of different sizes and tags; the receiver posts its irecvs (all with tag 0: tags take
// no part in matching) in the same order and waits on them backwards: each still gets the message of its
// own place in the order.
TEST_P(Collectives, PointToPointMatchesInIssueOrderWhateverTheWaitOrder) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  if (n == 1) GTEST_SKIP() << "a rank cannot send to itself";
  launch(n, [&](RankContext& ctx) {
    const std::vector<int> tags = {5, 9, 2};
    if (ctx.rank == 0) {
      std::vector<WorkPtr> sent;
      for (int k = 0; k < 3; ++k) sent.push_back(ctx.world->isend(full({k + 1}, 10.0 * (k + 1)), 1, tags[k]));
      for (auto& work : sent) work->wait();
    } else if (ctx.rank == 1) {
      std::vector<Tensor> got;
      std::vector<WorkPtr> pending;
      for (int k = 0; k < 3; ++k) {
        got.push_back(zeros({k + 1}));
        pending.push_back(ctx.world->irecv(got.back(), 0));
      }
      for (int k = 2; k >= 0; --k) pending[static_cast<size_t>(k)]->wait();
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(got[static_cast<size_t>(k)].to_vector(), std::vector<double>(static_cast<size_t>(k + 1), 10.0 * (k + 1)));
    }
  }, quick());
}

// Every rank sends to the next and receives from the previous at the same time, three rounds.
TEST_P(Collectives, RingExchangeWithBatchIsendIrecv) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  if (n == 1) GTEST_SKIP() << "a rank cannot send to itself";
  launch(n, [&](RankContext& ctx) {
    const int right = (ctx.rank + 1) % n, left = (ctx.rank + n - 1) % n;
    Tensor travelling = full({1000}, ctx.rank);
    for (int round = 1; round <= 3; ++round) {
      Tensor incoming = zeros({1000});
      auto works = ctx.world->batch_isend_irecv({{ProcessGroup::P2POp::Kind::send, travelling, right, round},
                                                 {ProcessGroup::P2POp::Kind::recv, incoming, left, round}});
      ASSERT_EQ(works.size(), 2u);
      for (auto& work : works) work->wait();
      travelling = incoming;
      EXPECT_EQ(travelling.to_vector(), std::vector<double>(1000, (ctx.rank - round % n + n) % n)) << "round " << round;
    }
  }, quick());
}

// A pipeline's traffic: activations flow down the chain, gradients come back, 25 micro-batches, so a
// middle rank issues 100 sends and receives. Gradients are received by irecvs posted all at once and
// waited on in reverse; sends are waited on only at the end.
TEST_P(Collectives, AHundredMixedSendsAndReceivesLikeAPipeline) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  if (n == 1) GTEST_SKIP() << "a rank cannot send to itself";
  constexpr int kMicroBatches = 25;
  launch(n, [&](RankContext& ctx) {
    const int r = ctx.rank;
    std::vector<WorkPtr> sends;
    std::vector<Tensor> activations;
    for (int k = 0; k < kMicroBatches; ++k) {  // forward: receive from r-1, add one, pass on
      Tensor act = full({8}, 1000.0 * k);
      if (r > 0) ctx.world->recv(act, r - 1, /*tag=*/k);
      act = add(act, 1.0);
      activations.push_back(act);
      if (r < n - 1) sends.push_back(ctx.world->isend(act, r + 1, k));
    }
    std::vector<Tensor> grads(kMicroBatches);
    std::vector<WorkPtr> grad_recvs;
    for (int k = 0; k < kMicroBatches; ++k) {
      grads[static_cast<size_t>(k)] = zeros({8});
      if (r < n - 1) grad_recvs.push_back(ctx.world->irecv(grads[static_cast<size_t>(k)], r + 1, 100 + k));
    }
    for (auto it = grad_recvs.rbegin(); it != grad_recvs.rend(); ++it) (*it)->wait();
    for (int k = 0; k < kMicroBatches; ++k) {  // backward: the last rank starts; each adds its activation
      Tensor& grad = grads[static_cast<size_t>(k)];
      // What arrives from r+1 is the sum of the activations of ranks r+1 .. n-1 for micro-batch k.
      double expected = 0;
      for (int later = r + 1; later < n; ++later) expected += 1000.0 * k + later + 1;
      EXPECT_EQ(grad.to_vector(), std::vector<double>(8, expected)) << "micro-batch " << k << " on rank " << r;
      grad = add(grad, activations[static_cast<size_t>(k)]);
      if (r > 0) sends.push_back(ctx.world->isend(grad, r - 1, 100 + k));
    }
    for (auto& work : sends) work->wait();
  }, quick(20000));
}

// The tag takes no part in matching; in debug mode a receive whose tag differs from its message's
// says so, naming both.
TEST_P(Collectives, ATagMismatchIsReportedInDebugModeOnly) {
  const int n = GetParam();
  SL_SKIP_UNLESS_WORLD(n);
  if (n == 1) GTEST_SKIP() << "a rank cannot send to itself";
  for (bool debug : {false, true}) {
    launch(n, [&](RankContext& ctx) {
      if (ctx.rank == 0) ctx.world->send(full({2}, 3.0), 1, /*tag=*/1);
      if (ctx.rank != 1) return;
      Tensor got = zeros({2});
      if (debug) {
        expect_error([&] { ctx.world->recv(got, 0, /*tag=*/2); }, "was sent with tag 1");
      } else {
        ctx.world->recv(got, 0, /*tag=*/2);
        EXPECT_EQ(got.to_vector(), std::vector<double>(2, 3.0));
      }
    }, quick(5000, debug));
  }
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
