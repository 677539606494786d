// nccl_backend.h — ranks on GPUs, collectives run by NVIDIA's NCCL.
//
//   Rank r owns GPU cuda:r and, per group, an NCCL communicator with its CUDA stream (plus one for
//   send/recv, below). A collective enqueues NCCL's kernel on the stream, then the host thread
//   polls until it is done, so that a wait can end:
//
//     host (rank r)   enqueue ─> poll: done? NCCL async error? world aborted? timeout? ─> return
//     GPU cuda:r      ·····[ ncclAllReduce kernel: ring/tree over NVLink, PCIe or the network ]·····
//
//   Communicators are non-blocking (ncclConfig_t::blocking = 0): no NCCL call blocks the host, not
//   even init or split. Every failure ends the same way, after ncclCommAbort(this communicator):
//     TimeoutError  the group's timeout passed (a rank skipped the collective, or is stuck)
//     RemoteError   another rank of this process failed first (the launch's shared abort flag)
//     sl::Error     NCCL or CUDA reported an error (the message has ncclGetErrorString's words)
//
//   Cost: NCCL picks ring, tree or NVLS itself, but the ledger counts the bytes of the ring
//   algorithms the threads backend runs, so ledgers are equal across backends (S = bytes):
//     all_reduce 2(n-1)/n·S each way     all_gather, reduce_scatter (n-1)/n·S_total
//     broadcast  chain from the root: root sends S, the last rank receives S, the rest both
//     send/recv  S                        barrier, fingerprint exchanges: not counted
//
//   Bootstrap (the ncclUniqueId must reach every rank before ncclCommInitRank):
//     one process, one thread per GPU   launch(n, fn, {.backend = Backend::nccl}) -> detail::launch_nccl
//     mpirun -np n, one process per GPU rank 0 makes the id, MPI_Bcast sends it: detail::launch_nccl_under_mpi
//   Sub-groups (new_group, split) are ncclCommSplit of the parent.
//
//   Send/recv run on a second communicator (ncclCommSplit of the first) and a second stream: NCCL
//   runs a communicator's operations in issue order, so on one communicator an isend waiting for
//   its receiver would hold up every collective after it. isend/irecv are queued, then issued
//   together (one ncclGroupStart/End) when one of them is waited on, is_completed() is asked, or a
//   collective starts: "isend right, irecv left, wait" then works around a ring. NCCL has no tags;
//   it matches the sends and receives between two ranks in issue order. A blocking send() to a rank
//   that is itself blocked in send() to this one waits until the timeout (as MPI_Ssend would).
//
//   Tensors must live on the rank's GPU (tensor.device() == cuda:r); the *_device functions below
//   run the same operations on raw CUDA memory.
//
//   Code: nccl_backend.cpp (the group, its engine, sub-groups), nccl_collectives.cpp, nccl_p2p.cpp,
//   nccl_launch.cpp (bootstrap, the world's abort state); nccl_common.h is what they share.
//   Tests: tests/parallel/comm/test_nccl.cpp (they skip, saying why, without enough GPUs).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/process_group.h"

#ifdef SL_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "tensor/cuda/check.h"
#endif

namespace sl::parallel {

#ifdef SL_WITH_NCCL

namespace detail {
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line);

// What all NCCL groups of one launch in this process share: the first failure, which ends every
// wait of every rank, and (one thread per GPU) the communicators to tear down at the end.
class NcclWorldState {
 public:
  NcclWorldState(bool defer_teardown, std::chrono::milliseconds timeout)
      : timeout_(timeout), defer_teardown_(defer_teardown) {}
  void fail(int world_rank, const std::string& what);  // the first call wins
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  int failed_rank() const;
  std::string failure() const;

  // One process, many GPUs: NCCL frees a process's communicators when the last of them goes, and a
  // clean ncclCommDestroy meets the others in a barrier, so they must all be destroyed, or all
  // aborted, together. Groups hand theirs over here; teardown() ends them all (aborts if anything
  // failed or was left running) and makes later groups end their own.
  using Comms = std::vector<std::pair<ncclComm_t, int>>;  // (communicator, its device)
  bool retire(const Comms& comms, bool unclean);          // false: not deferring, end them yourself
  void teardown() noexcept;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  int failed_rank_ = -1;
  std::string failure_;
  std::chrono::milliseconds timeout_;  // how long a clean teardown may wait for the peers
  bool defer_teardown_;
  bool unclean_ = false;
  Comms retired_;
};
}  // namespace detail

