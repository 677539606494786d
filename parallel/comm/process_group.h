// process_group.h — the communication API every parallel technique stands on.
//
//   A ProcessGroup is a set of ranks that talk to each other. Each rank holds its own handle to the
//   group (rank() says which one it is) and every member calls each collective in the same order:
//
//     all_reduce(t, op)              t := op over all ranks of t            (in place)
//     all_gather(out, in)            out = [in_0 | in_1 | ... | in_{n-1}]   out.numel() = n * in.numel()
//     reduce_scatter(out, in, op)    out = chunk `rank` of op over all ranks of in   (out may be that
//                                    chunk of in itself: in place, as ZeRO reduces its gradients)
//     broadcast(t, root)             t := t of rank `root`
//     all_to_all(out, in)            in = [c_0 | c_1 | ... | c_{n-1}] along dim 0: chunk c_d goes to rank d,
//                                    out = [from rank 0 | ... | from rank n-1]   (the transpose of the
//                                    chunks over ranks; uneven: split sizes in rows of dim 0, as PyTorch's
//                                    all_to_all_single)
//     send / recv (and isend/irecv)  point to point: between two ranks, the k-th send meets the k-th
//                                    receive, in issue order (NCCL's rule); tags are checked in debug mode
//     batch_isend_irecv(ops)         posts a set of isends and irecvs together (a ring exchange, a stage)
//     barrier()                      nobody leaves before everybody arrived
//
//   The class here is backend-neutral: it checks arguments (naming shapes and sizes), counts calls
//   and bytes in a per-group CommLedger, numbers collectives (the sequence number that errors and
//   debug fingerprints cite), compares fingerprints across ranks in debug mode, and runs *_async
//   collectives on one worker thread per group so they stay in issue order. A backend (threads,
//   mpi, nccl) only moves bytes: it implements the protected run_* functions.
//
//   Tensors passed to collectives must be contiguous (every shardlab tensor is) and, for the
//   threads and MPI backends, on a CPU device. Reductions on bf16/f16 accumulate pairwise in float.
#pragma once
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensor/tensor.h"

namespace sl::parallel {

enum class ReduceOp : uint8_t { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// Every kind of call a group counts. Async collectives count under their blocking name.
enum class CommOp : uint8_t { all_reduce, all_gather, reduce_scatter, broadcast, send, recv, barrier, all_to_all, count_ };
const char* comm_op_name(CommOp op);

// Calls and bytes one rank sent and received, per op, in one group.
struct CommStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Simulated links only (topology.h): the time the links charged for the messages this rank
  // received (a ring step's receive overlaps its send, so a step is charged once). 0 otherwise.
  double link_s = 0;
};

// Thread-safe: a rank's async worker and its main thread may both count into it.
class CommLedger {
 public:
  CommStats operator[](CommOp op) const;
  CommStats total() const;  // summed over ops
  void record_call(CommOp op);
  void record_bytes(CommOp op, int64_t bytes_sent, int64_t bytes_received);
  void record_link(CommOp op, double seconds);  // simulated links: a received message's charge
  double link_seconds() const { return total().link_s; }
  void reset();
  std::string report() const;  // one line per op that was called: "all_reduce  3 calls  sent 1.5 MiB ..."

  // The threads backend counts the bytes its ring steps pass. MPI and NCCL choose their own
  // algorithms, and their groups record what the ring would move instead (a model, not a
  // measurement): report() then marks each collective's line "(ring model)" (broadcast: "(chain model)").
  void set_collectives_modelled(bool modelled);
  bool collectives_modelled() const;

  // Time the calling rank spent blocked in this group: inside a blocking collective (moving bytes
  // and waiting for its peers) or in wait() on an async collective or a send/recv. The run report's
  // "communication" time (tools/train.cpp --report-json). reset() clears it too.
  void record_wait(std::chrono::nanoseconds blocked);
  double wait_seconds() const;

