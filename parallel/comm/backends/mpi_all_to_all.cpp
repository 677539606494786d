// mpi_all_to_all.cpp — all-to-all on the MPI group: MPI_Ialltoallv of the chunks' bytes, polled by
// MpiLaunchState::wait like every collective. The split sizes are first exchanged (uncounted, one
// MPI_Ialltoall of a count per peer) so that a rank sending another count than its peer expects fails
// naming both, where MPI would truncate or leave bytes unwritten.
//
//   The ledger counts what moves: Σ_{d≠r} of this rank's chunks sent, Σ_{s≠r} received, for equal
//   chunks (n-1)/n of the input each way (the same as the threads backend's pairwise exchange).
#include "parallel/comm/backends/mpi_backend.h"

#ifdef SL_WITH_MPI
#include <cstdint>
#include <vector>

#include "parallel/comm/backends/mpi_runtime.h"
#include "parallel/comm/errors.h"

namespace sl::parallel {

using namespace mpi_detail;

void MpiProcessGroup::run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                                     uint64_t sequence) {
  check_cpu("all_to_all", output);
  check_cpu("all_to_all", input);
  const std::string at = where("all_to_all", sequence);
  const int n = size();
  // Every peer learns what this rank sends it, and compares it with what it expects.
  std::vector<int64_t> announced(n);
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ialltoall(layout.send_bytes.data(), 1, MPI_INT64_T, announced.data(), 1, MPI_INT64_T, comm_,
                                &request));
  launch_->wait(request, at, options().timeout, {});
  for (int s = 0; s < n; ++s)
    if (announced[s] != layout.recv_bytes[s])
      throw CollectiveMismatch(at + ": rank " + std::to_string(global_rank(s)) + " sends " +
                               std::to_string(announced[s]) + " bytes where " + std::to_string(layout.recv_bytes[s]) +
                               " were expected (do the ranks' split sizes agree?)");
  std::vector<int> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  for (int r = 0; r < n; ++r) {
    send_counts[r] = mpi_count("all_to_all", layout.send_bytes[r]);
    send_displs[r] = mpi_count("all_to_all", layout.send_offset[r]);
    recv_counts[r] = mpi_count("all_to_all", layout.recv_bytes[r]);
    recv_displs[r] = mpi_count("all_to_all", layout.recv_offset[r]);
  }
  SL_MPI_CALL(at, MPI_Ialltoallv(input.raw_data(), send_counts.data(), send_displs.data(), MPI_BYTE,
                                 output.raw_data(), recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_, &request));
  launch_->wait(request, at, options().timeout, {output.impl_ptr(), input.impl_ptr()});
  int64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r)
    if (r != rank()) sent += layout.send_bytes[r], received += layout.recv_bytes[r];
  account(CommOp::all_to_all, sent, received);
}

}  // namespace sl::parallel

#endif  // SL_WITH_MPI
