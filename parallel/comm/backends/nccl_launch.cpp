// nccl_launch.cpp — bootstrapping the NCCL backend, and what a launch's ranks share. One process, one
// thread per GPU (launch_nccl: one ncclUniqueId, rank r on cuda:r), or mpirun, one process per GPU
// (launch_nccl_under_mpi: rank 0's id reaches the others by MPI_Bcast). NcclWorldState holds the first
// failure, which ends every rank's waits, and ends all the communicators of a thread-per-GPU launch
// together. Also the CUDA/NCCL error helpers behind SL_CUDA_CHECK and SL_NCCL_CHECK.
#include "parallel/comm/errors.h"
#include "parallel/comm/backends/nccl_backend.h"
#include "parallel/comm/backends/nccl_common.h"

#ifdef SL_WITH_NCCL
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "tensor/device.h"
#ifdef SL_WITH_MPI
#include <mpi.h>
#endif
#endif

namespace sl::parallel {

#ifdef SL_WITH_NCCL

using namespace nccl_detail;

static int count_gpus(std::string* why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count;
  *why = std::string(" (") + cudaGetErrorString(status) + ")";
  cudaGetLastError();  // not sticky: clear it so that later calls start clean
  return 0;
}

// ---- errors and the state a launch shares -------------------------------------------------------

namespace detail {

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  throw Error(::sl::detail::concat(file, ":", line, ": ", call, " failed: ", nccl_text(status)));
}

void NcclWorldState::fail(int world_rank, const std::string& what) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ >= 0) return;
  failed_rank_ = world_rank;
  failure_ = what;
  failed_.store(true, std::memory_order_release);
}

int NcclWorldState::failed_rank() const {
  std::lock_guard lock(mutex_);
  return failed_rank_;
}

std::string NcclWorldState::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

bool NcclWorldState::retire(const Comms& comms, bool unclean) {
  std::lock_guard lock(mutex_);
  if (!defer_teardown_) return false;
  retired_.insert(retired_.end(), comms.begin(), comms.end());
  unclean_ = unclean_ || unclean;
  return true;
}

}  // namespace detail

// Ends communicators. Clean: finalize them all first (NCCL flushes and meets its peers; polled, with a
// deadline), then destroy them. A failure, or a finalize that errs or outlasts the deadline, aborts.
// Never throws; never waits past the deadline.
void nccl_detail::end_communicators(const std::vector<std::pair<ncclComm_t, int>>& comms, bool clean,
                                    milliseconds timeout) noexcept {
  enum State : char { unfinished, finalizing, finalized };
  std::vector<State> state(comms.size(), unfinished);
  if (clean) {
    for (size_t i = 0; i < comms.size(); ++i) {
      cudaSetDevice(comms[i].second);
      ncclResult_t r = ncclCommFinalize(comms[i].first);
      if (r == ncclSuccess || r == ncclInProgress) state[i] = finalizing;
    }
    Clock::time_point deadline = Clock::now() + timeout;
    for (int polls = 0;; ++polls) {
      bool waiting = false;
      for (size_t i = 0; i < comms.size(); ++i) {
        if (state[i] != finalizing) continue;
        ncclResult_t async = ncclInProgress;
        if (ncclCommGetAsyncError(comms[i].first, &async) != ncclSuccess) async = ncclInternalError;
        if (async == ncclSuccess)
          state[i] = finalized;
        else if (async == ncclInProgress)
          waiting = true;
        else
          state[i] = unfinished;
      }
      if (!waiting || Clock::now() >= deadline) break;
      backoff(polls);
    }
  }
  for (size_t i = 0; i < comms.size(); ++i) {
    cudaSetDevice(comms[i].second);
    if (state[i] == finalized)
      ncclCommDestroy(comms[i].first);
    else
      ncclCommAbort(comms[i].first);  // also ends a finalize still in progress
  }
  cudaGetLastError();
}

void detail::NcclWorldState::teardown() noexcept {
  std::vector<std::pair<ncclComm_t, int>> comms;
  bool clean = false;
  {
    std::lock_guard lock(mutex_);
    comms.swap(retired_);
    defer_teardown_ = false;
    clean = !unclean_ && failed_rank_ < 0;
  }
  int previous = 0;
  bool restore = cudaGetDevice(&previous) == cudaSuccess;
  end_communicators(comms, clean, timeout_);
  if (restore) cudaSetDevice(previous);
}

// ---- bootstrap 1: one process, one thread per GPU ----------------------------------------------

