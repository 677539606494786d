// nccl_collectives.cpp — the NCCL group's collectives: all_reduce, all_gather, reduce_scatter and
// broadcast (Tensor forms and *_device forms on raw GPU memory), and all_to_all (grouped send/recv),
// each enqueued on the group's stream and waited for by polling; the ledger counts the ring
// algorithms' bytes so that it matches the threads backend's. exchange() and barrier() all-gather bytes without a ledger entry.
#include "parallel/comm/errors.h"
#include "parallel/comm/backends/nccl_backend.h"
#include "parallel/comm/backends/nccl_common.h"

#ifdef SL_WITH_NCCL
#include <algorithm>
#include <cstddef>
#include <cstring>

namespace sl::parallel {

using namespace nccl_detail;

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

// The engine's front half (wait_for, in nccl_backend.cpp, is the back): every collective's NCCL call
// goes through here, under nccl_mutex_, after the send/recv queue is flushed.
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

// all_to_all: one ncclSend and one ncclRecv per peer inside ncclGroupStart/End (NCCL has no
// all-to-all call; grouped point-to-point is how PyTorch and Megatron do it). The ledger counts what
// moves, as the threads backend's pairwise exchange does. Split sizes that disagree between two ranks
// are not detected here (NCCL would wait until the timeout): in debug mode (SL_DEBUG_COLLECTIVES=1)
// ProcessGroup::check_split_sizes compares them first.
void NcclProcessGroup::run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                                      uint64_t sequence) {
  check_tensor("all_to_all", output);
  check_tensor("all_to_all", input);
  Op what{"all_to_all", sequence, -1, Clock::now(), options().timeout};
  const int n = size();
  const auto* in = static_cast<const std::byte*>(input.data_ptr());
  auto* out = static_cast<std::byte*>(output.data_ptr());
  auto done = enqueue(what, [&]() -> ncclResult_t {
    ncclResult_t result = ncclGroupStart();
    for (int peer = 0; peer < n && result == ncclSuccess; ++peer) {
      if (layout.send_bytes[peer] > 0)
        result = ncclSend(in + layout.send_offset[peer], static_cast<size_t>(layout.send_bytes[peer]), ncclUint8, peer,
                          comm_, stream_);
      if (result == ncclSuccess && layout.recv_bytes[peer] > 0)
        result = ncclRecv(out + layout.recv_offset[peer], static_cast<size_t>(layout.recv_bytes[peer]), ncclUint8,
                          peer, comm_, stream_);
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result != ncclSuccess ? result : ended;
  });
  wait_for(what, *done);
  int64_t sent = 0, received = 0;
  for (int peer = 0; peer < n; ++peer)
    if (peer != rank()) sent += layout.send_bytes[peer], received += layout.recv_bytes[peer];
  account(CommOp::all_to_all, sent, received);
}

void NcclProcessGroup::run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) {
  check_tensor("all_reduce", tensor);
  all_reduce_raw(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), tensor.dtype(), op, sequence);
}

void NcclProcessGroup::run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) {
  check_tensor("all_gather", output);
  check_tensor("all_gather", input);
  all_gather_raw(output.data_ptr(), input.data_ptr(), static_cast<size_t>(input.numel()), input.dtype(), sequence);
}

void NcclProcessGroup::run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) {
  check_tensor("reduce_scatter", output);
  check_tensor("reduce_scatter", input);
  reduce_scatter_raw(output.data_ptr(), input.data_ptr(), static_cast<size_t>(output.numel()), output.dtype(), op,
                     sequence);
}

void NcclProcessGroup::run_broadcast(const Tensor& tensor, int root, uint64_t sequence) {
  check_tensor("broadcast", tensor);
  broadcast_raw(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), tensor.dtype(), root, sequence);
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

}  // namespace sl::parallel

#endif  // SL_WITH_NCCL
