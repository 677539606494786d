// test_failures.cpp — a distributed run fails loudly and in bounded time (threads backend; the MPI
// backend's own failure tests are in test_mpi_backend.cpp).
//
//   a rank throws            -> the others raise RemoteError naming it within 2 s; launch rethrows
//   a rank skips a collective -> the others raise (it returned, or it called another op), never hang
//   a rank is stuck          -> TimeoutError with op, sequence number, timeout and elapsed time
//   debug mode               -> mismatched shapes or ops raise CollectiveMismatch with both fingerprints
//   the order of an abort    -> the world is aborted before the failed rank's group joins its worker;
//                               an async collective failing on the worker aborts the world at once
//   point to point           -> a failed isend/irecv stays failed: a second wait() rethrows
// Fault injection during training (DDP, ZeRO, FSDP): tests/parallel/train/test_fault_injection.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"
#include "tensor/ops.h"
#include "tensor/philox.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using Clock = std::chrono::steady_clock;

class Failures : public testing::TestWithParam<int> {
 protected:
  void SetUp() override { SL_SKIP_UNDER_MPI("failure injection into rank threads"); }
};

TEST_P(Failures, ARankThrowingAtARandomStepAbortsEveryOtherRank) {
  const int n = GetParam();
  // The failing rank and step come from a fixed seed, different per world size.
  Generator gen(1234 + n);
  Tensor pick = rand({2}, TensorOptions{DType::f64}, &gen);
  const int failing = static_cast<int>(pick.to_vector()[0] * n);
  const int step = 1 + static_cast<int>(pick.to_vector()[1] * 8);
  std::vector<RankOutcome> outcomes;
  Clock::time_point thrown_at;
  LaunchOptions options;  // the default 10-minute timeout: only the abort can end the wait in time
  std::string launched = launch_recording(n, options, outcomes, [&](RankContext& ctx) {
    Tensor t = ones({1000});
    for (int s = 0; s < 20; ++s) {
      if (ctx.rank == failing && s == step) {
        thrown_at = Clock::now();
        throw std::runtime_error("boom at step " + std::to_string(s));
      }
      ctx.world->all_reduce(t);
    }
  });
  EXPECT_EQ(launched, "boom at step " + std::to_string(step)) << "launch rethrows the original error";
  for (int r = 0; r < n; ++r) {
    if (r == failing) continue;
    EXPECT_EQ(outcomes[r].type, "remote") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("rank " + std::to_string(failing) + " failed: boom"), std::string::npos)
        << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("all_reduce #"), std::string::npos) << outcomes[r].message;
    EXPECT_LT(outcomes[r].at - thrown_at, std::chrono::seconds(2));
  }
}

TEST_P(Failures, ARankThatSkipsACollectiveAndReturnsIsNoticedAtOnce) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  auto start = Clock::now();
  launch_recording(n, LaunchOptions{}, outcomes, [&](RankContext& ctx) {
    Tensor t = ones({64});
    ctx.world->all_reduce(t);
    if (ctx.rank == n - 1) return;  // skips the second one
    ctx.world->all_reduce(t);
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_TRUE(outcomes[r].type == "mismatch" || outcomes[r].type == "remote") << outcomes[r].message;
    if (outcomes[r].type == "mismatch") {
      EXPECT_NE(outcomes[r].message.find("all_reduce #1"), std::string::npos) << outcomes[r].message;
      EXPECT_NE(outcomes[r].message.find("already returned"), std::string::npos) << outcomes[r].message;
    }
  }
}

