// threads_p2p.cpp — send and recv between two rank threads.
//
//   isend posts an envelope pointing at the tensor's bytes; its Work completes when the receiver has
//   copied them (a rendezvous: no buffering, no extra copy). So, as with NCCL, two ranks that both
//   send() to each other before they recv() wait for each other: use isend for such exchanges.
//   irecv matches at wait(): messages between one pair of ranks with one tag arrive in the order
//   they were sent, and are received in the order the irecvs are waited on. A request that failed
//   (timeout, abort, wrong size) stays failed: every later wait() rethrows its error.
#include <cstring>

#include "parallel/errors.h"
#include "parallel/threads_backend.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;

namespace {

// A request that failed stays failed: every later wait() rethrows the same error (a retry would
// otherwise report success with whatever the buffer held). is_completed() is true once it is settled,
// either way.
class ThreadsSendWork : public Work {
 public:
  ThreadsSendWork(std::shared_ptr<ThreadWorld> world, Tensor tensor, int dst, WaitContext why,
                  std::chrono::milliseconds timeout)
      : world_(std::move(world)), tensor_(std::move(tensor)), dst_(dst), why_(why), timeout_(timeout) {}
  ~ThreadsSendWork() override {
    if (!settled()) world_->retract(dst_, &envelope_);  // never waited on: take it back
  }
  ThreadWorld::Envelope* envelope() { return &envelope_; }
  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (completed_) return;
    try {
      world_->wait_consumed(dst_, &envelope_, why_, Clock::now() + timeout_);
    } catch (...) {
      error_ = std::current_exception();  // wait_consumed took the envelope back before throwing
      throw;
    }
    completed_ = true;
  }
  bool is_completed() override { return settled(); }

 private:
  bool settled() const { return completed_ || error_ != nullptr; }

  std::shared_ptr<ThreadWorld> world_;
  Tensor tensor_;  // keeps the bytes alive while the envelope points at them
  int dst_;
  WaitContext why_;
  std::chrono::milliseconds timeout_;
  ThreadWorld::Envelope envelope_;
  bool completed_ = false;
  std::exception_ptr error_;
};

class ThreadsRecvWork : public Work {
 public:
  ThreadsRecvWork(std::shared_ptr<ThreadWorld> world, Tensor tensor, int me, int src, uint64_t context,
                  WaitContext why, std::chrono::milliseconds timeout, std::function<void(int64_t)> on_done)
      : world_(std::move(world)),
        tensor_(std::move(tensor)),
        me_(me),
        src_(src),
        context_(context),
        why_(why),
        timeout_(timeout),
        on_done_(std::move(on_done)) {}
  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (completed_) return;
    try {
      receive();
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
    completed_ = true;  // only now: the message is in the tensor
  }
  bool is_completed() override { return completed_ || error_ != nullptr; }

 private:
  void receive() {
    ThreadWorld::Envelope* in = world_->take(me_, src_, context_, why_.sequence, why_, Clock::now() + timeout_);
    int64_t got = in->bytes;
    if (got == tensor_.nbytes() && got > 0) std::memcpy(tensor_.raw_data(), in->data, got);
    world_->release(me_, in);
    SL_CHECK(got == tensor_.nbytes(), "recv (tag ", why_.sequence, ") on rank ", me_, ": rank ", src_, " sent ", got,
             " bytes but the receiving tensor ", tensor_.shape(), " ", dtype_name(tensor_.dtype()), " holds ",
             tensor_.nbytes());
    on_done_(got);
  }

  std::shared_ptr<ThreadWorld> world_;
  Tensor tensor_;
  int me_, src_;
  uint64_t context_;
  WaitContext why_;
  std::chrono::milliseconds timeout_;
  std::function<void(int64_t)> on_done_;
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace

WorkPtr ThreadsProcessGroup::run_isend(const Tensor& tensor, int dst, int tag) {
  check_cpu("send", tensor);
  auto work = std::make_shared<ThreadsSendWork>(world_, tensor, global_rank(dst),
                                                WaitContext{"send", static_cast<uint64_t>(tag), world_rank()},
                                                options().timeout);
  *work->envelope() = ThreadWorld::Envelope{context_, static_cast<uint64_t>(tag), world_rank(), tensor.raw_data(),
                                            tensor.nbytes()};
  world_->post(global_rank(dst), work->envelope());
  account(CommOp::send, tensor.nbytes(), 0);
  return work;
}

WorkPtr ThreadsProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  check_cpu("recv", tensor);
  // The ledger learns the bytes once they arrived; the group outlives the Work in every normal use,
  // but hold it to be safe.
  auto self = shared_from_this();
  return std::make_shared<ThreadsRecvWork>(
      world_, tensor, world_rank(), global_rank(src), context_,
      WaitContext{"recv", static_cast<uint64_t>(tag), world_rank()}, options().timeout,
      [self = std::static_pointer_cast<ThreadsProcessGroup>(self)](int64_t bytes) {
        self->account(CommOp::recv, 0, bytes);
      });
}

}  // namespace sl::parallel
