// mpi_runtime.cpp — the MPI backend's runtime (the file map is in mpi_runtime.h): MPI started once per
// process and finalized at exit, dtypes and ops (bf16/f16 user ops), the keep-alive list, the launch
// state with its abort records and polling wait, and detail::launch_mpi. The picture: mpi_backend.h.
#include "parallel/comm/backends/mpi_runtime.h"

#ifdef SL_WITH_MPI
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "parallel/comm/errors.h"
#include "parallel/comm/reduce_kernels.h"

namespace sl::parallel {

namespace mpi_detail {

// ---- the MPI runtime: initialized once per process, finalized at exit ------------------------------

// MPI calls a user op as inout[i] = in[i] (op) inout[i]; the 16-bit formats combine in float.
template <ReduceOp kOp>
static void reduce_halves(void* in, void* inout, int* count, MPI_Datatype* type) {
  reduce_buffers(*type == runtime().bf16 ? DType::bf16 : DType::f16, kOp, inout, inout, in, *count);
}

static void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Requests that failed launches left behind are never completed; OpenMPI's finalize does not wait
  // for them (tools/mpi_tests.sh runs the failure tests and then checks that every process exits).
  if (!finalized) MPI_Finalize();
}

static MpiRuntime start_mpi() {
  MpiRuntime mpi;
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // OpenMPI's nonblocking all-reduce otherwise picks a binomial tree (reduce, then broadcast: the
    // whole buffer twice on the critical path) below 4 ranks and for every in-place call; the ring
    // is twice as fast at 64 MiB, and is what the ledger counts. A user's own setting wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "ring", /*overwrite=*/0);
    // It also mallocs a scratch buffer of the tensor's size per call: keep freed memory for reuse
    // (tensor/storage.h), or each 64 MiB all-reduce pays fresh page faults (50-110 ms instead of 22-60).
    keep_freed_memory_for_reuse();
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit(finalize_at_exit);  // never between launches: MPI cannot be initialized twice
  } else {
    MPI_Query_thread(&provided);  // someone else started MPI, and finalizes it
  }
  SL_CHECK(provided >= MPI_THREAD_SERIALIZED, "launch: the MPI library gives thread level ", provided,
           ", the mpi backend needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
  mpi.thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  // Errors come back as codes (raised as sl::Error) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub) mpi.tag_upper_bound = *tag_ub;
  for (MPI_Datatype* type : {&mpi.bf16, &mpi.f16}) {
    MPI_Type_contiguous(2, MPI_BYTE, type);
    MPI_Type_commit(type);
  }
  MPI_Op_create(&reduce_halves<ReduceOp::sum>, /*commute=*/1, &mpi.half_sum);
  MPI_Op_create(&reduce_halves<ReduceOp::max>, 1, &mpi.half_max);
  MPI_Op_create(&reduce_halves<ReduceOp::min>, 1, &mpi.half_min);
  return mpi;
}

const MpiRuntime& runtime() {
  static const MpiRuntime mpi = start_mpi();  // immutable once made
  return mpi;
}

std::unique_lock<std::mutex> serialize_mpi() {
  static std::mutex mutex;
  if (runtime().thread_multiple) return {};
  return std::unique_lock(mutex);
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

void check_mpi(int code, const std::string& where) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(where + ": MPI error: " + std::string(text, static_cast<size_t>(length)));
}

void keep_until_exit(const KeepAlive& buffers) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<const void>>();
  std::lock_guard lock(mutex);
  kept->insert(kept->end(), buffers.begin(), buffers.end());
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return runtime().bf16;
    case DType::f16:
      return runtime().f16;
  }
  SL_ASSERT(false);
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const bool half = dtype == DType::bf16 || dtype == DType::f16;
  const MpiRuntime& mpi = runtime();
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return half ? mpi.half_sum : MPI_SUM;  // avg divides afterwards
    case ReduceOp::max:
      return half ? mpi.half_max : MPI_MAX;
    case ReduceOp::min:
      return half ? mpi.half_min : MPI_MIN;
  }
  SL_ASSERT(false);
}

}  // namespace mpi_detail

using namespace mpi_detail;

// ---- what all groups of one launch share --------------------------------------------------------

MpiLaunchState::~MpiLaunchState() {
  if (failed() || mpi_finalized() || control_ == MPI_COMM_NULL) return;  // a failed launch leaves its comms be
  auto lock = serialize_mpi();
  MPI_Comm_free(&control_);
}

MPI_Comm MpiLaunchState::dup_world(std::chrono::milliseconds timeout) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request;
  std::string where = "launch: duplicating MPI_COMM_WORLD on rank " + std::to_string(world_rank_);
  SL_MPI_CALL(where, MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request));
  wait(request, where, timeout, {});
  if (control_ == MPI_COMM_NULL) control_ = comm;
  return comm;
}

