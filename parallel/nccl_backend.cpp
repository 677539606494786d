// nccl_backend.cpp — the NCCL backend (nccl_backend.h has the picture): the engine that enqueues
// and polls, the collectives and their ledger, queued send/recv, sub-groups by ncclCommSplit, and
// the two bootstraps (one thread per GPU here; one process per GPU under mpirun).
#include "parallel/nccl_backend.h"

#include "parallel/errors.h"

#ifdef SL_WITH_NCCL
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "tensor/device.h"
#ifdef SL_WITH_MPI
#include <mpi.h>
#endif
#endif

namespace sl::parallel {

#ifdef SL_WITH_NCCL

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Making a communicator (init, split) is a bootstrap over every rank that may also create CUDA
// contexts: seconds on a fresh machine, so it gets at least this long whatever the group's timeout.
static constexpr milliseconds kSetupTimeoutFloor{30000};
static constexpr uint64_t kNoSequence = ~0ull;

static long long ms(Clock::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); }

// Spin briefly (small collectives finish in microseconds), then sleep between polls.
static void backoff(int polls) {
  if (polls < 100)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 1000 ? 20 : 200));
}

static std::string nccl_text(ncclResult_t status) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (NCCL: ") + last + ")";
  return text;
}

static ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  throw InternalError("nccl_type: unknown dtype");
}

static ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;  // NCCL divides by n itself (floating dtypes; checked before)
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  throw InternalError("nccl_op: unknown reduce op");
}

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

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();
  throw Error(::sl::detail::concat(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(status), " (",
                                   cudaGetErrorName(status), ")"));
}

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
static void end_communicators(const std::vector<std::pair<ncclComm_t, int>>& comms, bool clean,
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

// ---- the group: construction and teardown -------------------------------------------------------

struct NcclProcessGroup::Op {
  const char* name;
  uint64_t sequence;  // collectives: the sequence number (kNoSequence: none); send/recv: the tag
  int peer;           // send/recv: the group rank on the other side; collectives: -1
  Clock::time_point start;
  milliseconds timeout;
};

class NcclProcessGroup::Event {
 public:
  Event() { SL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(event_); }  // safe while pending: CUDA frees it once it completes
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

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

// ---- the engine: enqueue under the lock, then poll until done, failed, aborted or late ----------

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

template <typename Calls>
std::shared_ptr<NcclProcessGroup::Event> NcclProcessGroup::enqueue(const Op& op, Calls&& nccl_calls) {
  SL_CUDA_CHECK(cudaSetDevice(device_));  // the async worker thread starts on device 0
  auto done = std::make_shared<Event>();
  std::lock_guard lock(nccl_mutex_);
  check_usable(op);
  flush_p2p_locked(/*may_wait=*/false);  // queued sends go first: a peer may wait for them before this
  // What the legacy default stream wrote before (copies, kernels) is there before NCCL reads it.
  SL_CUDA_CHECK(cudaEventRecord(done->get(), cudaStreamLegacy));
  SL_CUDA_CHECK(cudaStreamWaitEvent(stream_, done->get(), 0));
  finish_in_progress(op, comm_, nccl_calls(), op.timeout);
  SL_CUDA_CHECK(cudaEventRecord(done->get(), stream_));  // re-recording does not disturb the wait above
  return done;
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

// ---- collectives --------------------------------------------------------------------------------

void NcclProcessGroup::check_tensor(const char* op, const Tensor& tensor) const {
  SL_CHECK(tensor.device().is_cuda() && tensor.device().index == device_, op,
           ": the nccl backend moves tensors on this rank's GPU cuda:", device_, ", got a tensor on ", tensor.device(),
           tensor.device().is_cpu() ? " (the threads and mpi backends move CPU tensors)" : "");
}

// Element ranges of the n ring chunks of `count` elements, as threads_backend.cpp cuts them.
static int64_t chunk_size(int64_t count, int n, int i) { return count / n + (i < count % n ? 1 : 0); }

void NcclProcessGroup::all_reduce_raw(void* data, size_t count, DType dtype, ReduceOp op, uint64_t sequence) {
  Op what{"all_reduce", sequence, -1, Clock::now(), options().timeout};
  if (count > 0) {
    auto done =
        enqueue(what, [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_); });
    wait_for(what, *done);
  }
  // The ring: reduce-scatter sends every chunk but (r+1) and receives every chunk but r; the
  // all-gather sends every chunk but (r+2) and receives every chunk but (r+1).
  const int n = size(), r = rank();
  if (n == 1) return;
  const auto c = static_cast<int64_t>(count), es = static_cast<int64_t>(dtype_size(dtype));
  account(CommOp::all_reduce, (2 * c - chunk_size(c, n, (r + 1) % n) - chunk_size(c, n, (r + 2) % n)) * es,
          (2 * c - chunk_size(c, n, r) - chunk_size(c, n, (r + 1) % n)) * es);
}

void NcclProcessGroup::all_gather_raw(void* output, const void* input, size_t count_per_rank, DType dtype,
                                      uint64_t sequence) {
  Op what{"all_gather", sequence, -1, Clock::now(), options().timeout};
  if (count_per_rank > 0) {
    auto done =
        enqueue(what, [&] { return ncclAllGather(input, output, count_per_rank, nccl_type(dtype), comm_, stream_); });
    wait_for(what, *done);
  }
  const int64_t bytes = (size() - 1) * static_cast<int64_t>(count_per_rank * dtype_size(dtype));
  if (size() > 1) account(CommOp::all_gather, bytes, bytes);
}

void NcclProcessGroup::reduce_scatter_raw(void* output, const void* input, size_t count_per_rank, DType dtype,
                                          ReduceOp op, uint64_t sequence) {
  Op what{"reduce_scatter", sequence, -1, Clock::now(), options().timeout};
  if (count_per_rank > 0) {
    auto done = enqueue(what, [&] {
      return ncclReduceScatter(input, output, count_per_rank, nccl_type(dtype), nccl_op(op), comm_, stream_);
    });
    wait_for(what, *done);
  }
  const int64_t bytes = (size() - 1) * static_cast<int64_t>(count_per_rank * dtype_size(dtype));
  if (size() > 1) account(CommOp::reduce_scatter, bytes, bytes);
}

void NcclProcessGroup::broadcast_raw(void* data, size_t count, DType dtype, int root, uint64_t sequence) {
  Op what{"broadcast", sequence, -1, Clock::now(), options().timeout};
  if (count > 0) {
    auto done = enqueue(what, [&] { return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_); });
    wait_for(what, *done);
  }
  // A chain from the root: position 0 only sends, position n-1 only receives, the rest both.
  const int n = size(), position = ((rank() - root) % n + n) % n;
  const auto bytes = static_cast<int64_t>(count * dtype_size(dtype));
  if (n > 1) account(CommOp::broadcast, position < n - 1 ? bytes : 0, position > 0 ? bytes : 0);
}

void NcclProcessGroup::run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) {
  check_tensor("all_reduce", tensor);
  all_reduce_raw(tensor.raw_data(), static_cast<size_t>(tensor.numel()), tensor.dtype(), op, sequence);
}

