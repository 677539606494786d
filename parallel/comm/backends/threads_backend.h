// threads_backend.h — ranks as threads of one process, talking through shared memory.
//
//   Every rank has a mailbox. A sender *posts* an envelope (a pointer to its bytes, not a copy) into
//   the receiver's mailbox and waits; the receiver takes the envelope, reads the bytes straight from
//   the sender's buffer (copying or reducing them into its own), and marks it consumed, which
//   releases the sender. So a message costs exactly one pass over its bytes — the one the algorithm
//   needs anyway — and the collectives are the textbook ring algorithms written out:
//
//       reduce-scatter step k: rank r sends chunk (r-k) right, adds chunk (r-k-1) from the left
//       all-gather     step k: rank r sends chunk (r+1-k) right, copies chunk (r-k) from the left
//
//       rank 0 ──> rank 1 ──> rank 2 ──> rank 3
//         ^                                 │
//         └─────────────────────────────────┘
//
//   all_reduce = reduce-scatter + all-gather: each rank sends 2(n-1)/n·S bytes, in 2(n-1) steps.
//
//   Waits end when the message arrives, when the world is aborted (a rank threw: RemoteError), when
//   the peer waited for has already returned from its function (it skipped a collective:
//   CollectiveMismatch), or when the group's timeout passes (TimeoutError). Nothing waits forever.
//
//   The bytes must be host memory: a CUDA tensor goes through a host copy (host_staging.h,
//   threads_staging.cpp), so that thread ranks can share a GPU. NCCL moves GPU memory directly.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"

namespace sl::parallel {

// Collective message tags: bit 63 collective, 56..62 the op, 16..55 sequence, 0..15 step (0xffff: a
// broadcast's size, sent first). Point-to-point tags are the user's (>= 0, < 2^31). Exchanges
// (fingerprints, split) use op 0x7f.
inline uint64_t collective_tag(CommOp op, uint64_t sequence, uint64_t step) {
  return (1ull << 63) | (static_cast<uint64_t>(op) << 56) | ((sequence & ((1ull << 40) - 1)) << 16) | (step & 0xffff);
}

// What a wait is for, for the error messages: "all_reduce #3".
struct WaitContext {
  const char* op;
  uint64_t sequence;  // collectives; for send/recv the tag
  int rank;           // the waiting rank (world rank)
};

// A group's receives still waiting for their messages, per source (defined in threads_p2p.cpp).
struct PendingReceives;
std::shared_ptr<PendingReceives> make_pending_receives(size_t group_size);

// The state all rank threads of one launch() share.
class ThreadWorld {
 public:
  struct Envelope {
    uint64_t context = 0;  // which group
    uint64_t tag = 0;      // which message within it
    int src = 0;           // world rank of the sender
    const void* data = nullptr;
    int64_t bytes = 0;
    enum State : uint8_t { posted, taken, consumed, withdrawn } state = posted;
    int user_tag = -1;  // send/recv: the tag the sender gave (checked against the recv's in debug mode)
    // Simulated links (topology.h), stamped by post(): the link's charge for these bytes, and the
    // time the message would arrive (after the pair's earlier messages have crossed the wire). A
    // receiver reads it no earlier than that.
    double link_s = 0;
    std::chrono::steady_clock::time_point arrives{};
  };

  // `topology`: charge every message latency + bytes / bandwidth of the link between the ranks'
  // nodes (off by default: messages are free, and nothing else changes either way).
  ThreadWorld(int size, std::chrono::milliseconds timeout, Topology topology = {});
  const Topology& topology() const { return topology_; }
  int size() const { return size_; }

  // Sender side: post into dst's mailbox, later wait until the receiver consumed it.
  void post(int dst, Envelope* envelope);
  // Returns true once consumed; false if return_at came first (the envelope stays posted).
  bool wait_consumed(int dst, Envelope* envelope, const WaitContext& why, std::chrono::steady_clock::time_point deadline,
                     std::chrono::steady_clock::time_point return_at = std::chrono::steady_clock::time_point::max());
  // Receiver side: wait for the first envelope from src matching (context, tag), mark it taken;
  // read its bytes; then release() marks it consumed. With simulated links both takes return no
  // earlier than the message's arrival (the try_ form does not take a message still on the wire).
  Envelope* take(int me, int src, uint64_t context, uint64_t tag, const WaitContext& why,
                 std::chrono::steady_clock::time_point deadline);
  // Point to point: wait until src has posted more than `skip` messages (not collective steps) in
  // `context` that nobody has taken, and take the one after the first `skip` (which belong to
  // earlier receives still outstanding).
  Envelope* take_message(int me, int src, uint64_t context, size_t skip, const WaitContext& why,
                         std::chrono::steady_clock::time_point deadline);
  Envelope* try_take_message(int me, int src, uint64_t context, size_t skip);  // nullptr if not there yet
  void release(int me, Envelope* envelope);
  // Sender side, on an error path: take a posted envelope back (or let a receiver that already took
  // it finish reading), so the sender's buffer may go away.
  void retract(int dst, Envelope* envelope) noexcept;

