// mpi_backend.cpp — MPI's collectives, posted nonblocking and polled (see mpi_backend.h for the picture).
//
//   wait on a request:   MPI_Test ─ done? ─ yes ──> return
//                           │ no
//                           ├─ every 1 ms: abort record on the control communicator? ──> RemoteError
//                           ├─ every 1 ms: waited longer than the timeout? ──> tell everyone, TimeoutError
//                           └─ yield (first 2 ms), then sleep 50 µs (500 µs after 100 ms), test again
//
//   MPI only progresses a nonblocking collective inside MPI calls, so the first milliseconds spin
//   (bandwidth) and later ones sleep (2 cores shared by up to 4 ranks in the tests).
#include "parallel/mpi_backend.h"

#ifdef SL_WITH_MPI
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "parallel/errors.h"
#include "parallel/reduce_kernels.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;
using KeepAlive = std::vector<std::shared_ptr<const void>>;

static long long milliseconds_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// ---- the MPI runtime: initialized once per process, finalized at exit ------------------------------

struct MpiRuntime {
  bool thread_multiple = false;  // else SERIALIZED: every MPI call takes one process-wide lock
  int tag_upper_bound = 32767;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL, f16 = MPI_DATATYPE_NULL;  // 2-byte types of their own
  MPI_Op half_sum = MPI_OP_NULL, half_max = MPI_OP_NULL, half_min = MPI_OP_NULL;
};
static const MpiRuntime& runtime();

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
    // It also mallocs a scratch buffer of the tensor's size per call; above 32 MiB glibc maps fresh
    // pages for each, and faulting them in costs more than the transfer (on this VM a 64 MiB
    // all-reduce took 50-110 ms instead of 22-60). Served from the heap and kept after free, they
    // are reused: a caching allocator's trade, more resident memory for no page faults, made for
    // the whole rank process. MALLOC_MMAP_THRESHOLD_ set by the user wins.
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
      mallopt(M_MMAP_THRESHOLD, 1 << 30);
      mallopt(M_TRIM_THRESHOLD, INT_MAX);
    }
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

static const MpiRuntime& runtime() {
  static const MpiRuntime mpi = start_mpi();  // immutable once made
  return mpi;
}

static std::unique_lock<std::mutex> serialize_mpi() {
  static std::mutex mutex;
  if (runtime().thread_multiple) return {};
  return std::unique_lock(mutex);
}

static bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

static void check_mpi(int code, const std::string& where) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(where + ": MPI error: " + std::string(text, static_cast<size_t>(length)));
}

// Makes one MPI call (under the lock when MPI is only SERIALIZED) and raises its error code.
#define SL_MPI_CALL(where, call)           \
  do {                                     \
    int sl_mpi_code_;                      \
    {                                      \
      auto sl_mpi_lock_ = serialize_mpi(); \
      sl_mpi_code_ = (call);               \
    }                                      \
    check_mpi(sl_mpi_code_, where);        \
  } while (0)

// Buffers of requests that were given up on: MPI may still write into them, so they live until the
// process exits (deliberately never freed).
static void keep_until_exit(const KeepAlive& buffers) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<const void>>();
  std::lock_guard lock(mutex);
  kept->insert(kept->end(), buffers.begin(), buffers.end());
}

