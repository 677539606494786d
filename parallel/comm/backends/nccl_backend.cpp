// nccl_backend.cpp — the NCCL process group itself (nccl_backend.h has the picture): making and
// ending its communicators, abort, the engine every operation waits in (poll the CUDA event, NCCL's
// async error, the world's abort flag and the clock; on failure abort and throw), and sub-groups by
// ncclCommSplit. The operations: nccl_collectives.cpp, nccl_p2p.cpp; bootstrap: nccl_launch.cpp.
#include "parallel/comm/backends/nccl_backend.h"

#include "parallel/comm/errors.h"
#include "parallel/comm/backends/nccl_common.h"

#ifdef SL_WITH_NCCL
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>

namespace sl::parallel {

using namespace nccl_detail;

// Making a communicator (init, split) is a bootstrap over every rank that may also create CUDA
// contexts: seconds on a fresh machine, so it gets at least this long whatever the group's timeout.
static constexpr milliseconds kSetupTimeoutFloor{30000};

static long long ms(Clock::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); }

// ---- the group: construction and teardown -------------------------------------------------------

NcclProcessGroup::NcclProcessGroup(const ncclUniqueId& id, int rank, int size, GroupOptions options,
                                   std::shared_ptr<detail::NcclWorldState> world)
    : ProcessGroup(rank, size, options), world_(std::move(world)) {
  SL_CUDA_CHECK(cudaGetDevice(&device_));
  for (int r = 0; r < size; ++r) world_ranks_.push_back(r);
  Op what{"ncclCommInitRank", kNoSequence, -1, Clock::now(), std::max(options.timeout, kSetupTimeoutFloor)};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no NCCL call may block the host: every wait polls, so every wait can end
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  {
    std::lock_guard lock(nccl_mutex_);
    comm_ = comm;  // on failure the fail_* functions abort it: nothing else to free yet
    if (comm_ == nullptr) fail_error(what, "ncclCommInitRankConfig failed: " + nccl_text(result));
    finish_in_progress(what, comm_, result, what.timeout);
  }
  finish_construction();
}

NcclProcessGroup::NcclProcessGroup(FromSplit, ncclComm_t comm, int rank, std::vector<int> world_ranks, int device,
                                   GroupOptions options, std::shared_ptr<detail::NcclWorldState> world)
    : ProcessGroup(rank, static_cast<int>(world_ranks.size()), options),
      comm_(comm),
      device_(device),
      world_ranks_(std::move(world_ranks)),
      world_(std::move(world)) {
  finish_construction();
}

// The streams and the send/recv communicator (a split of comm_, so collective too). On failure
// everything made so far goes before the exception leaves the constructor.
void NcclProcessGroup::finish_construction() {
  // NCCL picks its own algorithm (ring, tree, NVLS...): the ledger counts what a ring would move.
  ledger().set_collectives_modelled(true);
  try {
    SL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SL_CUDA_CHECK(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking));
    Op what{"ncclCommSplit (send/recv communicator)", kNoSequence, -1, Clock::now(),
            std::max(options().timeout, kSetupTimeoutFloor)};
    std::lock_guard lock(nccl_mutex_);
    p2p_comm_ = split_locked(what, 0, rank());
  } catch (...) {
    {
      std::lock_guard lock(nccl_mutex_);
      abort_locked("it could not be set up");
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (p2p_stream_ != nullptr) cudaStreamDestroy(p2p_stream_);
    throw;
  }
}

NcclProcessGroup::~NcclProcessGroup() {
  shutdown_worker();  // queued async collectives end (done or failed) before the communicators go
  int previous = 0;
  bool restore = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  {
    std::lock_guard lock(nccl_mutex_);
    pending_p2p_.clear();  // queued, never waited on: never issued either
    if (comm_ != nullptr) {
      // Work left on a stream (an isend nobody waited for), a failure, or an exception on its way:
      // a clean end would wait for peers that may never come, so abort instead.
      bool busy = cudaStreamQuery(stream_) != cudaSuccess || cudaStreamQuery(p2p_stream_) != cudaSuccess ||
                  p2p_unrecorded_ != nullptr;
      bool unclean = busy || world_->failed() || std::uncaught_exceptions() > 0;
      detail::NcclWorldState::Comms mine{{p2p_comm_, device_}, {comm_, device_}};
      if (!world_->retire(mine, unclean)) end_communicators(mine, !unclean, options().timeout);
      comm_ = p2p_comm_ = nullptr;
    }
  }
  cudaStreamDestroy(p2p_stream_);
  if (device_staging_ != nullptr) cudaFreeAsync(device_staging_, stream_);
  cudaStreamDestroy(stream_);
  if (host_staging_ != nullptr) cudaFreeHost(host_staging_);
  for (void* old : retired_host_staging_) cudaFreeHost(old);
  cudaGetLastError();
  if (restore) cudaSetDevice(previous);
}