 private:
  mutable std::mutex mutex_;
  bool collectives_modelled_ = false;
  std::chrono::nanoseconds waited_{0};
  std::array<CommStats, static_cast<int>(CommOp::count_)> stats_{};
};

// What a collective is, as compared across ranks in debug mode.
struct Fingerprint {
  CommOp op = CommOp::barrier;
  uint64_t sequence = 0;  // the how-many-th collective of this group (from 0)
  DType dtype = DType::f32;
  int32_t root = -1;      // broadcast only
  int32_t reduce = -1;    // ReduceOp for all_reduce / reduce_scatter
  int32_t ndim = 0;
  std::array<int64_t, 8> shape{};  // the input's shape (first 8 dims)

  std::string str() const;                         // "all_reduce #3 f32[4, 8] sum"
  std::string difference(const Fingerprint& other) const;  // "op all_reduce != all_gather; shape ..."
  bool operator==(const Fingerprint& other) const = default;
};

// A handle to an operation in flight (isend, irecv, *_async). wait() blocks until it is done and
// rethrows what it failed with.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  // As wait(), for a helper thread that watches the work while the rank computes (DDP's timeline):
  // the time is not the rank's, so the group's ledger does not count it as blocked.
  virtual void wait_in_background() { wait(); }
};
using WorkPtr = std::shared_ptr<Work>;

