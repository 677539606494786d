// mpi_runtime.h — private to parallel/mpi_*.cpp: what the MPI backend's files share. The process-wide
// MPI runtime (started once, finalized at exit), dtype and op mapping, the checked-call macro, the
// keep-alive list for given-up requests, and MpiLaunchState: what all groups of one launch share (the
// control communicator for abort records, the failure, and the polling wait every operation ends in).
//
//   mpi_runtime.cpp   MPI start/finalize, dtypes and ops (bf16/f16 user ops), the launch state, launch_mpi
//   mpi_backend.cpp   the group: construction, teardown, all_reduce, all_gather, reduce_scatter,
//                     broadcast, barrier, the fingerprint exchange, sub-groups
//   mpi_p2p.cpp       isend/irecv and their Work
#pragma once
#include "parallel/comm/backends/mpi_backend.h"

#ifdef SL_WITH_MPI
#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace sl::parallel {

namespace mpi_detail {

using Clock = std::chrono::steady_clock;
using KeepAlive = std::vector<std::shared_ptr<const void>>;

inline long long milliseconds_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

struct MpiRuntime {
  bool thread_multiple = false;  // else SERIALIZED: every MPI call takes one process-wide lock
  int tag_upper_bound = 32767;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL, f16 = MPI_DATATYPE_NULL;  // 2-byte types of their own
  MPI_Op half_sum = MPI_OP_NULL, half_max = MPI_OP_NULL, half_min = MPI_OP_NULL;
};

// Starts MPI on first use (finalized at process exit); immutable afterwards.
const MpiRuntime& runtime();

// Held around every MPI call when MPI is only SERIALIZED; empty (no lock) when it is MULTIPLE.
std::unique_lock<std::mutex> serialize_mpi();

bool mpi_finalized();

// Raises sl::Error "where: MPI error: ..." unless code is MPI_SUCCESS.
void check_mpi(int code, const std::string& where);

// Buffers of requests that were given up on: MPI may still write into them, so they live until the
// process exits (deliberately never freed).
void keep_until_exit(const KeepAlive& buffers);

MPI_Datatype mpi_type(DType dtype);
MPI_Op mpi_op(ReduceOp op, DType dtype);  // avg maps to sum: the caller divides afterwards

// MPI counts in int: larger tensors are a user error, not a silent truncation.
inline int mpi_count(const char* op, int64_t count) {
  SL_CHECK(count <= INT_MAX, op, ": the mpi backend moves at most ", INT_MAX, " elements per call, got ", count);
  return static_cast<int>(count);
}

inline void check_cpu(const char* op, const Tensor& tensor) {
  SL_CHECK(tensor.device().is_cpu(), op, ": the mpi backend moves CPU tensors, got one on ", tensor.device(),
           " (use the nccl backend for CUDA tensors)");
}

}  // namespace mpi_detail

// Makes one MPI call (under the lock when MPI is only SERIALIZED) and raises its error code.
#define SL_MPI_CALL(where, call)                                       \
  do {                                                                 \
    int sl_mpi_code_;                                                  \
    {                                                                  \
      auto sl_mpi_lock_ = ::sl::parallel::mpi_detail::serialize_mpi(); \
      sl_mpi_code_ = (call);                                           \
    }                                                                  \
    ::sl::parallel::mpi_detail::check_mpi(sl_mpi_code_, where);        \
  } while (0)

// ---- what all groups of one launch share --------------------------------------------------------

class MpiLaunchState {
 public:
  MpiLaunchState(int abort_tag, int world_rank, int world_size)
      : abort_tag_(abort_tag), world_rank_(world_rank), world_size_(world_size) {}
  ~MpiLaunchState();
  int world_rank() const { return world_rank_; }

  // A fresh duplicate of MPI_COMM_WORLD (the first one becomes the control communicator).
  MPI_Comm dup_world(std::chrono::milliseconds timeout);

  // Polls `request` to completion, or gives up: RemoteError when another rank's abort record
  // arrives, TimeoutError after `timeout` (this rank's own record then goes to everyone). When it
  // gives up, `buffers` stay allocated until exit, since MPI may still write into them.
  //
  //   MPI_Test ─ done? ─ yes ──> return
  //      │ no
  //      ├─ every 1 ms: abort record on the control communicator? ──> RemoteError
  //      ├─ every 1 ms: waited longer than the timeout? ──> tell everyone, TimeoutError
  //      └─ yield (first 2 ms), then sleep 50 µs (500 µs after 100 ms), test again
  MPI_Status wait(MPI_Request& request, const std::string& where, std::chrono::milliseconds timeout,
                  const mpi_detail::KeepAlive& buffers);

  // Raises RemoteError if any rank of this launch failed (this one included).
  void throw_if_aborted(const std::string& where);

  // This rank failed: send its abort record to every other rank, unless the failure came from
  // another rank's record (then everyone already has that one, which names the rank to blame).
  void notify_failure(const std::string& what);

  bool failed() {
    std::lock_guard lock(mutex_);
    return failed_rank_ >= 0;
  }

  // The end of a launch: nobody returns before every rank's function did, so either all ranks
  // return normally or all of them raise.
  void wait_for_everyone(std::chrono::milliseconds timeout);

 private:
  void receive_abort_record();  // with mutex_ held

  std::mutex mutex_;
  MPI_Comm control_ = MPI_COMM_NULL;
  int abort_tag_, world_rank_, world_size_;
  int failed_rank_ = -1;
  std::string failure_;
};

}  // namespace sl::parallel

#endif  // SL_WITH_MPI
