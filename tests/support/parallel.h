// tests/support/parallel.h — what the parallel tests share.
//
//   SL_SKIP_UNLESS_WORLD(n)   under `mpirun -np k` a launch(n) with n != k cannot run: skip it there
//                             (visibly). On the threads backend every world size runs.
//   quick(ms)                 LaunchOptions with a short collective timeout, so a broken test fails
//                             in seconds instead of waiting NCCL's ten minutes.
//   quick_on(backend, ms)     the same on one backend (threads even under mpirun, nccl, mpi).
//   launch_recording(n, options, outcomes, fn)
//                             launch fn and record how each rank's function ended (the error type
//                             and message, and when): for the tests of failures and their messages.
//   (the small GPT, AdamW settings and tokens of the parity suites: tests/support/trainer.h)
//
// SL_TEST_DEVICE=cpu|cuda (default cpu): where the suites that opt in run their tensors.
//   SL_TEST_ON_DEVICE()       at the top of a single-process test: with cuda, skips (saying why) without
//                             a GPU, else makes cuda:0 the current device for the rest of the test, so
//                             that every tensor made without a device (models, batches) lands there.
//   SL_SKIP_UNLESS_TEST_DEVICE_RUNS(world), on_test_device(options, world)
//                             for a multi-rank test. With cuda: as many GPUs as ranks (and NCCL built)
//                             run rank r on cuda:r over NCCL; fewer run the ranks as threads sharing the
//                             GPUs (launch's rank_device), their collectives staged through host memory
//                             (parallel/comm/backends/host_staging.h). Without a GPU the test skips.
//   Opted in so far: tests/nn/test_gpt.cpp (GPT.*), the DDP cases of tests/parallel/data_parallel/test_data_parallel.cpp, the
//   ZeRO-1/2 and FSDP/HSDP parity suites of tests/parallel/zero (Stages/Zero.MatchesSerial,
//   Layouts/Fsdp.*, Layouts/Hsdp.*; offload keeps the optimizer on each rank's host), the parity suites
//   of tensor, context (ring, all-gather, Ulysses, hybrid) and N-D parallelism (with their ZeRO and FSDP
//   cases), and the pipeline through the Trainer; tests/parallel/comm/test_host_staging.cpp. Cases that
//   need the CPU skip on cuda, saying why: naive DP (its packing runs on host memory). The other suites,
//   and the ledger's memory suites, run on the CPU whatever it says.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/errors.h"
#include "parallel/comm/launch.h"
#include "tensor/cuda_info.h"
#include "tensor/device.h"

#define SL_SKIP_UNLESS_WORLD(n)                                                                  \
  do {                                                                                           \
    if (::sl::parallel::under_mpirun() && ::sl::parallel::mpirun_world_size() != (n))            \
      GTEST_SKIP() << "needs world " << (n) << "; this mpirun has -np "                          \
                   << ::sl::parallel::mpirun_world_size();                                       \
  } while (0)

#define SL_SKIP_UNDER_MPI(why)                                            \
  do {                                                                    \
    if (::sl::parallel::under_mpirun()) GTEST_SKIP() << "threads backend only: " << (why); \
  } while (0)

namespace sl {

// SL_TEST_DEVICE=cuda asks for the GPU; anything else (unset, "cpu") the CPU.
inline bool test_on_cuda() {
  const char* name = std::getenv("SL_TEST_DEVICE");
  return name != nullptr && std::string(name) == "cuda";
}

// Where a single-process test's tensors go: cuda:0, or the thread's current (CPU) device.
inline Device test_device() { return test_on_cuda() ? Device::cuda(0) : current_device(); }

// Why SL_TEST_DEVICE cannot run a test here ("" when it can): cuda needs a GPU, whatever the ranks.
inline std::string test_device_missing(int /*ranks*/ = 1) {
  if (!test_on_cuda()) return "";
  const CudaInfo cuda = cuda_info();
  if (cuda.device_count == 0)
    return "SL_TEST_DEVICE=cuda: no CUDA device" + (cuda.error.empty() ? std::string() : " (" + cuda.error + ")");
  return "";
}

// A case that runs on host memory only (naive DP): why it skips on SL_TEST_DEVICE=cuda.
#define SL_SKIP_ON_TEST_CUDA(why)                                                 \
  do {                                                                            \
    if (::sl::test_on_cuda()) GTEST_SKIP() << "SL_TEST_DEVICE=cuda: " << (why);   \
  } while (0)

}  // namespace sl

