// process_group.cpp — what every backend shares: argument checks, the ledger, sequence numbers,
// debug fingerprints and the async worker. The bytes themselves move in the backends.
#include "parallel/comm/process_group.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "parallel/comm/errors.h"
#include "tensor/device.h"

namespace sl::parallel {

static Fingerprint make_fingerprint(CommOp op, uint64_t sequence, const Tensor& input, int root, int reduce) {
  Fingerprint f;
  f.op = op;
  f.sequence = sequence;
  f.root = root;
  f.reduce = reduce;
  if (input.defined()) {
    f.dtype = input.dtype();
    f.ndim = input.dim();
    for (int d = 0; d < std::min(input.dim(), 8); ++d) f.shape[d] = input.shape()[d];
  }
  return f;
}

// ---- the group -----------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(int rank, int size, GroupOptions options) : rank_(rank), size_(size), options_(options) {
  SL_ASSERT(size >= 1 && rank >= 0 && rank < size);
}

ProcessGroup::~ProcessGroup() { shutdown_worker(); }

uint64_t ProcessGroup::begin_collective(CommOp op, bool blocking) {
  // A blocking collective runs after every async one issued before it: all ranks then execute
  // collectives in the same (issue) order, which is what matches them up.
  if (blocking) drain_async();
  ledger_.record_call(op);
  return next_sequence_++;
}

// Adds the time from construction to destruction to a ledger's wait time (the caller is blocked).
class BlockedTimer {
 public:
  explicit BlockedTimer(CommLedger& ledger) : ledger_(ledger), start_(std::chrono::steady_clock::now()) {}
  ~BlockedTimer() { ledger_.record_wait(std::chrono::steady_clock::now() - start_); }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  CommLedger& ledger_;
  std::chrono::steady_clock::time_point start_;
};

// A Work whose wait() is timed into the group's ledger. The group must outlive its works' waits
// (it does: a group drains its work before it is destroyed).
class TimedWork : public Work {
 public:
  TimedWork(WorkPtr inner, CommLedger& ledger) : inner_(std::move(inner)), ledger_(ledger) {}
  void wait() override {
    BlockedTimer timer(ledger_);
    inner_->wait();
  }
  bool is_completed() override { return inner_->is_completed(); }
  void wait_in_background() override { inner_->wait(); }

 private:
  WorkPtr inner_;
  CommLedger& ledger_;
};

// split()'s exchange is told apart from a fingerprint exchange by a high bit of the sequence number.
static constexpr uint64_t kSplitExchange = 1ull << 38;

void ProcessGroup::set_collective_observer(CollectiveObserver observer) {
  std::lock_guard lock(observer_mutex_);
  observer_ = std::move(observer);
}

// Every collective passes here just before it moves bytes, on the thread that runs it: the test
// observer sees it first (and may throw, as a failing rank would), then debug mode compares it.
void ProcessGroup::check_fingerprint(Fingerprint mine) {
  CollectiveObserver observer;
  {
    std::lock_guard lock(observer_mutex_);
    observer = observer_;
  }
  if (observer) observer(mine);
  if (!options_.debug_collectives || size_ == 1) return;
  std::vector<Fingerprint> all(size_);
  // The exchange is itself the first step of every collective in debug mode, so it always pairs up,
  // even when the collectives that follow it would not.
  exchange(&mine, all.data(), sizeof(Fingerprint), mine.sequence);
  int differing = -1;
  for (int r = 0; r < size_ && differing < 0; ++r)
    if (!(all[r] == mine)) differing = r;
  if (differing >= 0) {
    int r = differing;
    throw CollectiveMismatch("collective mismatch (" + backend_name() + " group of " + std::to_string(size_) +
                             "): rank " + std::to_string(rank_) + " called " + mine.str() + " but rank " +
                             std::to_string(r) + " called " + all[r].str() + " (" + mine.difference(all[r]) + ")");
  }
}

void ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  BlockedTimer blocked(ledger_);
  SL_CHECK(tensor.defined(), "all_reduce: the tensor is undefined");
  SL_CHECK(op != ReduceOp::avg || is_floating(tensor.dtype()), "all_reduce: avg needs a floating dtype, got ",
           dtype_name(tensor.dtype()));
  uint64_t seq = begin_collective(CommOp::all_reduce, true);
  check_fingerprint(make_fingerprint(CommOp::all_reduce, seq, tensor, -1, static_cast<int>(op)));
  run_all_reduce(tensor, op, seq);
}

static void check_gather_sizes(const char* op, const Tensor& big, const Tensor& small, int size,
                               const char* big_name, const char* small_name) {
  SL_CHECK(big.defined() && small.defined(), op, ": undefined tensor");
  SL_CHECK(big.dtype() == small.dtype(), op, ": ", big_name, " dtype ", dtype_name(big.dtype()), " != ", small_name,
           " dtype ", dtype_name(small.dtype()));
  SL_CHECK(big.numel() == size * small.numel(), op, ": ", big_name, " ", big.shape(), " has ", big.numel(),
           " elements but must hold group size ", size, " x ", small_name, " ", small.shape(), " = ",
           size * small.numel());
}

void ProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  BlockedTimer blocked(ledger_);
  check_gather_sizes("all_gather", output, input, size_, "output", "input");
  uint64_t seq = begin_collective(CommOp::all_gather, true);
  check_fingerprint(make_fingerprint(CommOp::all_gather, seq, input, -1, -1));
  run_all_gather(output, input, seq);
}

void ProcessGroup::all_gather(const std::vector<Tensor>& outputs, const Tensor& input) {
  SL_CHECK(static_cast<int>(outputs.size()) == size_, "all_gather: got ", outputs.size(),
           " output tensors for a group of ", size_);
  for (const Tensor& out : outputs) check_gather_sizes("all_gather", out, input, 1, "each output", "input");
  // Gather into one buffer, then hand out the pieces (one copy more than the single-tensor form).
  Tensor gathered = Tensor::empty(Shape({size_ * input.numel()}), input.options());
  all_gather(gathered, input);
  for (int r = 0; r < size_; ++r) outputs[r].copy_(gathered.flat_view(r * input.numel(), outputs[r].shape()));
}

void ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  BlockedTimer blocked(ledger_);
  check_gather_sizes("reduce_scatter", input, output, size_, "input", "output");
  SL_CHECK(op != ReduceOp::avg || is_floating(input.dtype()), "reduce_scatter: avg needs a floating dtype, got ",
           dtype_name(input.dtype()));
  uint64_t seq = begin_collective(CommOp::reduce_scatter, true);
  check_fingerprint(make_fingerprint(CommOp::reduce_scatter, seq, input, -1, static_cast<int>(op)));
  run_reduce_scatter(output, input, op, seq);
}

void ProcessGroup::broadcast(const Tensor& tensor, int root) {
  BlockedTimer blocked(ledger_);
  SL_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  SL_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this group of ", size_);
  uint64_t seq = begin_collective(CommOp::broadcast, true);
  check_fingerprint(make_fingerprint(CommOp::broadcast, seq, tensor, root, -1));
  run_broadcast(tensor, root, seq);
}

void ProcessGroup::barrier() {
  BlockedTimer blocked(ledger_);
  uint64_t seq = begin_collective(CommOp::barrier, true);
  check_fingerprint(make_fingerprint(CommOp::barrier, seq, Tensor(), -1, -1));
  run_barrier(seq);
}

// ---- async collectives: one worker thread per group handle ---------------------------------------

struct ProcessGroup::Job {
  std::function<void()> run;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {
class QueuedWork : public Work {
 public:
  explicit QueuedWork(std::shared_ptr<ProcessGroup::Job> job) : job_(std::move(job)) {}
  void wait() override;
  bool is_completed() override;

 private:
  std::shared_ptr<ProcessGroup::Job> job_;
};
}  // namespace

void QueuedWork::wait() {
  std::unique_lock lock(job_->mutex);
  // Bounded: the job itself ends by the group's timeout or by an abort of the world.
  job_->done_cv.wait(lock, [&] { return job_->done; });
  if (job_->error) std::rethrow_exception(job_->error);
}

bool QueuedWork::is_completed() {
  std::lock_guard lock(job_->mutex);
  return job_->done;
}

WorkPtr ProcessGroup::enqueue(std::function<void()> run) {
  auto job = std::make_shared<Job>();
  // The worker allocates (scratch buffers) on this rank's device, not on its own thread's default.
  Device device = current_device();
  job->run = [device, run = std::move(run)] {
    DeviceGuard guard(device);
    run();
  };
  {
    std::lock_guard lock(queue_mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    queue_.push_back(job);
  }
  queue_cv_.notify_all();
  return std::make_shared<TimedWork>(std::make_shared<QueuedWork>(job), ledger_);
}

void ProcessGroup::worker_loop() {
  std::unique_lock lock(queue_mutex_);
  while (true) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    worker_busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job->run();
    } catch (const RemoteError&) {
      error = std::current_exception();  // the world is aborted already: someone else failed
    } catch (const CollectiveMismatch& e) {
      error = std::current_exception();
      abort_world(e.what(), /*mismatch=*/true);
    } catch (...) {
      // This rank failed here. Abort the world now: peers blocked on this collective (or on later
      // ones) must not wait until this rank's main thread waits on the Work and rethrows.
      error = std::current_exception();
      abort_world(describe_exception(error));
    }
    // Drop the tensors the job captured: a Work kept by its caller must not keep them alive (ZeRO-2
    // frees a bucket's gradients by letting go of them once its reduce-scatter is done).
    job->run = nullptr;
    {
      std::lock_guard job_lock(job->mutex);
      job->done = true;
      job->error = error;
    }
    job->done_cv.notify_all();
    lock.lock();
    worker_busy_ = false;
    queue_cv_.notify_all();
  }
}

