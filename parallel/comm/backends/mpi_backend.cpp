// mpi_backend.cpp — the MPI group: construction and teardown, all_reduce, all_gather, reduce_scatter,
// broadcast and barrier as MPI's nonblocking collectives polled by MpiLaunchState::wait, the
// fingerprint exchange, and sub-groups (MPI_Comm_split). The picture and the ledger's costs are in
// mpi_backend.h; the runtime and the wait are in mpi_runtime.cpp, send/recv in mpi_p2p.cpp.
#include "parallel/comm/backends/mpi_backend.h"

#ifdef SL_WITH_MPI
#include <algorithm>
#include <cstring>
#include <utility>

#include "parallel/comm/backends/mpi_runtime.h"
#include "parallel/comm/reduce_kernels.h"

namespace sl::parallel {

using namespace mpi_detail;

// ---- the group ------------------------------------------------------------------------------------

static int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::vector<int> members, std::shared_ptr<MpiLaunchState> launch,
                                 GroupOptions options)
    : ProcessGroup(comm_rank(comm), static_cast<int>(members.size()), options),
      comm_(comm),
      members_(std::move(members)),
      launch_(std::move(launch)) {
  // OpenMPI picks its own algorithm per call: the ledger counts what a ring would move.
  ledger().set_collectives_modelled(true);
}

MpiProcessGroup::~MpiProcessGroup() {
  shutdown_worker();
  if (launch_->failed() || mpi_finalized()) return;  // requests may still be pending on comm_
  auto lock = serialize_mpi();
  MPI_Comm_free(&comm_);
}

// Every rank's next poll finds this rank's abort record (a mismatch travels as its message).
void MpiProcessGroup::abort_world(const std::string& what, bool /*mismatch*/) { launch_->notify_failure(what); }

std::string MpiProcessGroup::where(const char* op, uint64_t sequence) const {
  return std::string(op) + " #" + std::to_string(sequence) + " on rank " + std::to_string(world_rank());
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

// The bytes rank r sends and receives in the threads backend's ring all-reduce: n chunks (the first
// count mod n one element larger); reduce-scatter sends every chunk but r+1 and receives every one
// but r, all-gather sends every chunk but r+2 and receives every one but r+1.
static std::pair<int64_t, int64_t> ring_all_reduce_bytes(int64_t count, int64_t element, int n, int r) {
  if (n == 1) return {0, 0};
  auto chunk = [&](int i) { return (count / n + (mod(i, n) < count % n ? 1 : 0)) * element; };
  const int64_t total = count * element;
  return {2 * total - chunk(r + 1) - chunk(r + 2), 2 * total - chunk(r) - chunk(r + 1)};
}

void MpiProcessGroup::run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) {
  check_cpu("all_reduce", tensor);
  const std::string at = where("all_reduce", sequence);
  const int64_t count = tensor.numel();
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), mpi_count("all_reduce", count),
                                 mpi_type(tensor.dtype()), mpi_op(op, tensor.dtype()), comm_, &request));
  launch_->wait(request, at, options().timeout, {tensor.impl_ptr()});
  if (op == ReduceOp::avg) scale_buffer(tensor.dtype(), tensor.raw_data(), count, 1.0 / size());
  auto [sent, received] =
      ring_all_reduce_bytes(count, static_cast<int64_t>(dtype_size(tensor.dtype())), size(), rank());
  account(CommOp::all_reduce, sent, received);
}

void MpiProcessGroup::run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) {
  check_cpu("all_gather", output);
  check_cpu("all_gather", input);
  const std::string at = where("all_gather", sequence);
  const int count = mpi_count("all_gather", output.numel());
  const int chunk = count / size();
  MPI_Datatype type = mpi_type(input.dtype());
  // FSDP gathers from a view of its own slot of the output: MPI wants that said as MPI_IN_PLACE.
  auto* mine = static_cast<std::byte*>(output.raw_data()) + rank() * input.nbytes();
  const void* send = input.raw_data() == mine ? MPI_IN_PLACE : input.raw_data();
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Iallgather(send, chunk, type, output.raw_data(), chunk, type, comm_, &request));
  launch_->wait(request, at, options().timeout, {output.impl_ptr(), input.impl_ptr()});
  account(CommOp::all_gather, (size() - 1) * input.nbytes(), (size() - 1) * input.nbytes());
}