  // A rank failed: every wait in every rank ends with RemoteError naming it. The first call wins.
  // A mismatch found in debug mode travels as a CollectiveMismatch, so every rank reports it as one.
  void abort(int failed_rank, const std::string& what, bool mismatch = false);
  int failed_rank() const;
  std::string failure() const;  // what the failed rank threw
  // A rank returned from its function: waits on it can never be answered.
  void mark_finished(int rank);


 private:
  struct Mailbox {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Envelope*> envelopes;  // in posting order
    // Simulated links: when the wire from each source to this rank is free again. A pair's
    // messages cross it one after another (their latencies overlap, their bytes do not).
    std::vector<std::chrono::steady_clock::time_point> wire_free;
  };
  // Throws if the wait for `peer` can never end; called with `box` locked.
  void check_waitable(int peer, const WaitContext& why, std::chrono::steady_clock::time_point deadline);
  void notify_everyone();

  int size_;
  std::chrono::milliseconds timeout_;
  Topology topology_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  mutable std::mutex state_mutex_;
  int failed_rank_ = -1;
  std::string failure_;
  bool failure_is_mismatch_ = false;
  std::vector<char> finished_;
};

class ThreadsProcessGroup : public ProcessGroup {
 public:
  // members: world ranks in group order; `rank` is this thread's index into members.
  ThreadsProcessGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> members, int rank, uint64_t context,
                      GroupOptions options);
  ~ThreadsProcessGroup() override;

  std::string backend_name() const override { return "threads"; }
  int global_rank(int group_rank) const override { return members_.at(group_rank); }
  void abort_world(const std::string& what, bool mismatch = false) override {
    world_->abort(world_rank(), what, mismatch);
  }

 protected:
  void run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) override;
  void run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) override;
  void run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) override;
  void run_broadcast(const Tensor& tensor, int root, uint64_t sequence) override;
  void run_barrier(uint64_t sequence) override;
  void run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                      uint64_t sequence) override;
  WorkPtr run_isend(const Tensor& tensor, int dst, int tag) override;
  WorkPtr run_irecv(const Tensor& tensor, int src, int tag) override;
  void exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) override;
  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t child_index) override;

 private:
  // One exchange: send `send_bytes` at send_data to the right neighbour (or group rank `to`); from the
  // left (or group rank `from`) receive into recv_dst either a copy or (reduce) recv_dst = recv_lhs op incoming.
  struct Step {
    const void* send_data;
    int64_t send_bytes;
    void* recv_dst;
    int64_t recv_bytes;
    const void* recv_lhs;  // nullptr: copy
    DType dtype;
    ReduceOp op;
    uint64_t tag;
    CommOp account_as;
    WaitContext why;
    std::chrono::steady_clock::time_point deadline;
    bool counted = true;  // false: fingerprints and split colors travel uncounted
    int to = -1, from = -1;  // group ranks; -1: the ring's right and left neighbours
  };
  void ring_step(const Step& step);
  void ring_all_gather_bytes(void* output, int64_t bytes_per_rank, uint64_t tag_base, const WaitContext& why,
                             std::chrono::steady_clock::time_point deadline);
  // The collectives on host memory. The run_* overrides (threads_staging.cpp) stage a CUDA tensor
  // through a host copy and call these; a CPU tensor passes through as it is.
  void all_reduce_on_host(const Tensor& tensor, ReduceOp op, uint64_t sequence);
  void all_gather_on_host(const Tensor& output, const Tensor& input, uint64_t sequence);
  void reduce_scatter_on_host(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence);
  void broadcast_on_host(const Tensor& tensor, int root, uint64_t sequence);
  void all_to_all_on_host(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                          uint64_t sequence);  // threads_all_to_all.cpp
  WorkPtr isend_on_host(const Tensor& tensor, int dst, int tag);  // threads_p2p.cpp
  WorkPtr irecv_on_host(const Tensor& tensor, int src, int tag);
  int world_rank() const { return members_[rank()]; }
  int left() const { return members_[(rank() + size() - 1) % size()]; }
  int right() const { return members_[(rank() + 1) % size()]; }

  std::shared_ptr<ThreadWorld> world_;
  std::vector<int> members_;
  uint64_t context_;
  // Point to point: the receives issued from each group rank and not yet settled, oldest first.
  // Messages from A take them in that order, whatever the tags (NCCL's rule); a receive that fails
  // or is dropped leaves the queue, and its message goes to the next one (as MPI_Cancel does).
  std::shared_ptr<PendingReceives> pending_receives_;
};

}  // namespace sl::parallel