// Settings a group inherits from the launch that made it.
struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // as NCCL's default
  bool debug_collectives = false;  // compare fingerprints before each collective
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  ProcessGroup(int rank, int size, GroupOptions options);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  virtual int global_rank(int group_rank) const = 0;  // the world rank of a member
  const GroupOptions& options() const { return options_; }

  // ---- collectives (every member calls them, in the same order) ----
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void all_gather(const Tensor& output, const Tensor& input);            // output: size() x input
  void all_gather(const std::vector<Tensor>& outputs, const Tensor& input);  // one per rank
  void reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum);
  void broadcast(const Tensor& tensor, int root);
  void barrier();
  // Equal chunks: input.size(0) splits over size() ranks; output has input's shape.
  void all_to_all(const Tensor& output, const Tensor& input);
  // Uneven chunks: input_splits[d] rows of input go to rank d, output_splits[s] rows of output come
  // from rank s (each list has size() entries summing to that tensor's dim 0; rows have one shape).
  // Rank s's input_splits[r] must equal rank r's output_splits[s]: a mismatch fails, naming both (threads
  // and mpi: always, on the receiver; every backend, nccl included, in debug mode: on every rank).
  // Both forms: output must not overlap input (refused; a rank receives into rows it has not sent yet).
  void all_to_all(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits);

  // The same, queued on this group's worker thread: returns at once, wait() on the Work.
  WorkPtr all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  WorkPtr all_gather_async(const Tensor& output, const Tensor& input);
  WorkPtr reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum);

  // ---- point to point (ranks are group ranks; tags >= 0) ----
  void send(const Tensor& tensor, int dst, int tag = 0);
  void recv(const Tensor& tensor, int src, int tag = 0);
  WorkPtr isend(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr irecv(const Tensor& tensor, int src, int tag = 0);
  // Posts every op, in order, before waiting on any: the returned Works are in the ops' order. Every
  // backend's isend and irecv return at once, so two neighbours that both send first never deadlock.
  struct P2POp {
    enum class Kind { send, recv } kind;
    Tensor tensor;
    int peer;
    int tag = 0;
  };
  std::vector<WorkPtr> batch_isend_irecv(const std::vector<P2POp>& ops);

  // ---- sub-groups (collective over this group) ----
  // new_group: every member calls it with the same ranks; non-members get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);
  // split: members with the same color form a group, ordered by (key, rank); color < 0 gives nullptr.
  std::shared_ptr<ProcessGroup> split(int color, int key = -1);

  CommLedger& ledger() { return ledger_; }

  // Fault injection, for tests only: `observer` is called before every collective of this handle
  // (on the thread that runs it: the caller's, or for *_async the group's worker), with the
  // collective's fingerprint. If it throws, the collective fails with that exception, as if this
  // rank had failed there. An empty function removes it.
  using CollectiveObserver = std::function<void(const Fingerprint&)>;
  void set_collective_observer(CollectiveObserver observer);
  // Fault injection, for tests and the divergence finder (parallel/runner/debug_probe.h): `fault` is
  // called before every reduction of this handle (all_reduce, reduce_scatter, their async forms; on
  // the thread that runs it, after the observer) with its fingerprint and its input, which it may
  // change in place: the values a wrong reduction would have combined. An empty function removes it.
  using ReductionFault = std::function<void(const Fingerprint&, const Tensor& input)>;
  void set_reduction_fault(ReductionFault fault);

  // Ends every wait of every rank of the launch this group belongs to: they raise RemoteError
  // naming this rank and `what` (mismatch: CollectiveMismatch). The group's worker calls it when an
  // async collective fails, so that peers need not wait for this rank's main thread to notice.
  virtual void abort_world(const std::string& what, bool mismatch = false) = 0;

  struct Job;  // a queued async collective (defined in process_group.cpp)
  uint64_t collectives_issued() const { return next_sequence_; }

 protected:
  // A backend moves bytes. The base class has already checked shapes and dtypes and counts what the
  // run_* functions report through account(). `sequence` names the call in error messages.
  virtual void run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) = 0;
  virtual void run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) = 0;
  virtual void run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, uint64_t sequence) = 0;
  virtual void run_broadcast(const Tensor& tensor, int root, uint64_t sequence) = 0;
  virtual void run_barrier(uint64_t sequence) = 0;
  // Byte offsets and counts of each peer's chunk (index = group rank), as checked by all_to_all().
  struct AllToAllLayout {
    std::vector<int64_t> send_offset, send_bytes, recv_offset, recv_bytes;
  };
  virtual void run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                              uint64_t sequence) = 0;
  virtual WorkPtr run_isend(const Tensor& tensor, int dst, int tag) = 0;
  virtual WorkPtr run_irecv(const Tensor& tensor, int src, int tag) = 0;
  // Gathers `bytes` from every rank into `out` (size() * bytes), uncounted: fingerprints, colors.
  virtual void exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) = 0;
  // Makes the sub-group of `members` (group ranks, sorted as the new order). Called by every rank of
  // this group with the same list and the same `child_index`; returns nullptr on non-members.
  virtual std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t child_index) = 0;

  // How many bytes this rank sent and received in the current call (backends call this).
  void account(CommOp op, int64_t bytes_sent, int64_t bytes_received) {
    ledger_.record_bytes(op, bytes_sent, bytes_received);
  }
  void account_link(CommOp op, double seconds) {
    if (seconds > 0) ledger_.record_link(op, seconds);
  }

  void shutdown_worker();  // backends' destructors call it before their state goes

 private:
  // Numbers a collective and counts the call; a blocking one first waits for queued async ones.
  uint64_t begin_collective(CommOp op, bool blocking);
  void checked_all_to_all(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                          const std::vector<int64_t>& input_splits, bool uneven);
  void check_split_sizes(const AllToAllLayout& layout, uint64_t sequence);  // debug mode, uneven all_to_all
  // The hooks see it first, then debug mode compares it on every rank. `reduced`: a reduction's input.
  void check_fingerprint(Fingerprint fingerprint, const Tensor& reduced = Tensor());
  WorkPtr enqueue(std::function<void()> job);
  void drain_async();  // waits until every queued collective has run
  void worker_loop();

  int rank_;
  int size_;
  GroupOptions options_;
  CommLedger ledger_;
  uint64_t next_sequence_ = 0;
  uint64_t next_child_ = 0;

  // The async worker: one thread per group handle, started on first use.
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  bool worker_busy_ = false;
  std::thread worker_;

  std::mutex observer_mutex_;  // set by the test's thread, read by the worker
  CollectiveObserver observer_;
  ReductionFault reduction_fault_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace sl::parallel