bool NcclProcessGroup::aborted() const {
  std::lock_guard lock(nccl_mutex_);
  return comm_ == nullptr;
}

void NcclProcessGroup::abort(const std::string& reason) {
  std::lock_guard lock(nccl_mutex_);
  world_->fail(global_rank(rank()), reason);
  abort_locked(reason);
}

// The launch's shared failure: every rank thread of this process raises RemoteError at its next
// poll (other processes of an mpirun job learn it from their own timeouts, as after a throw).
void NcclProcessGroup::abort_world(const std::string& what, bool /*mismatch*/) {
  world_->fail(global_rank(rank()), what);
}

// ---- the engine: poll until done, failed, aborted or late (enqueue: nccl_collectives.cpp) ------

std::string NcclProcessGroup::where(const Op& op) const {
  std::string who = "rank " + std::to_string(global_rank(rank())) + " (nccl, cuda:" + std::to_string(device_) + ")";
  if (op.peer >= 0)
    return ::sl::detail::concat(op.name, std::strcmp(op.name, "send") == 0 ? " to" : " from", " rank ",
                                global_rank(op.peer), " (tag ", op.sequence, ") on ", who);
  if (op.sequence == kNoSequence) return std::string(op.name) + " on " + who;
  return ::sl::detail::concat(op.name, " #", op.sequence, " on ", who);
}

// The fail_* functions run with nccl_mutex_ held. Each ends this rank's communicator first, so
// that nothing it enqueued can still be waiting on a peer.
void NcclProcessGroup::fail_timeout(const Op& op) {
  std::string message = ::sl::detail::concat(
      where(op), ": timed out after ", ms(Clock::now() - op.start), " ms (timeout ", op.timeout.count(),
      " ms) waiting for ", op.peer >= 0 ? "rank " + std::to_string(global_rank(op.peer)) : "the other ranks",
      " of this group of ", size(), "; the communicator was aborted (did a rank skip this operation, or is it stuck?)");
  world_->fail(global_rank(rank()), message);
  abort_locked(std::string(op.name) + " timed out");
  throw TimeoutError(message);
}

void NcclProcessGroup::fail_remote(const Op& op) {
  int failed = world_->failed_rank();
  std::string message =
      ::sl::detail::concat(where(op), ": aborted because rank ", failed, " failed: ", world_->failure());
  abort_locked("rank " + std::to_string(failed) + " failed");
  throw RemoteError(message, failed);
}

void NcclProcessGroup::fail_error(const Op& op, const std::string& what) {
  std::string message = where(op) + ": " + what + "; the communicator was aborted";
  world_->fail(global_rank(rank()), message);
  abort_locked(what);
  throw Error(message);
}

void NcclProcessGroup::abort_locked(const std::string& reason) noexcept {
  pending_p2p_.clear();
  p2p_unrecorded_.reset();
  if (comm_ == nullptr) return;
  cudaSetDevice(device_);
  // Kernels waiting on peers see NCCL's abort flag and exit.
  if (p2p_comm_ != nullptr) ncclCommAbort(p2p_comm_);
  ncclCommAbort(comm_);
  comm_ = p2p_comm_ = nullptr;
  abort_reason_ = reason;
}

void NcclProcessGroup::check_usable(const Op& op) {
  if (comm_ == nullptr)
    throw Error(where(op) + ": this group's communicator was aborted earlier (" + abort_reason_ +
                "); a failed launch cannot go on");
  if (world_->failed()) fail_remote(op);
}

