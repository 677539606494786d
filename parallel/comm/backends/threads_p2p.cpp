// threads_p2p.cpp — send and recv between two rank threads.
//
//   isend posts an envelope pointing at the tensor's bytes; its Work completes when the receiver has
//   copied them (a rendezvous: no buffering, no extra copy). So, as with NCCL, two ranks that both
//   send() (blocking) to each other before they recv() wait for each other. isend/irecv do not:
//   while a rank waits for its send to be taken, it receives any message its own pending irecvs of
//   the group are waiting for, so "isend right, irecv left, wait the send, wait the recv" around a
//   ring completes (an MPI progress engine, in a dozen lines).
//
//   Matching is by issue order, as NCCL does it: the k-th isend from A to B (in this group) meets
//   B's k-th irecv from A, whatever order the requests are waited on. A receive that failed or was
//   dropped unwaited gives its place up, so its message goes to the next one (MPI_Cancel's rule).
//   The tag does not take part; in debug mode (SL_DEBUG_COLLECTIVES=1) a receive whose tag differs
//   from its message's raises an error naming both. A request that failed (timeout, abort, wrong
//   size) stays failed: every later wait() rethrows its error. A group's requests are waited on by
//   the rank thread that issued them.
#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>

#include "parallel/comm/errors.h"
#include "parallel/comm/backends/threads_backend.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;

namespace {
class ThreadsRecvWork;
}

// Receives from each source, oldest first: a receive's message is the one after its elders'.
struct PendingReceives {
  std::mutex mutex;  // a Work may be dropped on another thread than the one that waits
  std::vector<std::list<ThreadsRecvWork*>> by_source;

  void add(size_t src, ThreadsRecvWork* receive) {
    std::lock_guard lock(mutex);
    by_source[src].push_back(receive);
  }
  void remove(size_t src, ThreadsRecvWork* receive) {
    std::lock_guard lock(mutex);
    by_source[src].remove(receive);
  }
  size_t elders(size_t src, ThreadsRecvWork* receive) {
    std::lock_guard lock(mutex);
    const auto& queue = by_source[src];
    return static_cast<size_t>(std::distance(queue.begin(), std::find(queue.begin(), queue.end(), receive)));
  }
  ThreadsRecvWork* oldest(size_t src) {
    std::lock_guard lock(mutex);
    return by_source[src].empty() ? nullptr : by_source[src].front();
  }
  // Completes every pending receive whose message has arrived, oldest first (defined below).
  void progress();
};

std::shared_ptr<PendingReceives> make_pending_receives(size_t group_size) {
  auto pending = std::make_shared<PendingReceives>();
  pending->by_source.resize(group_size);
  return pending;
}

namespace {

// A request that failed stays failed: every later wait() rethrows the same error (a retry would
// otherwise report success with whatever the buffer held). is_completed() is true once it is settled,
// either way.
class ThreadsSendWork : public Work {
 public:
  ThreadsSendWork(std::shared_ptr<ThreadWorld> world, std::shared_ptr<PendingReceives> pending, Tensor tensor, int dst,
                  WaitContext why, std::chrono::milliseconds timeout)
      : world_(std::move(world)),
        pending_(std::move(pending)),
        tensor_(std::move(tensor)),
        dst_(dst),
        why_(why),
        timeout_(timeout) {}
  ~ThreadsSendWork() override {
    if (!settled()) world_->retract(dst_, &envelope_);  // never waited on: take it back
  }
  ThreadWorld::Envelope* envelope() { return &envelope_; }
  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (completed_) return;
    try {
      // Until the receiver takes it, keep this rank's own receives moving (1 ms slices): the receiver
      // may be waiting for one of them before it gets to ours.
      const auto deadline = Clock::now() + timeout_;
      do pending_->progress();
      while (!world_->wait_consumed(dst_, &envelope_, why_, deadline, Clock::now() + std::chrono::milliseconds(1)));
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
  std::shared_ptr<PendingReceives> pending_;  // this group's receives, moved along while this waits
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
  ThreadsRecvWork(std::shared_ptr<ThreadWorld> world, std::shared_ptr<PendingReceives> pending, Tensor tensor,
                  int me, int src, size_t group_src, uint64_t context, bool check_tag, WaitContext why,
                  std::chrono::milliseconds timeout, std::function<void(int64_t, double)> on_done)
      : world_(std::move(world)),
        pending_(std::move(pending)),
        tensor_(std::move(tensor)),
        me_(me),
        src_(src),
        group_src_(group_src),
        context_(context),
        check_tag_(check_tag),
        why_(why),
        timeout_(timeout),
        on_done_(std::move(on_done)) {
    pending_->add(group_src_, this);
  }
  ~ThreadsRecvWork() override {
    if (!settled()) pending_->remove(group_src_, this);  // dropped unwaited: its message goes to the next receive
  }
  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (completed_) return;
    try {
      receive();
    } catch (...) {
      error_ = std::current_exception();
      pending_->remove(group_src_, this);
      throw;
    }
    completed_ = true;  // only now: the message is in the tensor
  }
  bool is_completed() override { return settled(); }