void ProcessGroup::drain_async() {
  std::unique_lock lock(queue_mutex_);
  queue_cv_.wait(lock, [&] { return queue_.empty() && !worker_busy_; });
}

void ProcessGroup::shutdown_worker() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

WorkPtr ProcessGroup::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  SL_CHECK(tensor.defined(), "all_reduce_async: the tensor is undefined");
  SL_CHECK(op != ReduceOp::avg || is_floating(tensor.dtype()), "all_reduce_async: avg needs a floating dtype, got ",
           dtype_name(tensor.dtype()));
  uint64_t seq = begin_collective(CommOp::all_reduce, false);
  return enqueue([this, tensor, op, seq] {
    check_fingerprint(make_fingerprint(CommOp::all_reduce, seq, tensor, -1, static_cast<int>(op)));
    run_all_reduce(tensor, op, seq);
  });
}

WorkPtr ProcessGroup::all_gather_async(const Tensor& output, const Tensor& input) {
  check_gather_sizes("all_gather_async", output, input, size_, "output", "input");
  uint64_t seq = begin_collective(CommOp::all_gather, false);
  return enqueue([this, output, input, seq] {
    check_fingerprint(make_fingerprint(CommOp::all_gather, seq, input, -1, -1));
    run_all_gather(output, input, seq);
  });
}

WorkPtr ProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_gather_sizes("reduce_scatter_async", input, output, size_, "input", "output");
  SL_CHECK(op != ReduceOp::avg || is_floating(input.dtype()), "reduce_scatter_async: avg needs a floating dtype");
  uint64_t seq = begin_collective(CommOp::reduce_scatter, false);
  return enqueue([this, output, input, op, seq] {
    check_fingerprint(make_fingerprint(CommOp::reduce_scatter, seq, input, -1, static_cast<int>(op)));
    run_reduce_scatter(output, input, op, seq);
  });
}

// ---- point to point ------------------------------------------------------------------------------

static void check_peer(const char* op, int peer, int rank, int size, int tag) {
  SL_CHECK(peer >= 0 && peer < size, op, ": peer rank ", peer, " is not in this group of ", size);
  SL_CHECK(peer != rank, op, ": rank ", rank, " cannot talk to itself");
  SL_CHECK(tag >= 0, op, ": tag must be >= 0 (got ", tag, ")");
}

void ProcessGroup::send(const Tensor& tensor, int dst, int tag) { isend(tensor, dst, tag)->wait(); }
void ProcessGroup::recv(const Tensor& tensor, int src, int tag) { irecv(tensor, src, tag)->wait(); }

WorkPtr ProcessGroup::isend(const Tensor& tensor, int dst, int tag) {
  SL_CHECK(tensor.defined(), "send: the tensor is undefined");
  check_peer("send", dst, rank_, size_, tag);
  ledger_.record_call(CommOp::send);
  return std::make_shared<TimedWork>(run_isend(tensor, dst, tag), ledger_);
}

WorkPtr ProcessGroup::irecv(const Tensor& tensor, int src, int tag) {
  SL_CHECK(tensor.defined(), "recv: the tensor is undefined");
  check_peer("recv", src, rank_, size_, tag);
  ledger_.record_call(CommOp::recv);
  return std::make_shared<TimedWork>(run_irecv(tensor, src, tag), ledger_);
}

std::vector<WorkPtr> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  std::vector<WorkPtr> works;
  works.reserve(ops.size());
  for (const P2POp& op : ops)
    works.push_back(op.kind == P2POp::Kind::send ? isend(op.tensor, op.peer, op.tag) : irecv(op.tensor, op.peer, op.tag));
  return works;
}

// ---- sub-groups ----------------------------------------------------------------------------------

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  SL_CHECK(!ranks.empty(), "new_group: the rank list is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    SL_CHECK(sorted[i] >= 0 && sorted[i] < size_, "new_group: rank ", sorted[i], " is not in this group of ", size_);
    SL_CHECK(i == 0 || sorted[i] != sorted[i - 1], "new_group: rank ", sorted[i], " is listed twice");
  }
  drain_async();
  return make_subgroup(sorted, next_child_++);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  drain_async();
  // Everyone learns everyone's (color, key); members of a color are ordered by (key, rank).
  struct Entry {
    int32_t color, key;
  } mine{color, key < 0 ? rank_ : key};
  std::vector<Entry> all(size_);
  exchange(&mine, all.data(), sizeof(Entry), next_sequence_ | kSplitExchange);
  uint64_t child = next_child_++;
  if (color < 0) return make_subgroup({}, child);  // still called: a backend may need every rank
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (all[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
  return make_subgroup(members, child);
}

}  // namespace sl::parallel
