// MPI backend: every collective on every dtype, the ledger, sub-groups, failures and debug mode, one
// process per rank. Outside mpirun these tests skip; run them with
//   tools/mpi_tests.sh build/tests/shardlab_tests          (mpirun -np 2, then -np 4)
// Every rank asserts what it sees itself; mpirun fails when any rank does.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <stdexcept>

#include "parallel/comm/errors.h"
#include "parallel/comm/launch.h"
#include "tensor/ops.h"
#include "tests/support/mpi.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Rank r's value at element i: an integer in [-5, 5], so sums are exact in every dtype (bf16 holds
// integers to 256), and the largest and smallest sit on different ranks for different i (7r mod 11
// is 0, 7, 3, 10, 6, 2, 9, 5 for ranks 0-7): a max that always took the last rank would be caught.
double value(int r, int64_t i) { return static_cast<double>((7 * r + 3 * (i % 11)) % 11) - 5; }

Tensor rank_tensor(int r, int64_t count, DType dtype, int64_t first = 0) {
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = value(r, first + i);
  return from_vector(values, Shape({count}), dtype);
}

// x rounded to dtype, as a tensor of that dtype would hold it.
double in_dtype(DType dtype, double x) { return from_vector({x}, Shape({1}), dtype).item(); }

// avg = the sum, times 1/n in the dtype's compute type (float for the 16-bit formats).
double average(DType dtype, double sum, int n) {
  if (dtype == DType::f64) return sum * (1.0 / n);
  return in_dtype(dtype, static_cast<double>(static_cast<float>(sum) * static_cast<float>(1.0 / n)));
}

// ---- every collective on every dtype ----------------------------------------------------------------

class MpiCollectives : public ::testing::TestWithParam<DType> {};

TEST_P(MpiCollectives, AllReduceEveryOp) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const DType dtype = GetParam();
  launch(
      mpirun_world_size(),
      [&](RankContext& ctx) {
        const int n = ctx.world_size;
        const int64_t count = 37;  // not a multiple of the world size
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
          Tensor t = rank_tensor(ctx.rank, count, dtype);
          if (op == ReduceOp::avg && !is_floating(dtype)) {
            expect_error([&] { ctx.world->all_reduce(t, op); }, "avg needs a floating dtype");
            continue;
          }
          ctx.world->all_reduce(t, op);
          std::vector<double> got = t.to_vector();
          for (int64_t i = 0; i < count; ++i) {
            double sum = 0, high = value(0, i), low = value(0, i);
            for (int r = 0; r < n; ++r) {
              sum += value(r, i);
              high = std::max(high, value(r, i));
              low = std::min(low, value(r, i));
            }
            double expected = op == ReduceOp::sum   ? sum
                              : op == ReduceOp::max ? high
                              : op == ReduceOp::min ? low
                                                    : average(dtype, sum, n);
            ASSERT_EQ(got[i], expected) << reduce_op_name(op) << " element " << i << " on rank " << ctx.rank;
          }
        }
      },
      mpi_options());
}

TEST_P(MpiCollectives, AllGatherReduceScatterBroadcast) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const DType dtype = GetParam();
  launch(
      mpirun_world_size(),
      [&](RankContext& ctx) {
        const int n = ctx.world_size, r = ctx.rank;
        const int64_t chunk = 6;
        // all_gather: rank r's piece lands at r * chunk, and in-place from a view of its own slot too.
        Tensor gathered = zeros({n * chunk}, dtype);
        ctx.world->all_gather(gathered, rank_tensor(r, chunk, dtype));
        Tensor in_place = zeros({n * chunk}, dtype);
        in_place.flat_view(r * chunk, Shape({chunk})).copy_(rank_tensor(r, chunk, dtype));
        ctx.world->all_gather(in_place, in_place.flat_view(r * chunk, Shape({chunk})));
        for (const Tensor& out : {gathered, in_place}) {
          std::vector<double> got = out.to_vector();
          for (int q = 0; q < n; ++q)
            for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(got[q * chunk + i], value(q, i)) << "piece of rank " << q;
        }
        // reduce_scatter: rank r ends with chunk r of the sum (or max) over ranks.
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          Tensor output = zeros({chunk}, dtype);
          ctx.world->reduce_scatter(output, rank_tensor(r, n * chunk, dtype), op);
          std::vector<double> got = output.to_vector();
          for (int64_t i = 0; i < chunk; ++i) {
            double expected = op == ReduceOp::sum ? 0 : value(0, r * chunk + i);
            for (int q = 0; q < n; ++q)
              expected = op == ReduceOp::sum ? expected + value(q, r * chunk + i)
                                             : std::max(expected, value(q, r * chunk + i));
            ASSERT_EQ(got[i], expected) << reduce_op_name(op) << " element " << i;
          }
        }
        // broadcast from every root.
        for (int root = 0; root < n; ++root) {
          Tensor t = rank_tensor(r, 11, dtype);
          ctx.world->broadcast(t, root);
          EXPECT_EQ(t.to_vector(), rank_tensor(root, 11, dtype).to_vector()) << "root " << root;
        }
      },
      mpi_options());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MpiCollectives,
                         ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- launch, async, point to point ------------------------------------------------------------------

