// thread_world.cpp — the mailboxes rank threads post to, and how every wait on them ends.
#include <algorithm>
#include <chrono>
#include <thread>

#include "parallel/comm/errors.h"
#include "parallel/comm/backends/threads_backend.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;

ThreadWorld::ThreadWorld(int size, std::chrono::milliseconds timeout, Topology topology)
    : size_(size), timeout_(timeout), topology_(std::move(topology)), finished_(size, 0) {
  for (int r = 0; r < size; ++r) {
    mailboxes_.push_back(std::make_unique<Mailbox>());
    mailboxes_.back()->wire_free.assign(topology_.enabled() ? size : 0, Clock::time_point{});
  }
}

// A taken message still on the simulated wire: wait for it to arrive (without links: return at once).
static void wait_for_arrival(const ThreadWorld::Envelope* e) {
  if (e->link_s > 0) std::this_thread::sleep_until(e->arrives);
}

static long long elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

void ThreadWorld::check_waitable(int peer, const WaitContext& why, Clock::time_point deadline) {
  std::string where = std::string(why.op) + " #" + std::to_string(why.sequence) + " on rank " + std::to_string(why.rank);
  {
    std::lock_guard lock(state_mutex_);
    if (failed_rank_ >= 0 && failure_is_mismatch_)
      throw CollectiveMismatch(where + ": rank " + std::to_string(failed_rank_) + " found: " + failure_);
    if (failed_rank_ >= 0)
      throw RemoteError(where + ": aborted because rank " + std::to_string(failed_rank_) + " failed: " + failure_,
                        failed_rank_);
    if (finished_[peer])
      throw CollectiveMismatch(where + ": rank " + std::to_string(peer) +
                               " has already returned from its function, so it will never answer (did it skip "
                               "this collective?)");
  }
  if (Clock::now() >= deadline) {
    // Every deadline is (start of the op) + timeout: report the time since the op began.
    throw TimeoutError(where + ": timed out after " + std::to_string(elapsed_ms(deadline - timeout_)) +
                       " ms waiting for rank " + std::to_string(peer) + " (timeout " +
                       std::to_string(timeout_.count()) + " ms; did rank " +
                       std::to_string(peer) + " skip this collective, or is it stuck?)");
  }
}

void ThreadWorld::post(int dst, Envelope* envelope) {
  Mailbox& box = *mailboxes_[dst];
  {
    std::lock_guard lock(box.mutex);
    if (topology_.enabled()) {
      // latency + bytes / bandwidth, the bytes after those of the pair's earlier messages.
      const Link& link = topology_.link(envelope->src, dst);
      auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
      const double wire_s = link.seconds(envelope->bytes) - link.latency_s;
      Clock::time_point& free = box.wire_free[static_cast<size_t>(envelope->src)];
      const Clock::time_point start = std::max(Clock::now(), free);
      free = start + seconds(wire_s);
      envelope->link_s = link.seconds(envelope->bytes);
      envelope->arrives = start + seconds(envelope->link_s);
    }
    envelope->state = Envelope::posted;
    box.envelopes.push_back(envelope);
  }
  box.changed.notify_all();
}

// Collective tags carry the op and the sequence number (see threads_backend.cpp): a receiver that
// finds its peer in a *different* op at the same sequence number knows at once that they diverged.
static constexpr uint64_t kCollectiveBit = 1ull << 63;
static uint64_t op_bits(uint64_t tag) { return (tag >> 56) & 0x7f; }
static uint64_t sequence_bits(uint64_t tag) { return (tag >> 16) & ((1ull << 40) - 1); }

