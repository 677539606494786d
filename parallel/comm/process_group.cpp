// process_group.cpp — what every backend shares: argument checks, the ledger, sequence numbers,
// debug fingerprints, point to point and sub-groups (the async worker: process_group_async.cpp).
// The bytes themselves move in the backends.
#include "parallel/comm/process_group.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "parallel/comm/errors.h"
#include "parallel/comm/process_group_detail.h"
#include "tensor/device.h"

namespace sl::parallel {

using detail::check_gather_sizes;
using detail::make_fingerprint;
using detail::BlockedTimer;
using detail::TimedWork;


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


// split()'s exchange is told apart from a fingerprint exchange by a high bit of the sequence number.
static constexpr uint64_t kSplitExchange = 1ull << 38;

void ProcessGroup::set_collective_observer(CollectiveObserver observer) {
  std::lock_guard lock(observer_mutex_);
  observer_ = std::move(observer);
}

void ProcessGroup::set_reduction_fault(ReductionFault fault) {
  std::lock_guard lock(observer_mutex_);
  reduction_fault_ = std::move(fault);
}

// Every collective passes here just before it moves bytes, on the thread that runs it: the test
// observer sees it first (and may throw, as a failing rank would), a reduction fault may change a
// reduction's input, then debug mode compares it.
void ProcessGroup::check_fingerprint(Fingerprint mine, const Tensor& reduced) {
  CollectiveObserver observer;
  ReductionFault fault;
  {
    std::lock_guard lock(observer_mutex_);
    observer = observer_;
    if (reduced.defined()) fault = reduction_fault_;
  }
  if (observer) observer(mine);
  if (fault) fault(mine, reduced);
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
  check_fingerprint(make_fingerprint(CommOp::all_reduce, seq, tensor, -1, static_cast<int>(op)), tensor);
  run_all_reduce(tensor, op, seq);
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
  check_fingerprint(make_fingerprint(CommOp::reduce_scatter, seq, input, -1, static_cast<int>(op)), input);
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

// all_to_all: the splits are checked here, in rows of dim 0, and handed to the backend as bytes.
// Uneven splits may differ across ranks, so the fingerprint then carries the row shape only
// (dim 0 as -1); a rank that sends another count than its peer expects fails in the backend.
void ProcessGroup::all_to_all(const Tensor& output, const Tensor& input) {
  SL_CHECK(output.defined() && input.defined() && input.dim() >= 1, "all_to_all: tensors must be defined with a dim 0");
  SL_CHECK(input.size(0) % size_ == 0, "all_to_all: input ", input.shape(), " has ", input.size(0),
           " rows, which do not split equally over ", size_, " ranks (pass split sizes for uneven chunks)");
  SL_CHECK(output.shape() == input.shape(), "all_to_all: output ", output.shape(), " must have input's shape ",
           input.shape(), " when the chunks are equal");
  checked_all_to_all(output, input, std::vector<int64_t>(size_, output.size(0) / size_),
                     std::vector<int64_t>(size_, input.size(0) / size_), false);
}

static std::vector<int64_t> split_offsets(const char* what, const Tensor& t, const std::vector<int64_t>& splits,
                                          int size, int64_t row_bytes) {
  SL_CHECK(static_cast<int>(splits.size()) == size, "all_to_all: ", what, " splits list ", splits.size(),
           " sizes for a group of ", size);
  std::vector<int64_t> offsets(size);
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    SL_CHECK(splits[r] >= 0, "all_to_all: ", what, " split ", r, " is ", splits[r], " (must be >= 0)");
    offsets[r] = rows * row_bytes;
    rows += splits[r];
  }
  SL_CHECK(rows == t.size(0), "all_to_all: the ", what, " splits sum to ", rows, " rows but the ", what, " ",
           t.shape(), " has ", t.size(0));
  return offsets;
}

// Do the bytes of a and b overlap (the same tensor, or views of one storage)?
static bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0 || !(a.device() == b.device())) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr()), b0 = reinterpret_cast<uintptr_t>(b.data_ptr());
  return a0 < b0 + static_cast<uintptr_t>(b.nbytes()) && b0 < a0 + static_cast<uintptr_t>(a.nbytes());
}

