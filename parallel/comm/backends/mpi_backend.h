// mpi_backend.h — ranks as processes under mpirun, talking through OpenMPI.
//
//   mpirun -np 4 prog      process 0    process 1    process 2    process 3     (one rank each)
//                              │            │            │            │
//   data communicator      ════╪════════════╪════════════╪════════════╪════   MPI_Iallreduce, ...
//   control communicator   ────┴────────────┴────────────┴────────────┴────   abort records, launch barriers
//
//   Every collective is MPI's own, posted nonblocking and then *polled* (MPI_Test, then a yield or
//   a short sleep), so that a wait can be given up: each poll also probes the control communicator
//   for an abort record (another rank failed: RemoteError) and checks the group's timeout
//   (TimeoutError, and this rank sends its own abort record to everyone). A failed launch leaves
//   its requests behind on communicators nobody uses again (every launch dups MPI_COMM_WORLD), and
//   the buffers of those requests are kept alive until exit because MPI may still write to them.
//
//   A launch also starts and ends on the control communicator (its dup, then a barrier): these
//   wait max(timeout, 1 minute), since ranks reach them at their own pace; so every rank of a launch
//   returns normally, or every rank raises (the one that failed: what it threw; the others:
//   RemoteError naming it). Sub-groups come from MPI_Comm_split, after an abortable barrier.
//
//   dtypes: f32, f64, i32, i64 are MPI's own types and ops. bf16 and f16 are 2-byte MPI types
//   with user-defined ops that combine pairwise in float and round after each step — the same
//   arithmetic as the threads backend (reduce_kernels.h), and no bytes are widened on the wire.
//   avg = sum, then a multiply by 1/n (floating dtypes only).
//
//   Cost: MPI picks its algorithms (the nonblocking all-reduce is set to OpenMPI's ring unless
//   OMPI_MCA_coll_libnbc_iallreduce_algorithm says otherwise; large mallocs are kept on the heap,
//   see start_mpi), and every group counts the bytes of the ring algorithms that the threads
//   backend runs, so ledgers are equal across backends:
//     all_reduce 2(n-1)/n·S each way     all_gather, reduce_scatter (n-1)/n·S_total
//     broadcast  chain from the root: root sends S, the last rank receives S, the rest both
//     send/recv  S                        barrier, fingerprint exchanges: not counted
//
//   Code: mpi_runtime.{h,cpp} (MPI start, dtypes and ops, the launch state and its polling wait,
//   launch_mpi), mpi_backend.cpp (the group's collectives, sub-groups), mpi_p2p.cpp (send/recv).
//   Tests: tests/parallel/comm/test_mpi_backend.cpp, run by tools/mpi_tests.sh (mpirun -np 2 and -np 4).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/process_group.h"

#ifdef SL_WITH_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings are deprecated and not linked)
#endif
#include <mpi.h>
#endif

namespace sl::parallel {

#ifdef SL_WITH_MPI

class MpiLaunchState;  // what all groups of one launch share: the control communicator, the failure

class MpiProcessGroup : public ProcessGroup {
 public:
  // comm: this group's communicator (its ranks are the group ranks); members: their world ranks.
  MpiProcessGroup(MPI_Comm comm, std::vector<int> members, std::shared_ptr<MpiLaunchState> launch,
                  GroupOptions options);
  ~MpiProcessGroup() override;

  std::string backend_name() const override { return "mpi"; }
  int global_rank(int group_rank) const override { return members_.at(group_rank); }
  MPI_Comm communicator() const { return comm_; }
  void abort_world(const std::string& what, bool mismatch = false) override;

 protected:
  void run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) override;
  void run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) override;
  void run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) override;
  void run_broadcast(const Tensor& tensor, int root, uint64_t sequence) override;
  void run_barrier(uint64_t sequence) override;
  void run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                      uint64_t sequence) override;  // mpi_all_to_all.cpp
  WorkPtr run_isend(const Tensor& tensor, int dst, int tag) override;
  WorkPtr run_irecv(const Tensor& tensor, int src, int tag) override;
  void exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) override;
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t child_index) override;

 private:
  std::string where(const char* op, uint64_t sequence) const;  // "all_reduce #3 on rank 2"
  int world_rank() const { return members_[rank()]; }

  MPI_Comm comm_;
  std::vector<int> members_;
  std::shared_ptr<MpiLaunchState> launch_;
};

#endif  // SL_WITH_MPI

namespace detail {
// Runs fn for this process's rank of an mpirun job (launch() calls it under mpirun). Initializes MPI
// on first use (finalized at process exit), checks world_size against mpirun's -np, and makes this
// thread's device cpu:rank. Rethrows what fn threw; every other rank then raises RemoteError.
void launch_mpi(int world_size, const RankFunction& fn, const LaunchOptions& options);
}  // namespace detail

}  // namespace sl::parallel