// Without debug mode, a broadcast whose tensors differ in size still fails at once, naming both sizes:
// the size travels down the chain ahead of the segments. (Before, a rank with a smaller tensor took
// fewer segments and returned, and the root waited for a taker of the rest until the timeout.)
TEST_P(Failures, ABroadcastOfAnotherSizeIsNamedAtOnceNotATimeout) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  LaunchOptions options;
  options.timeout = std::chrono::milliseconds(20000);
  const auto start = Clock::now();
  const std::string message = launch_recording(n, options, outcomes, [&](RankContext& ctx) {
    Tensor t = zeros({ctx.rank == n - 1 ? 1 << 18 : 3 << 18});  // 1 MiB on the last rank, 3 MiB elsewhere
    ctx.world->broadcast(t, 0);
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << message;
  EXPECT_EQ(outcomes[n - 1].type, "other") << outcomes[n - 1].message;
  EXPECT_NE(outcomes[n - 1].message.find("the root's tensor has 3145728 bytes but this rank's 1048576"),
            std::string::npos)
      << outcomes[n - 1].message;
}

TEST_P(Failures, ARankCallingAnotherOpAtTheSameSequenceNumberIsAMismatch) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  launch_recording(n, quick(3000), outcomes, [&](RankContext& ctx) {
    Tensor t = ones({8 * n});
    if (ctx.rank == 0)
      ctx.world->all_gather(t, ones({8}));
    else
      ctx.world->all_reduce(t);
  });
  int mismatches = 0;
  for (const RankOutcome& o : outcomes) {
    if (o.type != "mismatch") continue;
    ++mismatches;
    EXPECT_NE(o.message.find("#0"), std::string::npos) << o.message;
  }
  EXPECT_GE(mismatches, 1);
}

TEST_P(Failures, AStuckRankMakesTheOthersTimeOutWithOpSequenceAndTimes) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  auto start = Clock::now();
  launch_recording(n, quick(1000), outcomes, [&](RankContext& ctx) {
    Tensor t = ones({16});
    ctx.world->barrier();
    if (ctx.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1800));  // never in time
    ctx.world->all_reduce(t);
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  int timeouts = 0;
  for (int r = 1; r < n; ++r) {
    if (outcomes[r].type != "timeout") continue;
    ++timeouts;
    const std::string& m = outcomes[r].message;
    EXPECT_NE(m.find("all_reduce #1"), std::string::npos) << m;
    EXPECT_NE(m.find("timeout 1000 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after"), std::string::npos) << m;
  }
  EXPECT_GE(timeouts, 1) << "the rank next to the stuck one times out; the rest may see its RemoteError";
}

TEST_P(Failures, DebugModeReportsDifferentShapesWithBothFingerprints) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  launch_recording(n, quick(3000, /*debug=*/true), outcomes, [&](RankContext& ctx) {
    Tensor fine = ones({4});
    ctx.world->all_reduce(fine);
    Tensor t = ones({ctx.rank == 1 ? 6 : 4, 2});
    ctx.world->all_reduce(t);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].type, "mismatch") << "rank " << r << ": " << outcomes[r].message;
    const std::string& m = outcomes[r].message;
    EXPECT_NE(m.find("all_reduce #1 f32[4, 2] sum"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce #1 f32[6, 2] sum"), std::string::npos) << m;
    EXPECT_NE(m.find("shape"), std::string::npos) << m;
  }
}

TEST_P(Failures, DebugModeFromTheEnvironmentReportsDifferentOps) {
  const int n = GetParam();
  setenv("SL_DEBUG_COLLECTIVES", "1", 1);
  LaunchOptions options;  // reads the environment
  unsetenv("SL_DEBUG_COLLECTIVES");
  ASSERT_TRUE(options.debug_collectives);
  options.timeout = std::chrono::milliseconds(3000);
  std::vector<RankOutcome> outcomes;
  launch_recording(n, options, outcomes, [&](RankContext& ctx) {
    Tensor t = ones({4});
    if (ctx.rank == 0)
      ctx.world->broadcast(t, 0);
    else
      ctx.world->all_reduce(t);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].type, "mismatch") << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("op "), std::string::npos) << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("broadcast #0"), std::string::npos) << outcomes[r].message;
  }
}

