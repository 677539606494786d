// test_nccl.cpp — the NCCL backend: every operation on GPU buffers against values worked out here,
// the ledger against the ring formulas, and failures (a timeout, a rank that throws, a mismatch)
// that end in bounded time. The GPU tests skip, saying why, on machines with fewer GPUs than they
// need (CI has none). One test runs everywhere: asking for NCCL without the GPUs is a clear error.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "parallel/comm/errors.h"
#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"
#include "tensor/cuda_info.h"
#include "tests/support/test_util.h"
#include "tests/support/all_to_all.h"
#ifdef SL_WITH_NCCL
#include "parallel/comm/backends/nccl_backend.h"
#include "tensor/cpu/dispatch.h"
#endif

namespace sl::parallel {
namespace {

// Runs on every machine: without enough GPUs the launch raises an sl::Error naming both counts.
TEST(NcclLaunch, TooFewGpusIsAClearError) {
  SL_SKIP_UNDER_MPI("under mpirun the nccl backend takes the MPI bootstrap");
  const int gpus = cuda_info().device_count;
  const int world = gpus + 1;
  std::atomic<bool> ran{false};
  std::string message = message_of([&] {
    launch(
        world, [&](RankContext&) { ran = true; }, quick_on(Backend::nccl, 10000));
  });
#ifdef SL_WITH_NCCL
  std::string wanted = "world size " + std::to_string(world) + " needs " + std::to_string(world) + " GPUs";
  EXPECT_NE(message.find(wanted), std::string::npos) << message;
  EXPECT_NE(message.find("cudaGetDeviceCount found " + std::to_string(gpus)), std::string::npos) << message;
#else
  EXPECT_NE(message.find("without NCCL"), std::string::npos) << message;
#endif
  EXPECT_FALSE(ran);
}

#ifdef SL_WITH_NCCL

#define SL_SKIP_UNLESS_GPUS(n)                                                                      \
  do {                                                                                              \
    SL_SKIP_UNDER_MPI("one process, one thread per GPU");                                           \
    CudaInfo info_ = cuda_info();                                                                   \
    if (info_.device_count < (n))                                                                   \
      GTEST_SKIP() << "needs " << (n) << " GPU(s); cudaGetDeviceCount found " << info_.device_count \
                   << (info_.error.empty() ? "" : " (" + info_.error + ")");                        \
  } while (0)

// Rank r's value at element i: an integer in [-5, 5], so sums are exact in every dtype (bf16 holds
// integers to 256), and the largest and smallest sit on different ranks for different i (7r mod 11
// is 0, 7, 3, 10, 6, 2, 9, 5 for ranks 0-7): a max that always took the last rank would be caught.
double value(int r, int64_t i) { return static_cast<double>((7 * r + 3 * (i % 11)) % 11) - 5; }

std::vector<double> rank_values(int r, int64_t count, int64_t first = 0) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = value(r, first + i);
  return v;
}

double reduced(ReduceOp op, int n, int64_t i) {
  double sum = 0, max = value(0, i), min = value(0, i);
  for (int r = 0; r < n; ++r) {
    sum += value(r, i);
    max = std::max(max, value(r, i));
    min = std::min(min, value(r, i));
  }
  switch (op) {
    case ReduceOp::sum:
      return sum;
    case ReduceOp::avg:
      return sum / n;
    case ReduceOp::max:
      return max;
    case ReduceOp::min:
      return min;
  }
  return 0;
}


// cudaMalloc'd memory on this thread's GPU holding `dtype` values; freed at the end of the scope.
class DeviceBuffer {
 public:
  DeviceBuffer(int64_t count, DType dtype) : count_(count), dtype_(dtype) {
    SL_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(1, count * dtype_size(dtype))));
  }
  DeviceBuffer(const std::vector<double>& values, DType dtype)
      : DeviceBuffer(static_cast<int64_t>(values.size()), dtype) {
    std::vector<std::byte> bytes(values.size() * dtype_size(dtype));
    dispatch_all(dtype, [&](auto t) {
      using T = decltype(t);
      for (size_t i = 0; i < values.size(); ++i) {
        T x = static_cast<T>(values[i]);
        std::memcpy(bytes.data() + i * sizeof(T), &x, sizeof(T));
      }
    });
    SL_CUDA_CHECK(cudaMemcpy(data_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  std::vector<double> values() const {
    std::vector<std::byte> bytes(count_ * dtype_size(dtype_));
    SL_CUDA_CHECK(cudaMemcpy(bytes.data(), data_, bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<double> out(count_);
    dispatch_all(dtype_, [&](auto t) {
      using T = decltype(t);
      for (int64_t i = 0; i < count_; ++i) {
        T x;
        std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
        out[i] = static_cast<double>(x);
      }
    });
    return out;
  }

 private:
  void* data_ = nullptr;
  int64_t count_;
  DType dtype_;
};

NcclProcessGroup& nccl_group(RankContext& ctx) {
  auto* group = dynamic_cast<NcclProcessGroup*>(ctx.world.get());
  SL_CHECK(group != nullptr, "expected the nccl backend, got ", ctx.world->backend_name());
  return *group;
}

// ---- every collective, every dtype -------------------------------------------------------------

struct CollectiveCase {
  int world;
  DType dtype;
};

void PrintTo(const CollectiveCase& c, std::ostream* out) { *out << "world " << c.world << ", " << dtype_name(c.dtype); }

class NcclCollectives : public testing::TestWithParam<CollectiveCase> {};

TEST_P(NcclCollectives, MatchWorkedOutValues) {
  const CollectiveCase c = GetParam();
  SL_SKIP_UNLESS_GPUS(c.world);
  launch(
      c.world,
      [&](RankContext& ctx) {
        NcclProcessGroup& group = nccl_group(ctx);
        const int n = ctx.world_size, r = ctx.rank;
        const int64_t numel = 7;  // uneven ring chunks for n = 2..4, empty ones for n = 8
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
          if (op == ReduceOp::avg && !is_floating(c.dtype)) continue;
          DeviceBuffer buffer(rank_values(r, numel), c.dtype);
          group.all_reduce_device(buffer.get(), numel, c.dtype, op);
          std::vector<double> got = buffer.values();
          for (int64_t i = 0; i < numel; ++i)
            ASSERT_EQ(got[i], reduced(op, n, i)) << reduce_op_name(op) << " element " << i << " on rank " << r;
        }
        // all_gather: rank q's 3 values land at [3q, 3q + 3).
        DeviceBuffer mine(rank_values(r, 3), c.dtype), gathered(3 * n, c.dtype);
        group.all_gather_device(gathered.get(), mine.get(), 3, c.dtype);
        std::vector<double> all = gathered.values();
        for (int q = 0; q < n; ++q)
          for (int i = 0; i < 3; ++i) ASSERT_EQ(all[3 * q + i], value(q, i)) << "from rank " << q << " element " << i;
        // reduce_scatter: rank r ends with elements [3r, 3r + 3) of the sum.
        DeviceBuffer whole(rank_values(r, 3 * n), c.dtype), part(3, c.dtype);
        group.reduce_scatter_device(part.get(), whole.get(), 3, c.dtype, ReduceOp::sum);
        std::vector<double> chunk = part.values();
        for (int i = 0; i < 3; ++i) ASSERT_EQ(chunk[i], reduced(ReduceOp::sum, n, 3 * r + i)) << "element " << i;
        // broadcast from the last rank.
        DeviceBuffer shared(rank_values(r, 5), c.dtype);
        group.broadcast_device(shared.get(), 5, c.dtype, n - 1);
        EXPECT_EQ(shared.values(), rank_values(n - 1, 5));
      },
      quick_on(Backend::nccl, 10000));
}

std::vector<CollectiveCase> collective_cases() {
  std::vector<CollectiveCase> cases{{1, DType::f32}, {4, DType::f32}};
  for (int world : {2, 8})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
      cases.push_back({world, dtype});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclCollectives, testing::ValuesIn(collective_cases()),
                         [](const testing::TestParamInfo<CollectiveCase>& info) {
                           return "world" + std::to_string(info.param.world) + "_" + dtype_name(info.param.dtype);
                         });

// ---- the ledger, send/recv, sub-groups ---------------------------------------------------------

class NcclWorld : public testing::TestWithParam<int> {};

// S divides by every world size here, so the ring formulas are exact.
TEST_P(NcclWorld, LedgerMatchesTheRingFormulas) {
  const int n = GetParam();
  SL_SKIP_UNLESS_GPUS(n);
  launch(
      n,
      [&](RankContext& ctx) {
        NcclProcessGroup& group = nccl_group(ctx);
        const int r = ctx.rank;
        const int64_t numel = 24, S = numel * 4;  // f32
        DeviceBuffer a(rank_values(r, numel), DType::f32), gathered(n * numel, DType::f32), part(numel, DType::f32);
        group.all_reduce_device(a.get(), numel, DType::f32);
        group.all_gather_device(gathered.get(), a.get(), numel, DType::f32);
        group.reduce_scatter_device(part.get(), gathered.get(), numel, DType::f32);
        group.broadcast_device(a.get(), numel, DType::f32, 0);
        ctx.world->barrier();
        const CommLedger& ledger = ctx.world->ledger();
        // NCCL picks its own algorithm: these figures are the ring's model, and the report says so.
        EXPECT_TRUE(ledger.collectives_modelled());
        EXPECT_NE(ledger.report().find("(ring model)"), std::string::npos) << ledger.report();
        EXPECT_EQ(ledger[CommOp::all_reduce].calls, 1);
        EXPECT_EQ(ledger[CommOp::all_reduce].bytes_sent, 2 * (n - 1) * S / n);
        EXPECT_EQ(ledger[CommOp::all_reduce].bytes_received, 2 * (n - 1) * S / n);
        EXPECT_EQ(ledger[CommOp::all_gather].bytes_sent, (n - 1) * (n * S) / n);  // S_total = n·S
        EXPECT_EQ(ledger[CommOp::all_gather].bytes_received, (n - 1) * (n * S) / n);
        EXPECT_EQ(ledger[CommOp::reduce_scatter].bytes_sent, (n - 1) * (n * S) / n);
        EXPECT_EQ(ledger[CommOp::reduce_scatter].bytes_received, (n - 1) * (n * S) / n);
        // broadcast chain from rank 0: rank 0 sends S, rank n-1 receives S, the rest both.
        EXPECT_EQ(ledger[CommOp::broadcast].bytes_sent, n > 1 && r < n - 1 ? S : 0);
        EXPECT_EQ(ledger[CommOp::broadcast].bytes_received, n > 1 && r > 0 ? S : 0);
        EXPECT_EQ(ledger[CommOp::barrier].calls, 1);
        EXPECT_EQ(ledger[CommOp::barrier].bytes_sent, 0);
        if (n > 1) {
          DeviceBuffer message(rank_values(r, numel), DType::f32);
          if (r == 0) group.isend_device(message.get(), numel, DType::f32, 1)->wait();
          if (r == 1) group.irecv_device(message.get(), numel, DType::f32, 0)->wait();
          EXPECT_EQ(ledger[CommOp::send].bytes_sent, r == 0 ? S : 0);
          EXPECT_EQ(ledger[CommOp::recv].bytes_received, r == 1 ? S : 0);
          if (r == 1) {
            EXPECT_EQ(message.values(), rank_values(0, numel));
          }
        }
      },
      quick_on(Backend::nccl, 10000));
}

// isend right, irecv left, then wait: NCCL issues both together, so the ring cannot deadlock.
TEST_P(NcclWorld, SendRecvAroundTheRing) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "a ring needs two ranks";
  SL_SKIP_UNLESS_GPUS(n);
  launch(
      n,
      [&](RankContext& ctx) {
        NcclProcessGroup& group = nccl_group(ctx);
        const int r = ctx.rank, right = (r + 1) % n, left = (r + n - 1) % n;
        DeviceBuffer out(rank_values(r, 1000), DType::f32), in(1000, DType::f32);
        WorkPtr sent = group.isend_device(out.get(), 1000, DType::f32, right);
        WorkPtr received = group.irecv_device(in.get(), 1000, DType::f32, left);
        received->wait();
        sent->wait();
        EXPECT_TRUE(sent->is_completed());
        EXPECT_EQ(in.values(), rank_values(left, 1000));
      },
      quick_on(Backend::nccl, 10000));
}

TEST_P(NcclWorld, SubGroupsBySplitAndNewGroup) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "sub-groups need two ranks";
  SL_SKIP_UNLESS_GPUS(n);
  launch(
      n,
      [&](RankContext& ctx) {
        const int r = ctx.rank;
        // Even and odd ranks, ordered by rank: the sum over one parity.
        ProcessGroupPtr parity = ctx.world->split(r % 2);
        ASSERT_NE(parity, nullptr);
        auto& sub = dynamic_cast<NcclProcessGroup&>(*parity);
        EXPECT_EQ(sub.size(), (n - r % 2 + 1) / 2);
        EXPECT_EQ(sub.global_rank(sub.rank()), r);
        DeviceBuffer one(std::vector<double>{static_cast<double>(r)}, DType::f64);
        sub.all_reduce_device(one.get(), 1, DType::f64);
        double expected = 0;
        for (int q = r % 2; q < n; q += 2) expected += q;
        EXPECT_EQ(one.values()[0], expected);
        // The first and the last rank only; the others get nullptr.
        ProcessGroupPtr ends = ctx.world->new_group({0, n - 1});
        EXPECT_EQ(ends != nullptr, r == 0 || r == n - 1);
        if (ends) {
          DeviceBuffer mine(std::vector<double>{static_cast<double>(r + 1)}, DType::f64);
          dynamic_cast<NcclProcessGroup&>(*ends).all_reduce_device(mine.get(), 1, DType::f64);
          EXPECT_EQ(mine.values()[0], 1.0 + n);
          EXPECT_EQ(ends->global_rank(1), n - 1);
        }
      },
      quick_on(Backend::nccl, 10000));
}

// all_to_all through the Tensor API (grouped ncclSend/ncclRecv): equal chunks, then both uneven rules
// (empty chunks; rank 0 sends nothing), exact values (tests/support/all_to_all.h), and the ledger's bytes
// of the rows that left the rank (what moved, not a ring model).
TEST_P(NcclWorld, AllToAllEqualAndUnevenChunks) {
  const int n = GetParam();
  SL_SKIP_UNLESS_GPUS(n);
  launch(
      n,
      [&](RankContext& ctx) {
        const int r = ctx.rank;
        const Shape row({2, 3});  // 24 bytes of f32
        const TensorOptions on_gpu(DType::f32, ctx.device);
        const std::vector<int64_t> two_each(n, 2);
        Tensor input = input_of(r, two_each, row, DType::f32).to(ctx.device), output = zeros(input.shape(), on_gpu);
        ctx.world->all_to_all(output, input);
        EXPECT_EQ(output.to_vector(), expected_output(r, two_each, row.numel())) << "equal chunks, rank " << r;
        int64_t rows_out = 2 * (n - 1);
        for (const SplitRule& rule : split_rules()) {
          const std::vector<int64_t> sends = rows_sent_by(rule, r, n), receives = rows_received_by(rule, r, n);
          Tensor out = full(stacked(sum_of(receives), row), -1.0, on_gpu);
          ctx.world->all_to_all(out, input_of(r, sends, row, DType::f32).to(ctx.device), receives, sends);
          EXPECT_EQ(out.to_vector(), expected_output(r, receives, row.numel())) << rule.name << ", rank " << r;
          for (int q = 0; q < n; ++q) rows_out += q == r ? 0 : rule.rows(r, q);
        }
        const CommStats stats = ctx.world->ledger()[CommOp::all_to_all];
        EXPECT_EQ(stats.calls, 3);
        EXPECT_EQ(stats.bytes_sent, rows_out * 24);
      },
      quick_on(Backend::nccl, 10000));
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclWorld, testing::Values(1, 2, 4, 8), world_name);

// Send/recv have their own communicator and stream, so a pending isend neither waits behind a
// collective of the same group nor holds one up, whichever order the receiver takes them in.
TEST(NcclPointToPoint, NeverQueuedBehindACollective) {
  SL_SKIP_UNLESS_GPUS(2);
  for (bool receiver_collective_first : {true, false}) {
    launch(
        2,
        [&](RankContext& ctx) {
          NcclProcessGroup& group = nccl_group(ctx);
          DeviceBuffer message(rank_values(ctx.rank, 64), DType::f32), sum(rank_values(ctx.rank, 8), DType::f32);
          if (ctx.rank == 0) {
            WorkPtr sent = group.isend_device(message.get(), 64, DType::f32, 1);
            group.all_reduce_device(sum.get(), 8, DType::f32);
            sent->wait();
          } else if (receiver_collective_first) {
            group.all_reduce_device(sum.get(), 8, DType::f32);
            group.irecv_device(message.get(), 64, DType::f32, 0)->wait();
          } else {
            group.irecv_device(message.get(), 64, DType::f32, 0)->wait();
            group.all_reduce_device(sum.get(), 8, DType::f32);
          }
          if (ctx.rank == 1) {
            EXPECT_EQ(message.values(), rank_values(0, 64));
          }
          for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(sum.values()[i], reduced(ReduceOp::sum, 2, i));
        },
        quick_on(Backend::nccl, 10000));
  }
}

// ---- what must fail, and how fast --------------------------------------------------------------

TEST(NcclFailures, CpuTensorIsRejected) {
  SL_SKIP_UNLESS_GPUS(1);
  launch(
      1,
      [&](RankContext& ctx) {
        Tensor on_cpu = Tensor::empty(Shape({4}), TensorOptions(DType::f32, Device::cpu()));
        expect_error([&] { ctx.world->all_reduce(on_cpu); }, "on this rank's GPU cuda:0, got a tensor on cpu:0");
      },
      quick_on(Backend::nccl, 10000));
}

// Rank 1 skips the collective: rank 0 times out after the group's timeout, not NCCL's ten minutes,
// and its communicator is unusable afterwards.
TEST(NcclFailures, TimeoutRaisesTimeoutError) {
  SL_SKIP_UNLESS_GPUS(2);
  std::string message, second;
  long long waited_ms = -1;
  EXPECT_THROW(launch(
                   2,
                   [&](RankContext& ctx) {
                     if (ctx.rank == 1) return;
                     NcclProcessGroup& group = nccl_group(ctx);
                     DeviceBuffer buffer(rank_values(0, 16), DType::f32);
                     auto start = std::chrono::steady_clock::now();
                     try {
                       group.all_reduce_device(buffer.get(), 16, DType::f32);
                     } catch (const TimeoutError& e) {
                       waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count();
                       message = e.what();
                       second = message_of([&] { group.all_reduce_device(buffer.get(), 16, DType::f32); });
                       throw;
                     }
                   },
                   quick_on(Backend::nccl, 1000)),
               TimeoutError);
  EXPECT_NE(message.find("all_reduce #0 on rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("timeout 1000 ms"), std::string::npos) << message;
  EXPECT_GE(waited_ms, 1000);
  EXPECT_LT(waited_ms, 5000);
  EXPECT_NE(second.find("aborted earlier"), std::string::npos) << second;
}

// Rank 1 throws after one collective: rank 0, blocked in the next, raises RemoteError naming it long
// before its timeout, and launch() rethrows rank 1's own exception.
TEST(NcclFailures, ThrowingRankAbortsTheOthers) {
  SL_SKIP_UNLESS_GPUS(2);
  std::string seen_by_rank0;
  int failed_rank = -1;
  auto start = std::chrono::steady_clock::now();
  try {
    launch(
        2,
        [&](RankContext& ctx) {
          NcclProcessGroup& group = nccl_group(ctx);
          DeviceBuffer buffer(rank_values(ctx.rank, 16), DType::f32);
          group.all_reduce_device(buffer.get(), 16, DType::f32);
          if (ctx.rank == 1) throw std::runtime_error("rank 1 gives up");
          try {
            group.all_reduce_device(buffer.get(), 16, DType::f32);
          } catch (const RemoteError& e) {
            seen_by_rank0 = e.what();
            failed_rank = e.failed_rank();
            throw;
          }
        },
        quick_on(Backend::nccl, 30000));
    ADD_FAILURE() << "launch should have thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 1 gives up");
  }
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20) << "the abort should not wait for the 30 s timeout";
  EXPECT_EQ(failed_rank, 1);
  EXPECT_NE(seen_by_rank0.find("aborted because rank 1 failed: rank 1 gives up"), std::string::npos) << seen_by_rank0;
}

// Debug mode compares fingerprints through exchange() (an all-gather in pinned host memory) before
// the tensors are even looked at: CPU tensors are enough to see the mismatch.
TEST(NcclFailures, DebugModeReportsMismatchedCollectives) {
  SL_SKIP_UNLESS_GPUS(2);
  LaunchOptions options = quick_on(Backend::nccl, 10000);
  options.debug_collectives = true;
  std::string message = message_of([&] {
    launch(
        2,
        [&](RankContext& ctx) {
          Tensor t = Tensor::empty(Shape({4}), TensorOptions(DType::f32, Device::cpu()));
          if (ctx.rank == 0)
            ctx.world->all_reduce(t);
          else
            ctx.world->broadcast(t, 0);
        },
        options);
  });
  EXPECT_NE(message.find("collective mismatch"), std::string::npos) << message;
  EXPECT_NE(message.find("all_reduce #0"), std::string::npos) << message;
  EXPECT_NE(message.find("broadcast #0"), std::string::npos) << message;
}

// NCCL cannot tell a receive of another size (it waits for the timeout, or takes a cut chunk): debug
// mode compares every pair's all_to_all split sizes first, so every rank names the pair at once. The
// comparison comes before the tensors are looked at: CPU tensors are enough.
TEST(NcclFailures, DebugModeNamesAllToAllSplitSizesThatDisagree) {
  SL_SKIP_UNLESS_GPUS(2);
  LaunchOptions options = quick_on(Backend::nccl, 20000);
  options.debug_collectives = true;
  const auto start = std::chrono::steady_clock::now();
  std::string message = message_of([&] {
    launch(
        2,
        [&](RankContext& ctx) {
          // Rank 0 sends rank 1 two rows; rank 1 expects one.
          const std::vector<int64_t> sends = ctx.rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 1};
          const std::vector<int64_t> receives = {1, 1};
          Tensor input = Tensor::empty(Shape({sum_of(sends), 3}), TensorOptions(DType::f32, Device::cpu()));
          Tensor output = Tensor::empty(Shape({2, 3}), TensorOptions(DType::f32, Device::cpu()));
          ctx.world->all_to_all(output, input, receives, sends);
        },
        options);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << message;
  EXPECT_NE(message.find("rank 0 sends rank 1 24 bytes but rank 1 expects 12"), std::string::npos) << message;
}

#endif  // SL_WITH_NCCL

}  // namespace
}  // namespace sl::parallel