TEST(MpiLaunch, ContextDeviceAndAsync) {
  SKIP_UNLESS_UNDER_MPIRUN();
  launch(
      mpirun_world_size(),
      [](RankContext& ctx) {
        EXPECT_EQ(ctx.rank, mpirun_rank());
        EXPECT_EQ(ctx.backend, Backend::mpi);
        EXPECT_EQ(ctx.world->backend_name(), "mpi");
        EXPECT_EQ(ctx.device, Device::cpu(ctx.rank));
        EXPECT_EQ(current_device(), Device::cpu(ctx.rank));
        // Three async all-reduces in flight at once, waited on in reverse.
        std::vector<Tensor> tensors;
        std::vector<WorkPtr> works;
        for (int k = 0; k < 3; ++k) {
          tensors.push_back(full({1000}, ctx.rank + k));
          works.push_back(ctx.world->all_reduce_async(tensors.back()));
        }
        for (int k = 2; k >= 0; --k) works[k]->wait();
        const int n = ctx.world_size;
        for (int k = 0; k < 3; ++k) EXPECT_EQ(tensors[k].to_vector()[999], n * (n - 1) / 2.0 + n * k);
      },
      mpi_options());
  expect_error(
      [] {
        launch(
            mpirun_world_size() + 1, [](RankContext&) {}, mpi_options());
      },
      "launch(" + std::to_string(mpirun_world_size() + 1) + "): this process runs under mpirun -np " +
          std::to_string(mpirun_world_size()));
}

TEST(MpiPointToPoint, RingAndSizeMismatch) {
  SKIP_UNLESS_UNDER_MPIRUN();
  launch(
      mpirun_world_size(),
      [](RankContext& ctx) {
        const int n = ctx.world_size, r = ctx.rank;
        Tensor mine = rank_tensor(r, 300000, DType::f32), from_left = zeros({300000});  // past the eager limit
        WorkPtr sent = ctx.world->isend(mine, (r + 1) % n, 7);
        ctx.world->recv(from_left, (r + n - 1) % n, 7);
        sent->wait();
        EXPECT_EQ(from_left.to_vector(), rank_tensor((r + n - 1) % n, 300000, DType::f32).to_vector());
        // Rank 0 sends 4 floats, then 8; rank 1 expects 8, then 4: both receives fail and say why.
        if (r == 0) {
          ctx.world->send(zeros({4}), 1, 3);
          ctx.world->send(zeros({8}), 1, 4);
        } else if (r == 1) {
          expect_error([&] { ctx.world->recv(zeros({8}), 0, 3); }, "recv (tag 3) from rank 0 on rank 1");
          expect_error([&] { ctx.world->recv(zeros({4}), 0, 4); }, "recv (tag 4) from rank 0 on rank 1");
        }
      },
      mpi_options());
}

// ---- the ledger: the ring algorithm's bytes, and the threads backend's own ledger -----------------

struct LedgerRow {
  int64_t calls, sent, received;
  bool operator==(const LedgerRow&) const = default;
};

std::vector<LedgerRow> run_ledger_script(RankContext& ctx, int64_t count) {
  ProcessGroup& g = *ctx.world;
  const int n = g.size(), r = g.rank();
  g.all_reduce(full({count}, 1.0));
  g.all_gather(zeros({n * count}), zeros({count}));
  g.reduce_scatter(zeros({count}), zeros({n * count}));
  g.broadcast(zeros({count}), n - 1);
  g.barrier();
  WorkPtr sent = g.isend(zeros({count}), (r + 1) % n);
  g.recv(zeros({count}), (r + n - 1) % n);
  sent->wait();
  std::vector<LedgerRow> rows;
  for (CommOp op : {CommOp::all_reduce, CommOp::all_gather, CommOp::reduce_scatter, CommOp::broadcast, CommOp::send,
                    CommOp::recv, CommOp::barrier}) {
    CommStats s = g.ledger()[op];
    rows.push_back({s.calls, s.bytes_sent, s.bytes_received});
  }
  return rows;
}