// Throw sl::Error naming the call, file, line and ncclGetErrorString (SL_CUDA_CHECK: tensor/cuda/check.h).
#define SL_NCCL_CHECK(call)                                                                 \
  do {                                                                                      \
    ncclResult_t sl_nccl_status_ = (call);                                                  \
    if (sl_nccl_status_ != ncclSuccess)                                                     \
      ::sl::parallel::detail::throw_nccl_error(sl_nccl_status_, #call, __FILE__, __LINE__); \
  } while (0)
#ifndef NCCL_CHECK
#define NCCL_CHECK(call) SL_NCCL_CHECK(call)
#endif

class NcclProcessGroup : public ProcessGroup {
 public:
  // Joins communicator `id` as `rank` of `size` on the calling thread's current CUDA device.
  // Collective: every rank calls it; waits for the others at most max(options.timeout, 30 s).
  NcclProcessGroup(const ncclUniqueId& id, int rank, int size, GroupOptions options,
                   std::shared_ptr<detail::NcclWorldState> world);
  ~NcclProcessGroup() override;

  std::string backend_name() const override { return "nccl"; }
  int global_rank(int group_rank) const override { return world_ranks_.at(group_rank); }
  int cuda_device() const { return device_; }
  void abort_world(const std::string& what, bool mismatch = false) override;
  bool aborted() const;
  // Aborts the communicator (ncclCommAbort): every later call on this group raises sl::Error.
  void abort(const std::string& reason);

  // ---- the same operations on raw memory of cuda_device() (counted in the ledger like the Tensor
  // forms, numbered apart from them; not to be mixed with *_async calls still in flight) ----
  void all_reduce_device(void* data, int64_t count, DType dtype, ReduceOp op = ReduceOp::sum);
  void all_gather_device(void* output, const void* input, int64_t count_per_rank, DType dtype);
  void reduce_scatter_device(void* output, const void* input, int64_t count_per_rank, DType dtype,
                             ReduceOp op = ReduceOp::sum);
  void broadcast_device(void* data, int64_t count, DType dtype, int root);
  WorkPtr isend_device(const void* data, int64_t count, DType dtype, int dst);
  WorkPtr irecv_device(void* data, int64_t count, DType dtype, int src);

  // A sub-group's handle (make_subgroup); public only so that make_shared can call it.
  struct FromSplit {};
  NcclProcessGroup(FromSplit, ncclComm_t comm, int rank, std::vector<int> world_ranks, int device, GroupOptions options,
                   std::shared_ptr<detail::NcclWorldState> world);

 protected:
  void run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) override;
  void run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) override;
  void run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) override;
  void run_broadcast(const Tensor& tensor, int root, uint64_t sequence) override;
  void run_barrier(uint64_t sequence) override;
  void run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                      uint64_t sequence) override;
  WorkPtr run_isend(const Tensor& tensor, int dst, int tag) override;
  WorkPtr run_irecv(const Tensor& tensor, int src, int tag) override;
  void exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) override;
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t child_index) override;

 private:
  struct Op;   // what a wait is for, in messages: "all_reduce #3 on rank 1 (cuda:1)"
  struct P2P;  // one isend/irecv: queued, then issued with the others
  class P2PWork;
  class Event;

  // The engine: every NCCL call goes through enqueue (under nccl_mutex_), every wait through wait_for.
  template <typename Calls>
  std::shared_ptr<Event> enqueue(const Op& op, Calls&& nccl_calls);
  void wait_for(const Op& op, const Event& done);
  void finish_in_progress(const Op& op, ncclComm_t comm, ncclResult_t result, std::chrono::milliseconds timeout);
  ncclComm_t split_locked(const Op& op, int color, int key);  // waits until the new one is ready
  void finish_construction();  // the send/recv communicator; cleans up and rethrows on failure
  void check_usable(const Op& op);
  [[noreturn]] void fail_timeout(const Op& op);
  [[noreturn]] void fail_remote(const Op& op);
  [[noreturn]] void fail_error(const Op& op, const std::string& what);
  void abort_locked(const std::string& reason) noexcept;
  void flush_p2p_locked(bool may_wait);
  bool settle_p2p_locked(const Op& op);
  void wait_p2p(const std::shared_ptr<P2P>& p2p);
  bool p2p_done(const std::shared_ptr<P2P>& p2p);
  std::string where(const Op& op) const;

  // The operations, on raw device pointers (run_* and *_device both end here).
  void all_reduce_raw(void* data, size_t count, DType dtype, ReduceOp op, uint64_t sequence);
  void all_gather_raw(void* output, const void* input, size_t count_per_rank, DType dtype, uint64_t sequence);
  void reduce_scatter_raw(void* output, const void* input, size_t count_per_rank, DType dtype, ReduceOp op,
                          uint64_t sequence);
  void broadcast_raw(void* data, size_t count, DType dtype, int root, uint64_t sequence);
  WorkPtr p2p_raw(bool is_send, void* data, size_t bytes, int peer, int tag, const Tensor& tensor);
  void gather_bytes(const char* name, const void* mine, void* out, size_t bytes, uint64_t sequence);
  void check_tensor(const char* op, const Tensor& tensor) const;

  ncclComm_t comm_ = nullptr;      // collectives; nullptr once aborted
  ncclComm_t p2p_comm_ = nullptr;  // send/recv: never queued behind a collective, nor one behind it
  cudaStream_t stream_ = nullptr;
  cudaStream_t p2p_stream_ = nullptr;
  int device_ = 0;
  std::vector<int> world_ranks_;
  std::shared_ptr<detail::NcclWorldState> world_;
  mutable std::mutex nccl_mutex_;  // NCCL wants one thread at a time per communicator
  std::string abort_reason_;
  std::vector<std::shared_ptr<P2P>> pending_p2p_;
  std::shared_ptr<Event> p2p_unrecorded_;  // the last batch, until NCCL has finished starting it
  std::chrono::steady_clock::time_point p2p_flushed_at_;
  // exchange() and barrier() copy through these: pinned host memory (so that the copies are truly
  // asynchronous) and stream-ordered device memory (cudaFree would wait for the whole GPU).
  void* host_staging_ = nullptr;
  void* device_staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::vector<void*> retired_host_staging_;  // freed at the end: cudaFreeHost may wait for the GPU
  uint64_t device_sequence_ = 0;
};

