// nccl_p2p.cpp — the NCCL group's send/recv. They run on a second communicator and stream (so that an
// isend waiting for its receiver holds up no collective), and are queued, then issued together in one
// ncclGroupStart/End when one of them is waited on, is_completed() is asked, or a collective starts:
//
//   isend(right) ─┐
//   irecv(left)  ─┴─> queue ─ wait() ─> ncclGroupStart; ncclSend; ncclRecv; ncclGroupEnd ─> poll the event
//
// so "isend right, irecv left, wait" works around a ring. NCCL matches the sends and receives between
// two ranks in issue order (it has no tags). The ledger counts S bytes: sent by send, received by recv.
#include "parallel/comm/backends/nccl_backend.h"
#include "parallel/comm/backends/nccl_common.h"

#ifdef SL_WITH_NCCL
#include <memory>
#include <vector>

namespace sl::parallel {

using namespace nccl_detail;

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
  return p2p_raw(true, tensor.data_ptr(), static_cast<size_t>(tensor.nbytes()), dst, tag, tensor);
}

WorkPtr NcclProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  check_tensor("recv", tensor);
  return p2p_raw(false, tensor.data_ptr(), static_cast<size_t>(tensor.nbytes()), src, tag, tensor);
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

}  // namespace sl::parallel

#endif  // SL_WITH_NCCL