void NcclProcessGroup::run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) {
  check_tensor("all_gather", output);
  check_tensor("all_gather", input);
  all_gather_raw(output.raw_data(), input.raw_data(), static_cast<size_t>(input.numel()), input.dtype(), sequence);
}

void NcclProcessGroup::run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) {
  check_tensor("reduce_scatter", output);
  check_tensor("reduce_scatter", input);
  reduce_scatter_raw(output.raw_data(), input.raw_data(), static_cast<size_t>(output.numel()), output.dtype(), op,
                     sequence);
}

void NcclProcessGroup::run_broadcast(const Tensor& tensor, int root, uint64_t sequence) {
  check_tensor("broadcast", tensor);
  broadcast_raw(tensor.raw_data(), static_cast<size_t>(tensor.numel()), tensor.dtype(), root, sequence);
}

static void check_count(const char* op, const void* data, int64_t count) {
  SL_CHECK(count >= 0, op, ": count must be >= 0 (got ", count, ")");
  SL_CHECK(count == 0 || data != nullptr, op, ": null pointer for ", count, " elements");
}

void NcclProcessGroup::all_reduce_device(void* data, int64_t count, DType dtype, ReduceOp op) {
  check_count("all_reduce_device", data, count);
  SL_CHECK(op != ReduceOp::avg || is_floating(dtype), "all_reduce_device: avg needs a floating dtype, got ",
           dtype_name(dtype));
  ledger().record_call(CommOp::all_reduce);
  all_reduce_raw(data, static_cast<size_t>(count), dtype, op, device_sequence_++);
}