TEST(MpiLedger, RingFormulasAndThreadsBackendAgree) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const int n = mpirun_world_size(), me = mpirun_rank();
  for (int64_t count : {int64_t{1024}, int64_t{1001}}) {  // 1001: chunks of unequal size
    std::vector<LedgerRow> mpi_rows, threads_rows;
    launch(
        n, [&](RankContext& ctx) { mpi_rows = run_ledger_script(ctx, count); }, mpi_options());
    std::mutex mutex;
    LaunchOptions threads = mpi_options();
    threads.backend = Backend::threads;
    launch(
        n,
        [&](RankContext& ctx) {
          auto rows = run_ledger_script(ctx, count);
          std::lock_guard lock(mutex);
          if (ctx.rank == me) threads_rows = rows;
        },
        threads);
    EXPECT_EQ(mpi_rows, threads_rows) << "count " << count;
    // The formulas, from the chunk sizes: chunk i has count/n elements, one more if i < count % n.
    auto chunk = [&](int i) { return 4 * (count / n + ((i % n) < count % n ? 1 : 0)); };
    const int64_t S = 4 * count;
    int64_t ring_sent = 0, ring_received = 0;  // reduce-scatter, then all-gather, step by step
    for (int k = 0; k < n - 1; ++k) {
      ring_sent += chunk(me - k + n) + chunk(me + 1 - k + n);
      ring_received += chunk(me - k - 1 + n) + chunk(me - k + n);
    }
    if (count % n == 0) {
      EXPECT_EQ(ring_sent, 2 * (n - 1) * S / n);
    }
    const int position = (me - (n - 1) + n) % n;  // in the broadcast chain from rank n-1
    std::vector<LedgerRow> expected = {{1, ring_sent, ring_received},
                                       {1, (n - 1) * S, (n - 1) * S},
                                       {1, (n - 1) * S, (n - 1) * S},
                                       {1, position < n - 1 ? S : 0, position > 0 ? S : 0},
                                       {1, S, 0},
                                       {1, 0, S},
                                       {1, 0, 0}};
    EXPECT_EQ(mpi_rows, expected) << "count " << count;
  }
}

// ---- sub-groups ---------------------------------------------------------------------------------------

TEST(MpiSubgroups, NewGroupAndSplit) {
  SKIP_UNLESS_UNDER_MPIRUN();
  launch(
      mpirun_world_size(),
      [](RankContext& ctx) {
        const int n = ctx.world_size, r = ctx.rank;
        // new_group of the even ranks: odd ranks get nullptr.
        std::vector<int> evens;
        for (int q = 0; q < n; q += 2) evens.push_back(q);
        ProcessGroupPtr even = ctx.world->new_group(evens);
        ASSERT_EQ(even != nullptr, r % 2 == 0);
        if (even) {
          EXPECT_EQ(even->rank(), r / 2);
          EXPECT_EQ(even->global_rank(even->rank()), r);
          Tensor t = full({5}, r);
          even->all_reduce(t);
          double sum = 0;
          for (int q : evens) sum += q;
          EXPECT_EQ(t.to_vector()[4], sum);
        }
        // split by parity, ordered by descending world rank (key = -r... keys must be >= 0: n - r).
        ProcessGroupPtr parity = ctx.world->split(r % 2, n - r);
        ASSERT_NE(parity, nullptr);
        const int members = (n - r % 2 + 1) / 2;
        EXPECT_EQ(parity->size(), members);
        EXPECT_EQ(parity->global_rank(0), (n - 1) - ((n - 1) % 2 != r % 2 ? 1 : 0));  // the largest of its parity
        Tensor t = full({3}, 0);
        if (parity->rank() == 0) t.fill_(100 + r);
        parity->broadcast(t, 0);
        EXPECT_EQ(t.to_vector()[2], 100 + parity->global_rank(0));
        // A nested sub-group, and a color < 0 that joins none.
        ProcessGroupPtr nested = parity->split(parity->rank() == 0 ? -1 : 0);
        EXPECT_EQ(nested == nullptr, parity->rank() == 0);
        if (nested) nested->barrier();
        ctx.world->barrier();
      },
      mpi_options());
}

// ---- failures: nothing hangs ------------------------------------------------------------------------