static MPI_Datatype mpi_type(DType dtype) {
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

static MPI_Op mpi_op(ReduceOp op, DType dtype) {
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

// ---- what all groups of one launch share --------------------------------------------------------

class MpiLaunchState {
 public:
  MpiLaunchState(int abort_tag, int world_rank, int world_size)
      : abort_tag_(abort_tag), world_rank_(world_rank), world_size_(world_size) {}
  ~MpiLaunchState() {
    if (failed() || mpi_finalized() || control_ == MPI_COMM_NULL) return;  // a failed launch leaves its comms be
    auto lock = serialize_mpi();
    MPI_Comm_free(&control_);
  }
  int world_rank() const { return world_rank_; }

  // A fresh duplicate of MPI_COMM_WORLD (the first one becomes the control communicator).
  MPI_Comm dup_world(std::chrono::milliseconds timeout) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request request;
    std::string where = "launch: duplicating MPI_COMM_WORLD on rank " + std::to_string(world_rank_);
    SL_MPI_CALL(where, MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request));
    wait(request, where, timeout, {});
    if (control_ == MPI_COMM_NULL) control_ = comm;
    return comm;
  }

  // Polls `request` to completion, or gives up: RemoteError when another rank's abort record
  // arrives, TimeoutError after `timeout` (this rank's own record then goes to everyone). When it
  // gives up, `buffers` stay allocated until exit, since MPI may still write into them.
  MPI_Status wait(MPI_Request& request, const std::string& where, std::chrono::milliseconds timeout,
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
      if (now - start < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else  // a long wait (a peer still computing) should not take the CPU it needs
        std::this_thread::sleep_for(std::chrono::microseconds(now - start < std::chrono::milliseconds(100) ? 50 : 500));
    }
  }

  // Raises RemoteError if any rank of this launch failed (this one included).
  void throw_if_aborted(const std::string& where) {
    std::lock_guard lock(mutex_);
    if (failed_rank_ < 0 && control_ != MPI_COMM_NULL) receive_abort_record();
    if (failed_rank_ >= 0)
      throw RemoteError(where + ": aborted because rank " + std::to_string(failed_rank_) + " failed: " + failure_,
                        failed_rank_);
  }

  // This rank failed: send its abort record to every other rank, unless the failure came from
  // another rank's record (then everyone already has that one, which names the rank to blame).
  void notify_failure(const std::string& what) {
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

  bool failed() {
    std::lock_guard lock(mutex_);
    return failed_rank_ >= 0;
  }

  // The end of a launch: nobody returns before every rank's function did, so either all ranks
  // return normally or all of them raise.
  void wait_for_everyone(std::chrono::milliseconds timeout) {
    MPI_Request request;
    std::string where = "launch: waiting for every rank to finish, on rank " + std::to_string(world_rank_);
    SL_MPI_CALL(where, MPI_Ibarrier(control_, &request));
    wait(request, where, timeout, {});
  }

 private:
  void receive_abort_record() {  // with mutex_ held
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

  std::mutex mutex_;
  MPI_Comm control_ = MPI_COMM_NULL;
  int abort_tag_, world_rank_, world_size_;
  int failed_rank_ = -1;
  std::string failure_;
};

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
      launch_(std::move(launch)) {}

MpiProcessGroup::~MpiProcessGroup() {
  shutdown_worker();
  if (launch_->failed() || mpi_finalized()) return;  // requests may still be pending on comm_
  auto lock = serialize_mpi();
  MPI_Comm_free(&comm_);
}

std::string MpiProcessGroup::where(const char* op, uint64_t sequence) const {
  return std::string(op) + " #" + std::to_string(sequence) + " on rank " + std::to_string(world_rank());
}

static void check_cpu(const char* op, const Tensor& tensor) {
  SL_CHECK(tensor.device().is_cpu(), op, ": the mpi backend moves CPU tensors, got one on ", tensor.device(),
           " (use the nccl backend for CUDA tensors)");
}

static int mpi_count(const char* op, int64_t count) {
  SL_CHECK(count <= INT_MAX, op, ": the mpi backend moves at most ", INT_MAX, " elements per call, got ", count);
  return static_cast<int>(count);
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
  MPI_Request request;
  SL_MPI_CALL(at, MPI_Ireduce_scatter_block(input.raw_data(), output.raw_data(), static_cast<int>(output.numel()),
                                            mpi_type(input.dtype()), mpi_op(op, input.dtype()), comm_, &request));
  launch_->wait(request, at, options().timeout, {output.impl_ptr(), input.impl_ptr()});
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

// ---- point to point -------------------------------------------------------------------------------
//
// MPI matches a message to the earliest *posted* irecv with the same (source, tag) — at irecv(), not
// at wait() as the threads backend does; a Work dropped before it completed cancels its recv.

namespace {
class MpiP2PWork : public Work {
 public:
  MpiP2PWork(std::shared_ptr<MpiLaunchState> launch, MPI_Request request, Tensor tensor, std::string where,
             std::chrono::milliseconds timeout, std::function<void(int64_t)> on_received)
      : launch_(std::move(launch)),
        request_(request),
        tensor_(std::move(tensor)),
        where_(std::move(where)),
        timeout_(timeout),
        on_received_(std::move(on_received)) {}

  ~MpiP2PWork() override {
    std::lock_guard lock(mutex_);
    if (done_ || mpi_finalized()) return;
    auto mpi = serialize_mpi();
    if (on_received_) MPI_Cancel(&request_);  // an unmatched recv must not take a later message
    MPI_Request_free(&request_);
    keep_until_exit({tensor_.impl_ptr()});  // a send in flight still reads it
  }

  void wait() override {
    std::lock_guard lock(mutex_);
    if (!done_) {
      try {
        finish(launch_->wait(request_, where_, timeout_, {tensor_.impl_ptr()}));
      } catch (...) {
        error_ = std::current_exception();
      }
      done_ = true;
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    try {
      SL_MPI_CALL(where_, MPI_Test(&request_, &flag, &status));
      if (flag) finish(status);
    } catch (...) {
      error_ = std::current_exception();  // wait() raises it
      flag = 1;
    }
    done_ = flag != 0;
    return done_;
  }

 private:
  void finish(const MPI_Status& status) {
    if (!on_received_) return;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    SL_CHECK(bytes == tensor_.nbytes(), where_, ": the sender sent ", bytes, " bytes but the receiving tensor ",
             tensor_.shape(), " ", dtype_name(tensor_.dtype()), " holds ", tensor_.nbytes());
    on_received_(bytes);
  }

  std::mutex mutex_;
  std::shared_ptr<MpiLaunchState> launch_;
  MPI_Request request_;
  Tensor tensor_;  // keeps the bytes alive while MPI reads or writes them
  std::string where_;
  std::chrono::milliseconds timeout_;
  std::function<void(int64_t)> on_received_;  // recv only: counts the bytes in the ledger
  bool done_ = false;
  std::exception_ptr error_;
};
}  // namespace

static std::string p2p_where(const char* op, int tag, const char* direction, int peer, int me) {
  return std::string(op) + " (tag " + std::to_string(tag) + ") " + direction + " rank " + std::to_string(peer) +
         " on rank " + std::to_string(me);
}

WorkPtr MpiProcessGroup::run_isend(const Tensor& tensor, int dst, int tag) {
  check_cpu("send", tensor);
  SL_CHECK(tag <= runtime().tag_upper_bound, "send: tag ", tag, " is above MPI's limit ", runtime().tag_upper_bound);
  std::string at = p2p_where("send", tag, "to", global_rank(dst), world_rank());
  // Bytes, not elements: a receiver of another dtype then fails on the count, not on a type mismatch.
  MPI_Request request;
  SL_MPI_CALL(at,
              MPI_Isend(tensor.raw_data(), mpi_count("send", tensor.nbytes()), MPI_BYTE, dst, tag, comm_, &request));
  account(CommOp::send, tensor.nbytes(), 0);
  return std::make_shared<MpiP2PWork>(launch_, request, tensor, std::move(at), options().timeout, nullptr);
}

WorkPtr MpiProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  check_cpu("recv", tensor);
  SL_CHECK(tag <= runtime().tag_upper_bound, "recv: tag ", tag, " is above MPI's limit ", runtime().tag_upper_bound);
  std::string at = p2p_where("recv", tag, "from", global_rank(src), world_rank());
  MPI_Request request;
  SL_MPI_CALL(at,
              MPI_Irecv(tensor.raw_data(), mpi_count("recv", tensor.nbytes()), MPI_BYTE, src, tag, comm_, &request));
  auto self = std::static_pointer_cast<MpiProcessGroup>(shared_from_this());
  return std::make_shared<MpiP2PWork>(launch_, request, tensor, std::move(at), options().timeout,
                                      [self](int64_t bytes) { self->account(CommOp::recv, 0, bytes); });
}

// ---- launch -----------------------------------------------------------------------------------------

static std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

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
    state->notify_failure(describe(std::current_exception()));
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
