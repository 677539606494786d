// parallel_test_util.h — what the parallel tests share.
//
//   SL_SKIP_UNLESS_WORLD(n)   under `mpirun -np k` a launch(n) with n != k cannot run: skip it there
//                             (visibly). On the threads backend every world size runs.
//   quick(ms)                 LaunchOptions with a short collective timeout, so a broken test fails
//                             in seconds instead of waiting NCCL's ten minutes.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "parallel/comm/launch.h"

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

namespace sl::parallel {

inline LaunchOptions quick(int timeout_ms = 5000, bool debug = false) {
  LaunchOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  options.debug_collectives = debug;
  return options;
}

// Name generator for tests parameterized over a world size: "world3".
inline std::string world_name(const testing::TestParamInfo<int>& info) {
  return "world" + std::to_string(info.param);
}

}  // namespace sl::parallel