void MpiProcessGroup::run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) {
  check_cpu("reduce_scatter", output);
  check_cpu("reduce_scatter", input);
  const std::string at = where("reduce_scatter", sequence);
  mpi_count("reduce_scatter", input.numel());
  // ZeRO reduces into its own chunk of the input. MPI forbids overlapping buffers (and its
  // MPI_IN_PLACE would put the result at the start of the input), so that case goes through scratch.
  const auto* mine = static_cast<const std::byte*>(input.raw_data()) + rank() * output.nbytes();
  Tensor scratch;
  if (output.raw_data() == mine) {
    MemoryScope scope(MemoryCategory::comm);
    scratch = Tensor::empty(output.shape(), output.options());
  }
  const Tensor& target = scratch.defined() ? scratch : output;
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ireduce_scatter_block(input.raw_data(), target.raw_data(), static_cast<int>(output.numel()),
                                            mpi_type(input.dtype()), mpi_op(op, input.dtype()), comm_, &request));
  launch_->wait(request, at, options().timeout, {target.impl_ptr(), input.impl_ptr()});
  if (scratch.defined()) std::memcpy(output.raw_data(), scratch.raw_data(), static_cast<size_t>(output.nbytes()));
  if (op == ReduceOp::avg) scale_buffer(output.dtype(), output.raw_data(), output.numel(), 1.0 / size());
  account(CommOp::reduce_scatter, (size() - 1) * output.nbytes(), (size() - 1) * output.nbytes());
}

void MpiProcessGroup::run_broadcast(const Tensor& tensor, int root, uint64_t sequence) {
  check_cpu("broadcast", tensor);
  const std::string at = where("broadcast", sequence);
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ibcast(tensor.raw_data(), mpi_count("broadcast", tensor.numel()), mpi_type(tensor.dtype()), root,
                             comm_, &request));
  launch_->wait(request, at, options().timeout, {tensor.impl_ptr()});
  if (size() == 1) return;
  // Counted as a chain from the root: position 0 only sends, position n-1 only receives.
  const int position = mod(rank() - root, size());
  account(CommOp::broadcast, position < size() - 1 ? tensor.nbytes() : 0, position > 0 ? tensor.nbytes() : 0);
}

void MpiProcessGroup::run_barrier(uint64_t sequence) {
  const std::string at = where("barrier", sequence);
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ibarrier(comm_, &request));
  launch_->wait(request, at, options().timeout, {});
}

void MpiProcessGroup::exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) {
  const std::string at = where("fingerprint exchange", sequence);
  // Our own buffer, not the caller's: if the wait is given up, this one is what stays alive.
  auto buffer = std::make_shared<std::vector<char>>(bytes * (size() + 1));
  if (bytes > 0) std::memcpy(buffer->data(), mine, bytes);
  const int count = mpi_count("fingerprint exchange", static_cast<int64_t>(bytes));
  MPI_Request request;
  SL_MPI_CALL(
      at, MPI_Iallgather(buffer->data(), count, MPI_BYTE, buffer->data() + bytes, count, MPI_BYTE, comm_, &request));
  launch_->wait(request, at, options().timeout, {buffer});
  if (bytes > 0) std::memcpy(out, buffer->data() + bytes, bytes * size());
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::make_subgroup(const std::vector<int>& members, uint64_t child_index) {
  // MPI_Comm_split blocks and cannot be given up, so first make sure (abortably) that every rank
  // of this group has arrived here: then the split ends at once.
  const std::string at = where("making sub-group", child_index);
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ibarrier(comm_, &request));
  launch_->wait(request, at, options().timeout, {});
  auto me = std::find(members.begin(), members.end(), rank());
  // One color per member list (its smallest rank; split() makes several at once), ordered as listed.
  int color = me == members.end() ? MPI_UNDEFINED : *std::min_element(members.begin(), members.end());
  int key = static_cast<int>(me - members.begin());
  MPI_Comm child = MPI_COMM_NULL;
  SL_MPI_CALL(at, MPI_Comm_split(comm_, color, key, &child));
  if (child == MPI_COMM_NULL) return nullptr;
  std::vector<int> world_members;
  for (int m : members) world_members.push_back(members_[m]);
  return std::make_shared<MpiProcessGroup>(child, world_members, launch_, options());
}

}  // namespace sl::parallel

#endif  // SL_WITH_MPI