void NcclProcessGroup::all_gather_device(void* output, const void* input, int64_t count_per_rank, DType dtype) {
  check_count("all_gather_device", output, count_per_rank);
  check_count("all_gather_device", input, count_per_rank);
  ledger().record_call(CommOp::all_gather);
  all_gather_raw(output, input, static_cast<size_t>(count_per_rank), dtype, device_sequence_++);
}

void NcclProcessGroup::reduce_scatter_device(void* output, const void* input, int64_t count_per_rank, DType dtype,
                                             ReduceOp op) {
  check_count("reduce_scatter_device", output, count_per_rank);
  check_count("reduce_scatter_device", input, count_per_rank);
  SL_CHECK(op != ReduceOp::avg || is_floating(dtype), "reduce_scatter_device: avg needs a floating dtype, got ",
           dtype_name(dtype));
  ledger().record_call(CommOp::reduce_scatter);
  reduce_scatter_raw(output, input, static_cast<size_t>(count_per_rank), dtype, op, device_sequence_++);
}

void NcclProcessGroup::broadcast_device(void* data, int64_t count, DType dtype, int root) {
  check_count("broadcast_device", data, count);
  SL_CHECK(root >= 0 && root < size(), "broadcast_device: root ", root, " is not a rank of this group of ", size());
  ledger().record_call(CommOp::broadcast);
  broadcast_raw(data, static_cast<size_t>(count), dtype, root, device_sequence_++);
}

// ---- bytes without a ledger entry: fingerprints, split colors, barriers --------------------------

// All-gathers `bytes` from every rank: into device memory from pinned host memory, ncclAllGather,
// and back, all on this group's stream, each wait polled like any collective's.
void NcclProcessGroup::gather_bytes(const char* name, const void* mine, void* out, size_t bytes, uint64_t sequence) {
  Op what{name, sequence, -1, Clock::now(), options().timeout};
  if (bytes == 0) return;
  const size_t need = bytes * static_cast<size_t>(size() + 1);  // mine, then everyone's
  SL_CUDA_CHECK(cudaSetDevice(device_));
  if (need > staging_bytes_) {
    size_t capacity = std::max(need, 2 * staging_bytes_);
    void* host = nullptr;
    SL_CUDA_CHECK(cudaHostAlloc(&host, capacity, cudaHostAllocPortable));
    if (host_staging_ != nullptr) retired_host_staging_.push_back(host_staging_);
    host_staging_ = host;
    if (device_staging_ != nullptr) SL_CUDA_CHECK(cudaFreeAsync(device_staging_, stream_));
    device_staging_ = nullptr;
    SL_CUDA_CHECK(cudaMallocAsync(&device_staging_, capacity, stream_));
    staging_bytes_ = capacity;
  }
  auto* host = static_cast<std::byte*>(host_staging_);
  auto* gpu = static_cast<std::byte*>(device_staging_);
  std::memcpy(host, mine, bytes);
  auto done = enqueue(what, [&] {
    if (cudaMemcpyAsync(gpu, host, bytes, cudaMemcpyHostToDevice, stream_) != cudaSuccess)
      return ncclUnhandledCudaError;
    return ncclAllGather(gpu, gpu + bytes, bytes, ncclUint8, comm_, stream_);
  });
  wait_for(what, *done);
  if (out == nullptr) return;
  SL_CUDA_CHECK(cudaMemcpyAsync(host + bytes, gpu + bytes, bytes * size(), cudaMemcpyDeviceToHost, stream_));
  SL_CUDA_CHECK(cudaEventRecord(done->get(), stream_));
  wait_for(what, *done);
  std::memcpy(out, host + bytes, bytes * static_cast<size_t>(size()));
}

void NcclProcessGroup::exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) {
  gather_bytes("exchange", mine, out, bytes, sequence);
}

