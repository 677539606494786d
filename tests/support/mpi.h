// tests/support/mpi.h — what the MPI backend's test files share (one process per rank, under mpirun).
//
//   SKIP_UNLESS_UNDER_MPIRUN()   skips the test unless this process is one rank of an mpirun job, in
//                                a build with MPI (run the suites with tools/mpi_tests.sh).
//   mpi_options(timeout, debug)  a launch over the MPI backend with a collective timeout (quick_on,
//                                tests/support/parallel.h).
#pragma once
#include <gtest/gtest.h>

#include <chrono>

#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"

#ifdef SL_WITH_MPI
#define SKIP_UNLESS_UNDER_MPIRUN()     \
  if (!::sl::parallel::under_mpirun()) \
  GTEST_SKIP() << "MPI tests need one process per rank: run tools/mpi_tests.sh build/tests/shardlab_tests"
#else
#define SKIP_UNLESS_UNDER_MPIRUN() GTEST_SKIP() << "built without MPI (make MPI=1 with OpenMPI installed)"
#endif

namespace sl::parallel {

inline LaunchOptions mpi_options(std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                                 bool debug = false) {
  return quick_on(Backend::mpi, static_cast<int>(timeout.count()), debug);
}

}  // namespace sl::parallel