ThreadWorld::Envelope* ThreadWorld::take(int me, int src, uint64_t context, uint64_t tag, const WaitContext& why,
                                         Clock::time_point deadline) {
  Mailbox& box = *mailboxes_[me];
  std::unique_lock lock(box.mutex);
  while (true) {
    for (auto it = box.envelopes.begin(); it != box.envelopes.end(); ++it) {
      Envelope* e = *it;
      if (e->src != src || e->context != context) continue;
      if (e->tag == tag) {
        box.envelopes.erase(it);
        e->state = Envelope::taken;
        lock.unlock();
        wait_for_arrival(e);
        return e;
      }
      bool both_collective = (e->tag & kCollectiveBit) && (tag & kCollectiveBit);
      if (both_collective && sequence_bits(e->tag) == sequence_bits(tag) && op_bits(e->tag) != op_bits(tag))
        throw CollectiveMismatch(std::string(why.op) + " #" + std::to_string(why.sequence) + " on rank " +
                                 std::to_string(me) + ": rank " + std::to_string(src) + " called " +
                                 comm_op_name(static_cast<CommOp>(op_bits(e->tag))) + " #" +
                                 std::to_string(sequence_bits(e->tag)) + " instead");
    }
    check_waitable(src, why, deadline);
    box.changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

// With the mailbox locked: the message after the first `skip` from src in context, taken; or nullptr.
// arrived_by: leave a message that would still be on the simulated wire then (max(): take any).
static ThreadWorld::Envelope* take_locked(std::vector<ThreadWorld::Envelope*>& envelopes, int src, uint64_t context,
                                          size_t skip, Clock::time_point arrived_by = Clock::time_point::max()) {
  size_t seen = 0;
  for (auto it = envelopes.begin(); it != envelopes.end(); ++it) {
    ThreadWorld::Envelope* e = *it;
    if (e->src != src || e->context != context || (e->tag & kCollectiveBit)) continue;
    if (seen++ < skip) continue;  // an earlier receive's message
    if (e->arrives > arrived_by) return nullptr;
    envelopes.erase(it);
    e->state = ThreadWorld::Envelope::taken;
    return e;
  }
  return nullptr;
}

ThreadWorld::Envelope* ThreadWorld::try_take_message(int me, int src, uint64_t context, size_t skip) {
  Mailbox& box = *mailboxes_[me];
  std::lock_guard lock(box.mutex);
  return take_locked(box.envelopes, src, context, skip, Clock::now());
}

ThreadWorld::Envelope* ThreadWorld::take_message(int me, int src, uint64_t context, size_t skip, const WaitContext& why,
                                                 Clock::time_point deadline) {
  Mailbox& box = *mailboxes_[me];
  std::unique_lock lock(box.mutex);
  while (true) {
    if (Envelope* e = take_locked(box.envelopes, src, context, skip)) {
      lock.unlock();
      wait_for_arrival(e);
      return e;
    }
    check_waitable(src, why, deadline);
    box.changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

void ThreadWorld::release(int me, Envelope* envelope) {
  Mailbox& box = *mailboxes_[me];
  {
    std::lock_guard lock(box.mutex);
    envelope->state = Envelope::consumed;
  }
  box.changed.notify_all();
}

bool ThreadWorld::wait_consumed(int dst, Envelope* envelope, const WaitContext& why, Clock::time_point deadline,
                                Clock::time_point return_at) {
  Mailbox& box = *mailboxes_[dst];
  std::unique_lock lock(box.mutex);
  while (envelope->state != Envelope::consumed) {
    if (envelope->state == Envelope::posted && Clock::now() >= return_at && Clock::now() < deadline) return false;
    if (envelope->state == Envelope::posted) {
      try {
        check_waitable(dst, why, deadline);
      } catch (...) {
        // Take the envelope back before the sender's buffer goes away.
        box.envelopes.erase(std::find(box.envelopes.begin(), box.envelopes.end(), envelope));
        envelope->state = Envelope::withdrawn;
        throw;
      }
    }
    // Once taken, the receiver is copying right now: that ends without waiting on anyone.
    box.changed.wait_until(lock, std::min({deadline, return_at, Clock::now() + std::chrono::milliseconds(200)}));
  }
  return true;
}

void ThreadWorld::retract(int dst, Envelope* envelope) noexcept {
  Mailbox& box = *mailboxes_[dst];
  std::unique_lock lock(box.mutex);
  if (envelope->state == Envelope::posted) {
    box.envelopes.erase(std::find(box.envelopes.begin(), box.envelopes.end(), envelope));
    envelope->state = Envelope::withdrawn;
    return;
  }
  box.changed.wait(lock, [&] { return envelope->state != Envelope::taken; });
}

void ThreadWorld::abort(int failed_rank, const std::string& what, bool mismatch) {
  {
    std::lock_guard lock(state_mutex_);
    if (failed_rank_ >= 0) return;
    failed_rank_ = failed_rank;
    failure_ = what;
    failure_is_mismatch_ = mismatch;
  }
  notify_everyone();
}

int ThreadWorld::failed_rank() const {
  std::lock_guard lock(state_mutex_);
  return failed_rank_;
}

std::string ThreadWorld::failure() const {
  std::lock_guard lock(state_mutex_);
  return failure_;
}

void ThreadWorld::mark_finished(int rank) {
  {
    std::lock_guard lock(state_mutex_);
    finished_[rank] = 1;
  }
  notify_everyone();
}

void ThreadWorld::notify_everyone() {
  // Lock each mailbox so a waiter between its check and its wait cannot miss the wake-up.
  for (auto& box : mailboxes_) {
    { std::lock_guard lock(box->mutex); }
    box->changed.notify_all();
  }
}

}  // namespace sl::parallel