// The issue this guards: rank 0 queues an async all-reduce and throws. Its group's destructor joins
// the worker, which is inside that all-reduce waiting for its peers; the peers first wait for a
// message rank 0 would have sent next. Unless the world is aborted *before* the group goes, nobody
// moves until a timeout.
TEST_P(Failures, TheWorldIsAbortedBeforeTheFailedRanksGroupWaitsForItsQueuedWork) {
  const int n = GetParam();
  std::vector<RankOutcome> outcomes;
  Clock::time_point thrown_at;
  std::string launched = launch_recording(n, quick(5000), outcomes, [&](RankContext& ctx) {
    Tensor t = ones({256});
    if (ctx.rank == 0) {
      ctx.world->all_reduce_async(t);
      thrown_at = Clock::now();
      throw std::runtime_error("boom with an all-reduce queued");
    }
    Tensor next = zeros({4});
    ctx.world->recv(next, 0);  // rank 0's next message: never sent
    ctx.world->all_reduce(t);
  });
  EXPECT_EQ(launched, "boom with an all-reduce queued");
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(outcomes[r].type, "remote") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("rank 0 failed: boom"), std::string::npos) << outcomes[r].message;
    EXPECT_LT(outcomes[r].at - thrown_at, std::chrono::seconds(2)) << outcomes[r].message;
  }
}

// Failures need a peer to notice them: worlds 2-4.
INSTANTIATE_TEST_SUITE_P(Worlds, Failures, testing::Values(2, 3, 4), world_name);

// An async collective that fails on the group's worker (here: a fault injected there) aborts the
// world at once; the rank's own main thread, busy elsewhere, learns it only later from wait().
TEST(AsyncFailures, AnAsyncCollectiveFailingOnTheWorkerAbortsTheWorldAtOnce) {
  SL_SKIP_UNDER_MPI("failure injection into rank threads");
  const int n = 3;
  std::vector<RankOutcome> outcomes;
  std::atomic<int64_t> failed_at_ns{0};
  LaunchOptions options;  // the default 10-minute timeout: only the abort can end the wait in time
  std::string launched = launch_recording(n, options, outcomes, [&](RankContext& ctx) {
    if (ctx.rank == 0)
      ctx.world->set_collective_observer([&](const Fingerprint& f) {
        if (f.op != CommOp::all_reduce || f.sequence != 1) return;
        failed_at_ns = Clock::now().time_since_epoch().count();
        throw std::runtime_error("injected on the worker");
      });
    Tensor t = ones({256});
    ctx.world->all_reduce(t);                   // #0 runs
    WorkPtr work = ctx.world->all_reduce_async(t);  // #1 fails on rank 0's worker
    if (ctx.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // busy: not waiting on it yet
      work->wait();
    }
    ctx.world->all_reduce(t);  // the peers wait here (after #1)
  });
  EXPECT_EQ(launched, "injected on the worker") << "launch rethrows the original exception";
  const Clock::time_point failed_at{Clock::duration(failed_at_ns.load())};
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(outcomes[r].type, "remote") << "rank " << r << ": " << outcomes[r].message;
    EXPECT_NE(outcomes[r].message.find("rank 0 failed: injected on the worker"), std::string::npos)
        << outcomes[r].message;
    EXPECT_LT(outcomes[r].at - failed_at, std::chrono::seconds(1)) << "not when rank 0's main thread woke up";
  }
}

// ---- point to point: a failed request stays failed --------------------------------------------------

class PointToPointFailures : public testing::Test {
 protected:
  void SetUp() override { SL_SKIP_UNDER_MPI("the ranks signal each other through shared memory"); }
};