MPI_Status MpiLaunchState::wait(MPI_Request& request, const std::string& where, std::chrono::milliseconds timeout,
                                const KeepAlive& buffers) {
  const Clock::time_point start = Clock::now();
  Clock::time_point next_check = start;
  while (true) {
    int done = 0;
    MPI_Status status;
    SL_MPI_CALL(where, MPI_Test(&request, &done, &status));
    if (done) return status;
    Clock::time_point now = Clock::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(1);
      try {
        throw_if_aborted(where);
        if (now - start >= timeout) {
          TimeoutError error(where + ": timed out after " + std::to_string(milliseconds_since(start)) +
                             " ms (timeout " + std::to_string(timeout.count()) +
                             " ms): not every rank arrived (did one skip this call, or is it stuck?)");
          notify_failure(error.what());
          throw error;
        }
      } catch (...) {
        keep_until_exit(buffers);
        throw;
      }
    }
    // MPI only progresses a nonblocking collective inside MPI calls: spin at first (bandwidth), then
    // sleep (2 cores shared by up to 4 ranks in the tests).
    if (now - start < std::chrono::milliseconds(2))
      std::this_thread::yield();
    else  // a long wait (a peer still computing) should not take the CPU it needs
      std::this_thread::sleep_for(std::chrono::microseconds(now - start < std::chrono::milliseconds(100) ? 50 : 500));
  }
}

void MpiLaunchState::throw_if_aborted(const std::string& where) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ < 0 && control_ != MPI_COMM_NULL) receive_abort_record();
  if (failed_rank_ >= 0)
    throw RemoteError(where + ": aborted because rank " + std::to_string(failed_rank_) + " failed: " + failure_,
                      failed_rank_);
}

void MpiLaunchState::notify_failure(const std::string& what) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ >= 0) return;
  failed_rank_ = world_rank_;
  failure_ = what.substr(0, 4000);
  if (control_ == MPI_COMM_NULL) return;
  auto record = std::make_shared<std::string>(failure_);  // MPI reads it after we return
  keep_until_exit({record});
  auto mpi = serialize_mpi();
  for (int r = 0; r < world_size_; ++r) {
    if (r == world_rank_) continue;
    MPI_Request request;
    if (MPI_Isend(record->data(), static_cast<int>(record->size()), MPI_CHAR, r, abort_tag_, control_, &request) ==
        MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

void MpiLaunchState::wait_for_everyone(std::chrono::milliseconds timeout) {
  MPI_Request request;
  std::string where = "launch: waiting for every rank to finish, on rank " + std::to_string(world_rank_);
  SL_MPI_CALL(where, MPI_Ibarrier(control_, &request));
  wait(request, where, timeout, {});
}

void MpiLaunchState::receive_abort_record() {
  int found = 0;
  MPI_Status status;
  auto mpi = serialize_mpi();
  if (MPI_Iprobe(MPI_ANY_SOURCE, abort_tag_, control_, &found, &status) != MPI_SUCCESS || !found) return;
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
  MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, abort_tag_, control_, MPI_STATUS_IGNORE);
  failed_rank_ = status.MPI_SOURCE;  // control_ is a dup of MPI_COMM_WORLD: source = world rank
  failure_ = text;
}

// ---- launch -----------------------------------------------------------------------------------------

void detail::launch_mpi(int world_size, const RankFunction& fn, const LaunchOptions& options) {
  const MpiRuntime& mpi = runtime();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  SL_CHECK(world_size == size, "launch(", world_size, "): this process runs under mpirun -np ", size);
  // Every process counts its launches alike; the tag keeps one launch's abort records to itself.
  static std::atomic<int> launches{0};
  const int abort_tag = launches.fetch_add(1) % (std::min(mpi.tag_upper_bound, INT_MAX - 1) + 1);
  auto state = std::make_shared<MpiLaunchState>(abort_tag, rank, size);
  // Ranks enter and leave a launch at their own pace (a failed launch is left up to a timeout
  // apart), so its start and end wait longer than a collective: no less than a minute.
  const auto patience = std::max<std::chrono::milliseconds>(options.timeout, std::chrono::minutes(1));
  DeviceGuard device(Device::cpu(rank));
  RankContext ctx{rank, size, Device::cpu(rank), nullptr, Backend::mpi};
  try {
    state->dup_world(patience);  // the control communicator
    std::vector<int> everyone(size);
    std::iota(everyone.begin(), everyone.end(), 0);
    ctx.world = std::make_shared<MpiProcessGroup>(state->dup_world(patience), everyone, state,
                                                  GroupOptions{options.timeout, options.debug_collectives});
    fn(ctx);
    ctx.world.reset();  // drains its async work first
    state->wait_for_everyone(patience);
  } catch (...) {
    // Before the group goes: its worker may be waiting on peers that wait on this rank.
    state->notify_failure(describe_exception(std::current_exception()));
    throw;
  }
}

}  // namespace sl::parallel

#else  // no MPI in this build: launch() never calls this, but say so if someone does

namespace sl::parallel {
void detail::launch_mpi(int, const RankFunction&, const LaunchOptions&) {
  throw Error("launch: the mpi backend was asked for, but shardlab was built without MPI (make MPI=1)");
}
}  // namespace sl::parallel

#endif