// NCCL has no barrier: a one-byte all-gather cannot finish before every rank has joined it.
void NcclProcessGroup::run_barrier(uint64_t sequence) {
  const char token = 1;
  gather_bytes("barrier", &token, nullptr, 1, sequence);
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

// ---- send / recv: queued, then issued together -------------------------------------------------

struct NcclProcessGroup::P2P {
  bool is_send;
  void* data;
  size_t bytes;
  int peer;
  int tag;
  Tensor keep_alive;            // the tensor whose bytes NCCL reads or writes (undefined: raw memory)
  std::shared_ptr<Event> done;  // set when issued
  Clock::time_point issued;     // the wait's timeout counts from here
};

class NcclProcessGroup::P2PWork : public Work {
 public:
  P2PWork(std::shared_ptr<NcclProcessGroup> group, std::shared_ptr<P2P> p2p)
      : group_(std::move(group)), p2p_(std::move(p2p)) {}
  void wait() override {
    if (p2p_) group_->wait_p2p(p2p_);
  }
  bool is_completed() override { return !p2p_ || group_->p2p_done(p2p_); }

 private:
  std::shared_ptr<NcclProcessGroup> group_;
  std::shared_ptr<P2P> p2p_;  // nullptr: nothing to move (zero bytes)
};

static const char* p2p_name(bool is_send) { return is_send ? "send" : "recv"; }

// The send/recv communicator's last batch may still be "in progress" (NCCL's thread connecting to
// a peer that has not posted its side yet). Once NCCL reports success its kernels are on
// p2p_stream_ and the batch's event can be recorded behind them. false: not yet.
bool NcclProcessGroup::settle_p2p_locked(const Op& op) {
  if (!p2p_unrecorded_) return true;
  ncclResult_t state = ncclInProgress;
  ncclResult_t query = ncclCommGetAsyncError(p2p_comm_, &state);
  if (query != ncclSuccess) state = query;
  if (state == ncclInProgress) return false;
  if (state != ncclSuccess) fail_error(op, "NCCL could not start send/recv: " + nccl_text(state));
  SL_CUDA_CHECK(cudaEventRecord(p2p_unrecorded_->get(), p2p_stream_));
  p2p_unrecorded_.reset();
  return true;
}

// Every queued send and receive in one ncclGroupStart/End: NCCL runs them concurrently, so pairs
// that wait on each other (a ring's send right + receive left) cannot deadlock. It does not wait for
// NCCL to finish starting them, so a collective after it is not held up by a peer yet to connect;
// only the next batch must wait for that (may_wait), as NCCL wants.
void NcclProcessGroup::flush_p2p_locked(bool may_wait) {
  if (pending_p2p_.empty()) return;
  const P2P& first = *pending_p2p_.front();
  Op what{p2p_name(first.is_send), static_cast<uint64_t>(first.tag), first.peer, p2p_flushed_at_, options().timeout};
  for (int polls = 0; !settle_p2p_locked(what); ++polls) {
    if (!may_wait) return;
    if (world_->failed()) fail_remote(what);
    if (Clock::now() - what.start >= what.timeout) fail_timeout(what);
    backoff(polls);
  }
  std::vector<std::shared_ptr<P2P>> batch;
  batch.swap(pending_p2p_);
  SL_CUDA_CHECK(cudaSetDevice(device_));
  auto done = std::make_shared<Event>();
  SL_CUDA_CHECK(cudaEventRecord(done->get(), cudaStreamLegacy));
  SL_CUDA_CHECK(cudaStreamWaitEvent(p2p_stream_, done->get(), 0));
  ncclResult_t result = ncclGroupStart();
  if (result == ncclSuccess) {
    ncclResult_t refused = ncclSuccess;
    for (const auto& p : batch) {
      ncclResult_t r = p->is_send ? ncclSend(p->data, p->bytes, ncclUint8, p->peer, p2p_comm_, p2p_stream_)
                                  : ncclRecv(p->data, p->bytes, ncclUint8, p->peer, p2p_comm_, p2p_stream_);
      if (refused == ncclSuccess && r != ncclSuccess && r != ncclInProgress) refused = r;
    }
    ncclResult_t end = ncclGroupEnd();  // always: NCCL's group state is per thread
    result = refused != ncclSuccess ? refused : end;
  }
  if (result != ncclSuccess && result != ncclInProgress)
    fail_error(what, "NCCL refused send/recv: " + nccl_text(result));
  p2p_unrecorded_ = done;
  p2p_flushed_at_ = Clock::now();
  for (const auto& p : batch) {
    p->done = done;
    p->issued = p2p_flushed_at_;
  }
  settle_p2p_locked(what);  // usually at once: the peers are connected after the first exchange
}

WorkPtr NcclProcessGroup::p2p_raw(bool is_send, void* data, size_t bytes, int peer, int tag, const Tensor& tensor) {
  auto self = std::static_pointer_cast<NcclProcessGroup>(shared_from_this());
  std::shared_ptr<P2P> p2p;  // stays nullptr for zero bytes: nothing to move
  if (bytes > 0) {
    p2p = std::make_shared<P2P>(P2P{is_send, data, bytes, peer, tag, tensor, nullptr, Clock::now()});
    std::lock_guard lock(nccl_mutex_);
    check_usable({p2p_name(is_send), static_cast<uint64_t>(tag), peer, Clock::now(), options().timeout});
    pending_p2p_.push_back(p2p);
  }
  const auto counted = static_cast<int64_t>(bytes);
  account(is_send ? CommOp::send : CommOp::recv, is_send ? counted : 0, is_send ? 0 : counted);
  return std::make_shared<P2PWork>(self, p2p);
}

void NcclProcessGroup::wait_p2p(const std::shared_ptr<P2P>& p2p) {
  Op what{p2p_name(p2p->is_send), static_cast<uint64_t>(p2p->tag), p2p->peer, Clock::now(), options().timeout};
  std::shared_ptr<Event> done;
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard lock(nccl_mutex_);
      check_usable(what);
      if (!p2p->done) flush_p2p_locked(/*may_wait=*/true);
      SL_CHECK(p2p->done, where(what), ": this operation was lost when its batch failed to start");
      what.start = p2p->issued;
      if (p2p_unrecorded_ != p2p->done || settle_p2p_locked(what)) {
        done = p2p->done;
        break;
      }
      if (Clock::now() - what.start >= what.timeout) fail_timeout(what);
    }
    backoff(polls);
  }
  wait_for(what, *done);
}