// A non-blocking communicator is ncclInProgress while NCCL finishes a call on its own thread, and
// no other NCCL call may touch it until it reports success. The state is asked even when the call
// returned ncclSuccess: ncclCommSplit does, with the split still running.
void NcclProcessGroup::finish_in_progress(const Op& op, ncclComm_t comm, ncclResult_t result, milliseconds timeout) {
  if (result != ncclSuccess && result != ncclInProgress) fail_error(op, "NCCL refused the call: " + nccl_text(result));
  Op late = op;
  late.timeout = timeout;
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail_error(op, "NCCL failed: " + nccl_text(state));
    if (world_->failed()) fail_remote(op);
    if (Clock::now() - op.start >= timeout) fail_timeout(late);
    backoff(polls);
  }
}

void NcclProcessGroup::wait_for(const Op& op, const Event& done) {
  for (int polls = 0;; ++polls) {
    cudaError_t status = cudaEventQuery(done.get());
    if (status == cudaSuccess) return;
    {
      std::lock_guard lock(nccl_mutex_);
      if (status != cudaErrorNotReady) {
        cudaGetLastError();
        fail_error(op, std::string("CUDA failed while waiting: ") + cudaGetErrorString(status));
      }
      check_usable(op);
      for (ncclComm_t comm : {comm_, p2p_comm_}) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t query = ncclCommGetAsyncError(comm, &state);
        if (query != ncclSuccess) state = query;
        if (state != ncclSuccess && state != ncclInProgress)
          fail_error(op, "NCCL reported an asynchronous error: " + nccl_text(state));
      }
      if (Clock::now() - op.start >= op.timeout) fail_timeout(op);
    }
    backoff(polls);
  }
}

// ---- sub-groups ---------------------------------------------------------------------------------

std::shared_ptr<ProcessGroup> NcclProcessGroup::make_subgroup(const std::vector<int>& members, uint64_t child_index) {
  auto me = std::find(members.begin(), members.end(), rank());
  const int my_index = me == members.end() ? -1 : static_cast<int>(me - members.begin());
  // Sub-groups made together are disjoint, so their smallest member tells them apart as the color;
  // the key (position in `members`) orders the new ranks.
  const int color = my_index < 0 ? NCCL_SPLIT_NOCOLOR : *std::min_element(members.begin(), members.end());
  Op what{"ncclCommSplit", child_index, -1, Clock::now(), std::max(options().timeout, kSetupTimeoutFloor)};
  SL_CUDA_CHECK(cudaSetDevice(device_));
  ncclComm_t child = nullptr;
  {
    std::lock_guard lock(nccl_mutex_);
    child = split_locked(what, color, std::max(my_index, 0));
  }
  if (my_index < 0) return nullptr;
  std::vector<int> world_ranks;
  for (int m : members) world_ranks.push_back(world_ranks_[m]);
  return std::make_shared<NcclProcessGroup>(FromSplit{}, child, my_index, std::move(world_ranks), device_, options(),
                                            world_);
}

// ncclCommSplit of comm_, collective over its ranks. NCCL's own thread writes the new communicator
// when the split is done, and the new one must then report ready. nullptr for NCCL_SPLIT_NOCOLOR.
ncclComm_t NcclProcessGroup::split_locked(const Op& op, int color, int key) {
  check_usable(op);
  ncclComm_t child = nullptr;
  try {
    finish_in_progress(op, comm_, ncclCommSplit(comm_, color, key, &child, nullptr), op.timeout);
  } catch (...) {
    if (child != nullptr) ncclCommAbort(child);  // aborting the parent has joined NCCL's thread
    throw;
  }
  if (color == NCCL_SPLIT_NOCOLOR) return nullptr;
  // NCCL may write the pointer a moment after the parent reports success (PyTorch waits too).
  std::atomic_ref<ncclComm_t> written(child);
  ncclResult_t state = ncclInProgress;
  for (int polls = 0; state == ncclInProgress; ++polls) {
    ncclComm_t now = written.load();
    if (now != nullptr && ncclCommGetAsyncError(now, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclInProgress && Clock::now() - op.start >= op.timeout) {
      try {
        fail_timeout(op);  // aborting the parent joins NCCL's thread: `child` is final after it
      } catch (...) {
        if (ncclComm_t late = written.load()) ncclCommAbort(late);
        throw;
      }
    }
    if (state == ncclInProgress) backoff(polls);
  }
  if (state != ncclSuccess) {
    ncclCommAbort(child);
    fail_error(op, "the new communicator failed: " + nccl_text(state));
  }
  return child;
}

}  // namespace sl::parallel

#endif  // SL_WITH_NCCL