TEST(MpiFailures, OneRankThrowsOthersGetRemoteErrorNamingIt) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const int n = mpirun_world_size(), failing = n - 1;
  double waited = -1;
  std::string message;
  try {
    launch(
        n,
        [&](RankContext& ctx) {
          ctx.world->barrier();
          if (ctx.rank == failing) throw std::runtime_error("injected failure");
          Clock::time_point start = Clock::now();
          try {
            ctx.world->all_reduce(zeros({1 << 20}));
          } catch (const RemoteError& e) {
            waited = seconds_since(start);
            EXPECT_EQ(e.failed_rank(), failing);
            throw;
          }
        },
        mpi_options(milliseconds(30000)));
    ADD_FAILURE() << "launch returned normally on rank " << mpirun_rank();
  } catch (const std::exception& e) {
    message = e.what();
  }
  if (mpirun_rank() == failing) {
    EXPECT_EQ(message, "injected failure");
  } else {
    EXPECT_NE(message.find("all_reduce #1 on rank " + std::to_string(mpirun_rank())), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(failing) + " failed: injected failure"), std::string::npos)
        << message;
    EXPECT_GE(waited, 0.0);
    EXPECT_LT(waited, 2.0);
  }
  // The next launch works: the failed one's requests stay on communicators nobody uses again.
  launch(
      n,
      [](RankContext& ctx) {
        Tensor t = full({8}, 1.0);
        ctx.world->all_reduce(t);
        EXPECT_EQ(t.to_vector()[7], ctx.world_size);
      },
      mpi_options());
}

TEST(MpiFailures, SkippedCollectiveTimesOut) {
  SKIP_UNLESS_UNDER_MPIRUN();
  const int n = mpirun_world_size(), skipping = 1;
  double waited = -1;
  std::string message;
  try {
    launch(
        n,
        [&](RankContext& ctx) {
          ctx.world->barrier();
          if (ctx.rank == skipping) return;  // never joins the all-reduce
          Clock::time_point start = Clock::now();
          try {
            ctx.world->all_reduce(zeros({16}));
          } catch (const Error&) {
            waited = seconds_since(start);
            throw;
          }
        },
        mpi_options(milliseconds(1000)));
    ADD_FAILURE() << "launch returned normally on rank " << mpirun_rank();
  } catch (const TimeoutError& e) {
    message = std::string("TimeoutError: ") + e.what();
  } catch (const RemoteError& e) {
    message = std::string("RemoteError: ") + e.what();
  }
  // Every rank learns of the timeout: the ones that waited from their own clock (or, if another
  // waiter's came first, from its abort record), the skipping one at the end of its launch.
  EXPECT_NE(message.find("timed out after"), std::string::npos) << message;
  EXPECT_NE(message.find("(timeout 1000 ms)"), std::string::npos) << message;
  if (mpirun_rank() == skipping) {
    EXPECT_EQ(message.rfind("RemoteError: launch: waiting for every rank to finish", 0), 0u) << message;
  } else {
    EXPECT_NE(message.find("all_reduce #1 on rank "), std::string::npos) << message;
    EXPECT_GE(waited, 0.9);
    EXPECT_LT(waited, 3.0);
  }
}

TEST(MpiFailures, RecvFromARankThatNeverSendsTimesOut) {
  SKIP_UNLESS_UNDER_MPIRUN();
  std::string message = message_of([] {
    launch(
        mpirun_world_size(),
        [](RankContext& ctx) {
          if (ctx.rank == 0) ctx.world->recv(zeros({4}), 1, 9);
        },
        mpi_options(milliseconds(500)));
  });
  EXPECT_NE(message.find("recv (tag 9) from rank 1 on rank 0: timed out after"), std::string::npos) << message;
}

// ---- debug mode: mismatched collectives are named, with both fingerprints ----------------------------

TEST(MpiDebug, FingerprintMismatchIsReportedOnEveryRank) {
  SKIP_UNLESS_UNDER_MPIRUN();
  std::string message = message_of([] {
    launch(
        mpirun_world_size(),
        [](RankContext& ctx) {
          ctx.world->all_reduce(zeros({4}));  // matching: passes the check
          if (ctx.rank == 0)
            ctx.world->broadcast(zeros({4, 2}), 0);
          else
            ctx.world->all_reduce(zeros({8}));
        },
        mpi_options(milliseconds(20000), /*debug=*/true));
  });
  EXPECT_NE(message.find("collective mismatch (mpi group of"), std::string::npos) << message;
  if (mpirun_rank() == 0)
    EXPECT_NE(message.find("called broadcast #1 f32[4, 2] root 0 but rank 1 called all_reduce #1 f32[8] sum"),
              std::string::npos)
        << message;
  else
    EXPECT_NE(message.find("but rank 0 called broadcast #1 f32[4, 2] root 0 (op all_reduce != broadcast"),
              std::string::npos)
        << message;
}

}  // namespace
}  // namespace sl::parallel