#endif  // SL_WITH_NCCL

namespace detail {
#ifdef SL_WITH_NCCL
// One thread per GPU in this process (launch() calls it for Backend::nccl; under mpirun it hands
// over to launch_nccl_under_mpi). Checks there are world_size GPUs, makes one ncclUniqueId, runs
// rank r on a thread with cudaSetDevice(r) and the current device cuda:r, joins, and rethrows the
// first error; a rank that throws aborts every other rank's waits (RemoteError).
void launch_nccl(int world_size, const RankFunction& fn, const LaunchOptions& options);
#endif
// One process per GPU under mpirun: initializes MPI if nobody has, checks world_size against -np,
// makes the world with make_nccl_world_from_mpi, runs fn with the current device cuda:local_rank.
// If fn throws, this rank's communicator is aborted and the error rethrown; the other processes
// then end with TimeoutError (or NCCL's remote error). Throws sl::Error without NCCL or MPI.
void launch_nccl_under_mpi(int world_size, const RankFunction& fn, const LaunchOptions& options);
#if defined(SL_WITH_NCCL) && defined(SL_WITH_MPI)
// The world communicator of an mpirun job (MPI must be initialized): this process uses GPU
// local_rank (its rank among the processes on its node); rank 0 makes the ncclUniqueId and
// MPI_Bcast's it. Every process checks the GPUs first and all fail together if one lacks them.
std::shared_ptr<NcclProcessGroup> make_nccl_world_from_mpi(const GroupOptions& options);
#endif
}  // namespace detail

}  // namespace sl::parallel