void ProcessGroup::all_to_all(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits) {
  checked_all_to_all(output, input, output_splits, input_splits, true);
}

void ProcessGroup::checked_all_to_all(const Tensor& output, const Tensor& input,
                                      const std::vector<int64_t>& output_splits,
                                      const std::vector<int64_t>& input_splits, bool uneven) {
  BlockedTimer blocked(ledger_);
  SL_CHECK(output.defined() && input.defined() && input.dim() >= 1 && output.dim() == input.dim(),
           "all_to_all: output and input must be defined, with the same number of dims (got ",
           output.defined() ? output.shape() : Shape{}, " and ", input.defined() ? input.shape() : Shape{}, ")");
  SL_CHECK(output.dtype() == input.dtype(), "all_to_all: output dtype ", dtype_name(output.dtype()),
           " != input dtype ", dtype_name(input.dtype()));
  // In place cannot work: a rank would receive into rows it has yet to send (MPI and NCCL forbid it too).
  SL_CHECK(!overlap(output, input), "all_to_all: output ", output.shape(), " and input ", input.shape(),
           " overlap in memory (all_to_all cannot run in place: pass a separate output)");
  for (int d = 1; d < input.dim(); ++d)
    SL_CHECK(output.size(d) == input.size(d), "all_to_all: output ", output.shape(), " and input ", input.shape(),
             " must have rows of one shape (all dims but 0)");
  const int64_t row_bytes = input.size(0) > 0 ? input.nbytes() / input.size(0)
                                              : (output.size(0) > 0 ? output.nbytes() / output.size(0) : 0);
  AllToAllLayout layout;
  layout.send_offset = split_offsets("input", input, input_splits, size_, row_bytes);
  layout.recv_offset = split_offsets("output", output, output_splits, size_, row_bytes);
  for (int r = 0; r < size_; ++r) {
    layout.send_bytes.push_back(input_splits[r] * row_bytes);
    layout.recv_bytes.push_back(output_splits[r] * row_bytes);
  }
  uint64_t seq = begin_collective(CommOp::all_to_all, true);
  Fingerprint fingerprint = make_fingerprint(CommOp::all_to_all, seq, input, -1, -1);
  if (uneven) fingerprint.shape[0] = -1;
  check_fingerprint(fingerprint);
  if (uneven) check_split_sizes(layout, seq);
  run_all_to_all(output, input, layout, seq);
}

// Debug mode, uneven splits: the fingerprint cannot carry them, so every rank learns what every rank
// sends and expects (an uncounted exchange of 2n byte counts) and a pair that disagrees is named on
// every rank before a byte moves. NCCL has no other check (a receive of another size waits for the
// timeout, or takes a cut chunk); the threads and MPI backends also compare without debug mode, but
// there only the receiver can name the pair.
static constexpr uint64_t kSplitSizeExchange = 1ull << 37;

void ProcessGroup::check_split_sizes(const AllToAllLayout& layout, uint64_t sequence) {
  if (!options_.debug_collectives || size_ == 1) return;
  const int n = size_;
  std::vector<int64_t> mine = layout.send_bytes;
  mine.insert(mine.end(), layout.recv_bytes.begin(), layout.recv_bytes.end());
  std::vector<int64_t> all(static_cast<size_t>(2 * n * n));  // rank q: its send_bytes, then its recv_bytes
  exchange(mine.data(), all.data(), mine.size() * sizeof(int64_t), sequence | kSplitSizeExchange);
  for (int s = 0; s < n; ++s)
    for (int r = 0; r < n; ++r) {
      const int64_t sends = all[2 * n * s + r], expects = all[2 * n * r + n + s];
      if (sends == expects) continue;
      throw CollectiveMismatch("all_to_all #" + std::to_string(sequence) + " (" + backend_name() + " group of " +
                               std::to_string(n) + "): rank " + std::to_string(s) + " sends rank " +
                               std::to_string(r) + " " + std::to_string(sends) + " bytes but rank " +
                               std::to_string(r) + " expects " + std::to_string(expects) + " (input_splits[" +
                               std::to_string(r) + "] of rank " + std::to_string(s) + " != output_splits[" +
                               std::to_string(s) + "] of rank " + std::to_string(r) + ")");
    }
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