#define SL_TEST_ON_DEVICE()                                                                \
  if (const std::string sl_missing_ = ::sl::test_device_missing(1); !sl_missing_.empty()) \
    GTEST_SKIP() << sl_missing_;                                                           \
  const ::sl::DeviceGuard sl_test_device_guard_(::sl::test_device())

#define SL_SKIP_UNLESS_TEST_DEVICE_RUNS(world)                                                   \
  do {                                                                                          \
    if (const std::string sl_missing_ = ::sl::test_device_missing(world); !sl_missing_.empty()) \
      GTEST_SKIP() << sl_missing_;                                                              \
  } while (0)

namespace sl::parallel {

// The launch of a multi-rank test on SL_TEST_DEVICE: with cuda, NCCL (rank r on cuda:r) when every
// rank has a GPU of its own, else thread ranks sharing the GPUs. Under mpirun the ranks stay on the CPU.
inline LaunchOptions on_test_device(LaunchOptions options, [[maybe_unused]] int world) {
  if (!test_on_cuda() || under_mpirun()) return options;
#ifdef SL_WITH_NCCL
  if (cuda_info().device_count >= world) {
    options.backend = Backend::nccl;
    return options;
  }
#endif
  options.rank_device = DeviceKind::CUDA;
  return options;
}

inline LaunchOptions quick(int timeout_ms = 5000, bool debug = false) {
  LaunchOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  options.debug_collectives = debug;
  return options;
}

inline LaunchOptions quick_on(Backend backend, int timeout_ms = 5000, bool debug = false) {
  LaunchOptions options = quick(timeout_ms, debug);
  options.backend = backend;
  return options;
}

// How one rank's function ended.
struct RankOutcome {
  std::string type;  // "mismatch", "remote", "timeout", "other", or "" (it returned)
  std::string message;
  std::chrono::steady_clock::time_point at;  // when it threw
};

// What launch_recording returns when launch did not throw.
inline const std::string kLaunchReturned = "(launch returned normally)";

// Runs fn on n ranks, recording in outcomes[rank] how each rank's function ended (the error is
// rethrown, so launch sees it as before); returns the message launch threw, or kLaunchReturned.
inline std::string launch_recording(int n, const LaunchOptions& options, std::vector<RankOutcome>& outcomes,
                                    const std::function<void(RankContext&)>& fn) {
  outcomes.assign(n, RankOutcome{});
  auto record = [&](int rank, const char* type, const std::exception& e) {
    outcomes[rank] = {type, e.what(), std::chrono::steady_clock::now()};
  };
  try {
    launch(
        n,
        [&](RankContext& ctx) {
          try {
            fn(ctx);
          } catch (const RemoteError& e) {
            record(ctx.rank, "remote", e);
            throw;
          } catch (const TimeoutError& e) {
            record(ctx.rank, "timeout", e);
            throw;
          } catch (const CollectiveMismatch& e) {
            record(ctx.rank, "mismatch", e);
            throw;
          } catch (const std::exception& e) {
            record(ctx.rank, "other", e);
            throw;
          }
        },
        options);
  } catch (const std::exception& e) {
    return e.what();
  }
  return kLaunchReturned;
}

// Name generator for tests parameterized over a world size: "world3".
inline std::string world_name(const testing::TestParamInfo<int>& info) {
  return "world" + std::to_string(info.param);
}

}  // namespace sl::parallel