// Rank 0's recv times out; only then does rank 1 send. A second wait() on the failed request must
// raise the same error again, not report success with the buffer's old bytes (nor eat the message,
// which a fresh recv then gets).
TEST_F(PointToPointFailures, ARecvThatTimedOutStaysFailed) {
  std::atomic<int> stage{0};  // 1: rank 0's recv timed out; 2: rank 1's message is posted
  auto wait_for_stage = [&](int s) {
    while (stage.load() < s) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  launch(2, [&](RankContext& ctx) {
    if (ctx.rank == 0) {
      Tensor t = zeros({4});
      WorkPtr work = ctx.world->irecv(t, 1);
      std::string first;
      try {
        work->wait();
      } catch (const TimeoutError& e) {
        first = e.what();
      }
      ASSERT_NE(first.find("timed out"), std::string::npos) << first;
      stage = 1;
      wait_for_stage(2);
      try {
        work->wait();
        ADD_FAILURE() << "the second wait() returned success; the tensor holds " << t;
      } catch (const TimeoutError& e) {
        EXPECT_EQ(std::string(e.what()), first) << "the same error again";
      }
      EXPECT_TRUE(work->is_completed()) << "a failed request is settled";
      EXPECT_EQ(t.to_vector(), std::vector<double>(4, 0.0));
      Tensor fresh = zeros({4});
      ctx.world->recv(fresh, 1);
      EXPECT_EQ(fresh.to_vector(), std::vector<double>(4, 7.0)) << "the message waits for a fresh recv";
    } else {
      wait_for_stage(1);
      WorkPtr sent = ctx.world->isend(full({4}, 7.0), 0);
      stage = 2;
      sent->wait();
    }
  }, quick(300));
}

TEST_F(PointToPointFailures, ASendThatTimedOutStaysFailed) {
  std::atomic<bool> done{false};
  launch(2, [&](RankContext& ctx) {
    if (ctx.rank == 1) {  // never receives; stays in its function until rank 0 is done
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    WorkPtr work = ctx.world->isend(full({4}, 1.0), 1);
    std::string first;
    try {
      work->wait();
    } catch (const TimeoutError& e) {
      first = e.what();
    }
    ASSERT_NE(first.find("timed out"), std::string::npos) << first;
    try {
      work->wait();
      ADD_FAILURE() << "the second wait() returned success, but nobody received the message";
    } catch (const TimeoutError& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
    EXPECT_TRUE(work->is_completed());
    done = true;
  }, quick(300));
}

TEST_F(PointToPointFailures, ARecvOfTheWrongSizeStaysFailed) {
  launch(2, [&](RankContext& ctx) {
    if (ctx.rank == 1) {
      ctx.world->send(full({3}, 5.0), 0);
      return;
    }
    Tensor t = zeros({4});
    WorkPtr work = ctx.world->irecv(t, 1);
    expect_error([&] { work->wait(); }, "rank 1 sent 12 bytes but the receiving tensor [4] f32 holds 16");
    expect_error([&] { work->wait(); }, "rank 1 sent 12 bytes");
    EXPECT_TRUE(work->is_completed());
  }, quick(2000));
}

TEST(Launch, EachRankHasItsOwnDeviceGradModeAndGenerator) {
  SL_SKIP_UNDER_MPI("checks thread-local state");
  std::vector<double> first_draw(3);
  std::mutex mutex;
  launch(3, [&](RankContext& ctx) {
    EXPECT_EQ(current_device(), Device::cpu(ctx.rank));
    EXPECT_EQ(ctx.device, Device::cpu(ctx.rank));
    manual_seed(100 + ctx.rank);
    double x = rand({1}).item();
    std::lock_guard lock(mutex);
    first_draw[ctx.rank] = x;
  });
  EXPECT_NE(first_draw[0], first_draw[1]);
  EXPECT_NE(first_draw[1], first_draw[2]);
}

TEST(Launch, RejectsBadArguments) {
  expect_error([] { launch(0, [](RankContext&) {}); }, "world size must be >= 1 (got 0)");
  LaunchOptions options;
  options.timeout = std::chrono::milliseconds(0);
  expect_error([&] { launch(1, [](RankContext&) {}, options); }, "timeout must be positive");
}

}  // namespace
}  // namespace sl::parallel