bool NcclProcessGroup::p2p_done(const std::shared_ptr<P2P>& p2p) {
  Op what{p2p_name(p2p->is_send), static_cast<uint64_t>(p2p->tag), p2p->peer, Clock::now(), options().timeout};
  std::shared_ptr<Event> done;
  {
    std::lock_guard lock(nccl_mutex_);
    if (comm_ == nullptr) return true;                     // wait() will say why
    if (!p2p->done) flush_p2p_locked(/*may_wait=*/false);  // asking means it should make progress
    if (!p2p->done || (p2p_unrecorded_ == p2p->done && !settle_p2p_locked(what))) return false;
    done = p2p->done;
  }
  return cudaEventQuery(done->get()) != cudaErrorNotReady;  // errors: wait() reports them
}

WorkPtr NcclProcessGroup::run_isend(const Tensor& tensor, int dst, int tag) {
  check_tensor("send", tensor);
  return p2p_raw(true, tensor.raw_data(), static_cast<size_t>(tensor.nbytes()), dst, tag, tensor);
}

WorkPtr NcclProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  check_tensor("recv", tensor);
  return p2p_raw(false, tensor.raw_data(), static_cast<size_t>(tensor.nbytes()), src, tag, tensor);
}

static void check_peer(const char* op, int peer, int rank, int size) {
  SL_CHECK(peer >= 0 && peer < size, op, ": peer rank ", peer, " is not in this group of ", size);
  SL_CHECK(peer != rank, op, ": rank ", rank, " cannot talk to itself");
}

WorkPtr NcclProcessGroup::isend_device(const void* data, int64_t count, DType dtype, int dst) {
  check_count("isend_device", data, count);
  check_peer("isend_device", dst, rank(), size());
  ledger().record_call(CommOp::send);
  return p2p_raw(true, const_cast<void*>(data), static_cast<size_t>(count) * dtype_size(dtype), dst, 0, Tensor());
}

WorkPtr NcclProcessGroup::irecv_device(void* data, int64_t count, DType dtype, int src) {
  check_count("irecv_device", data, count);
  check_peer("irecv_device", src, rank(), size());
  ledger().record_call(CommOp::recv);
  return p2p_raw(false, data, static_cast<size_t>(count) * dtype_size(dtype), src, 0, Tensor());
}

// ---- bootstrap 1: one process, one thread per GPU ----------------------------------------------

static std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

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
        world->fail(r, describe(errors[r]));  // every other rank's wait now ends with RemoteError
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
    world->abort("rank " + std::to_string(rank) + " failed: " + describe(std::current_exception()));
    throw;
  }
#else
  (void)world_size, (void)fn, (void)options;
  throw Error("launch: the nccl backend under mpirun needs shardlab built with both NCCL and MPI");
#endif
}

}  // namespace sl::parallel