  // Completes this receive if its message is there (it must be the oldest pending one); for progress().
  bool try_receive() {
    if (settled()) return false;
    ThreadWorld::Envelope* in = world_->try_take_message(me_, src_, context_, 0);
    if (in == nullptr) return false;
    try {
      finish(in);
    } catch (...) {
      error_ = std::current_exception();  // the next wait() raises it
      return true;
    }
    completed_ = true;
    return true;
  }

 private:
  bool settled() const { return completed_ || error_ != nullptr; }
  void receive() {
    const size_t elders = pending_->elders(group_src_, this);
    finish(world_->take_message(me_, src_, context_, elders, why_, Clock::now() + timeout_));
  }
  // The message is taken: copy it (if it fits and the tag is right), release the sender, account.
  void finish(ThreadWorld::Envelope* in) {
    pending_->remove(group_src_, this);  // taken: the next receive from src_ is now the oldest
    const int64_t got = in->bytes;
    const int sent_tag = in->user_tag;
    const double link_s = in->link_s;
    const bool tag_ok = !check_tag_ || sent_tag == static_cast<int>(why_.sequence);
    if (tag_ok && got == tensor_.nbytes() && got > 0) std::memcpy(tensor_.raw_data(), in->data, got);
    world_->release(me_, in);
    SL_CHECK(tag_ok, "recv (tag ", why_.sequence, ") on rank ", me_, ": the matching message from rank ", src_,
             " was sent with tag ", sent_tag, " (messages between two ranks match in the order they were issued)");
    SL_CHECK(got == tensor_.nbytes(), "recv (tag ", why_.sequence, ") on rank ", me_, ": rank ", src_, " sent ", got,
             " bytes but the receiving tensor ", tensor_.shape(), " ", dtype_name(tensor_.dtype()), " holds ",
             tensor_.nbytes());
    on_done_(got, link_s);
  }

  std::shared_ptr<ThreadWorld> world_;
  std::shared_ptr<PendingReceives> pending_;
  Tensor tensor_;
  int me_, src_;      // world ranks
  size_t group_src_;  // src_ as a rank of the group (the index into pending_)
  uint64_t context_;
  bool check_tag_;
  WaitContext why_;
  std::chrono::milliseconds timeout_;
  std::function<void(int64_t, double)> on_done_;  // bytes, the simulated link's charge
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace

void PendingReceives::progress() {
  for (size_t src = 0; src < by_source.size(); ++src)
    while (ThreadsRecvWork* receive = oldest(src))
      if (!receive->try_receive()) break;
}

WorkPtr ThreadsProcessGroup::isend_on_host(const Tensor& tensor, int dst, int tag) {
  auto work = std::make_shared<ThreadsSendWork>(world_, pending_receives_, tensor, global_rank(dst),
                                                WaitContext{"send", static_cast<uint64_t>(tag), world_rank()},
                                                options().timeout);
  // Tag 0 (no collective bit: a collective step never takes it); the user's tag rides along for the
  // debug check. Receives take messages in posting order.
  *work->envelope() = ThreadWorld::Envelope{context_, 0, world_rank(), tensor.raw_data(), tensor.nbytes()};
  work->envelope()->user_tag = tag;
  world_->post(global_rank(dst), work->envelope());
  account(CommOp::send, tensor.nbytes(), 0);
  return work;
}

WorkPtr ThreadsProcessGroup::irecv_on_host(const Tensor& tensor, int src, int tag) {
  // The ledger learns the bytes once they arrived; the group outlives the Work in every normal use,
  // but hold it to be safe.
  auto self = shared_from_this();
  return std::make_shared<ThreadsRecvWork>(
      world_, pending_receives_, tensor, world_rank(), global_rank(src), static_cast<size_t>(src), context_,
      options().debug_collectives, WaitContext{"recv", static_cast<uint64_t>(tag), world_rank()}, options().timeout,
      [self = std::static_pointer_cast<ThreadsProcessGroup>(self)](int64_t bytes, double link_s) {
        self->account(CommOp::recv, 0, bytes);
        self->account_link(CommOp::recv, link_s);
      });
}

}  // namespace sl::parallel