void detail::launch_nccl(int world_size, const RankFunction& fn, const LaunchOptions& options) {
  if (under_mpirun()) return launch_nccl_under_mpi(world_size, fn, options);
  SL_CHECK(world_size >= 1, "launch: world size must be >= 1 (got ", world_size, ")");
  std::string why;
  const int gpus = count_gpus(&why);
  SL_CHECK(gpus >= world_size, "launch: the nccl backend runs one rank per GPU, so world size ", world_size, " needs ",
           world_size, " GPUs, but cudaGetDeviceCount found ", gpus, why);
  ncclUniqueId id;  // made once, read by every rank's ncclCommInitRank
  SL_NCCL_CHECK(ncclGetUniqueId(&id));
  GroupOptions group_options{options.timeout, options.debug_collectives};
  auto world = std::make_shared<detail::NcclWorldState>(/*defer_teardown=*/true, options.timeout);
  std::vector<std::shared_ptr<NcclProcessGroup>> groups(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        SL_CUDA_CHECK(cudaSetDevice(r));
        DeviceGuard device(Device::cuda(r));
        groups[r] = std::make_shared<NcclProcessGroup>(id, r, world_size, group_options, world);
        RankContext ctx{r, world_size, Device::cuda(r), groups[r], Backend::nccl};
        fn(ctx);
      } catch (...) {
        errors[r] = std::current_exception();
        world->fail(r, describe_exception(errors[r]));  // every other rank's wait now ends with RemoteError
      }
    });
  }
  for (std::thread& t : threads) t.join();
  groups.clear();     // the world group hands its communicator over to `world`,
  world->teardown();  // which ends them all together
  int failed = world->failed_rank();
  if (failed >= 0 && errors[failed]) std::rethrow_exception(errors[failed]);
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  // A rank timed out, caught the TimeoutError and returned: the launch still failed.
  if (failed >= 0) throw Error("launch: rank " + std::to_string(failed) + " failed: " + world->failure());
}

#endif  // SL_WITH_NCCL

// ---- bootstrap 2: mpirun, one process per GPU --------------------------------------------------

#if defined(SL_WITH_NCCL) && defined(SL_WITH_MPI)
std::shared_ptr<NcclProcessGroup> detail::make_nccl_world_from_mpi(const GroupOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  SL_CHECK(initialized, "make_nccl_world_from_mpi: MPI is not initialized (launch() initializes it under mpirun)");
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // This process takes the GPU numbered by its rank among the processes of its node.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  std::string why;
  const int gpus = count_gpus(&why);
  // Everyone learns whether everyone has its GPU, so that all fail here together rather than some
  // waiting in MPI_Bcast for a rank 0 that has already thrown.
  int mine_ok = gpus >= local_size ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&mine_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  SL_CHECK(mine_ok, "launch: the nccl backend runs one process per GPU, but this node runs ", local_size,
           " processes of the job and cudaGetDeviceCount found ", gpus, " GPUs", why);
  SL_CHECK(all_ok, "launch: another process of this mpirun job has fewer GPUs than processes on its node (rank ", rank,
           " found ", gpus, " for ", local_size, ")");
  SL_CUDA_CHECK(cudaSetDevice(local_rank));
  struct IdMessage {
    ncclUniqueId id;
    int32_t ok;
    char error[256];
  } message{};
  if (rank == 0) {
    ncclResult_t status = ncclGetUniqueId(&message.id);
    message.ok = status == ncclSuccess ? 1 : 0;
    std::snprintf(message.error, sizeof message.error, "%s", nccl_text(status).c_str());
  }
  MPI_Bcast(&message, static_cast<int>(sizeof message), MPI_BYTE, 0, MPI_COMM_WORLD);
  SL_CHECK(message.ok, "launch: rank 0 could not make the NCCL id: ncclGetUniqueId failed: ", message.error);
  auto world = std::make_shared<detail::NcclWorldState>(/*defer_teardown=*/false, options.timeout);
  return std::make_shared<NcclProcessGroup>(message.id, rank, size, options, world);
}
#endif

void detail::launch_nccl_under_mpi(int world_size, const RankFunction& fn, const LaunchOptions& options) {
#if defined(SL_WITH_NCCL) && defined(SL_WITH_MPI)
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  SL_CHECK(!finalized, "launch: MPI has already been finalized in this process");
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit([] {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    });
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  SL_CHECK(world_size == size, "launch: world size ", world_size, " but mpirun started ", size,
           " processes (mpirun -np ", world_size, ")");
  auto world = make_nccl_world_from_mpi(GroupOptions{options.timeout, options.debug_collectives});
  const int device = world->cuda_device();
  DeviceGuard guard(Device::cuda(device));
  RankContext ctx{rank, size, Device::cuda(device), world, Backend::nccl};
  try {
    fn(ctx);
  } catch (...) {
    world->abort("rank " + std::to_string(rank) + " failed: " + describe_exception(std::current_exception()));
    throw;
  }
#else
  (void)world_size, (void)fn, (void)options;
  throw Error("launch: the nccl backend under mpirun needs shardlab built with both NCCL and MPI");
#endif
}

}  // namespace sl::parallel
