// threads_backend.cpp — the ring algorithms, written out (see threads_backend.h for the picture).
//
//   A tensor of S bytes is cut into n chunks (the first S mod n elements spread one per chunk).
//   Every step is the same exchange: post my chunk to the right neighbour, take the left
//   neighbour's chunk and copy or reduce it into mine, wait until the right one has taken mine.
//
//   op              steps     bytes each rank sends (and receives)
//   all_reduce      2(n-1)    2(n-1)/n · S
//   all_gather      n-1       (n-1)/n · S_total   (S_total = n × input)
//   reduce_scatter  n-1       (n-1)/n · S_total   (S_total = n × output)
//   broadcast       chain     S (the root only sends, the last rank only receives), pipelined in segments
#include "parallel/comm/backends/threads_backend.h"

#include <algorithm>
#include <cstring>

#include "parallel/comm/errors.h"
#include "parallel/comm/reduce_kernels.h"
#include "tensor/ledger.h"

namespace sl::parallel {

using Clock = std::chrono::steady_clock;

static constexpr CommOp kExchangeOp = static_cast<CommOp>(0x7f);

ThreadsProcessGroup::ThreadsProcessGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> members, int rank,
                                         uint64_t context, GroupOptions options)
    : ProcessGroup(rank, static_cast<int>(members.size()), options),
      world_(std::move(world)),
      members_(std::move(members)),
      context_(context),
      pending_receives_(make_pending_receives(members_.size())) {}

ThreadsProcessGroup::~ThreadsProcessGroup() { shutdown_worker(); }

void ThreadsProcessGroup::ring_step(const Step& step) {
  const int to = step.to >= 0 ? members_[step.to] : right(), from = step.from >= 0 ? members_[step.from] : left();
  ThreadWorld::Envelope out{context_, step.tag, world_rank(), step.send_data, step.send_bytes};
  world_->post(to, &out);
  try {
    ThreadWorld::Envelope* in = world_->take(world_rank(), from, context_, step.tag, step.why, step.deadline);
    if (in->bytes != step.recv_bytes) {
      int64_t got = in->bytes;
      world_->release(world_rank(), in);
      throw CollectiveMismatch(std::string(step.why.op) + " #" + std::to_string(step.why.sequence) + " on rank " +
                               std::to_string(world_rank()) + ": rank " + std::to_string(from) + " sent " +
                               std::to_string(got) + " bytes where " + std::to_string(step.recv_bytes) +
                               " were expected (do all ranks pass the same shapes?)");
    }
    if (step.counted) account_link(step.account_as, in->link_s);
    if (step.recv_lhs == nullptr) {
      if (step.recv_bytes > 0) std::memcpy(step.recv_dst, in->data, step.recv_bytes);
    } else {
      reduce_buffers(step.dtype, step.op, step.recv_dst, step.recv_lhs, in->data,
                     step.recv_bytes / static_cast<int64_t>(dtype_size(step.dtype)));
    }
    world_->release(world_rank(), in);
  } catch (...) {
    world_->retract(to, &out);
    throw;
  }
  world_->wait_consumed(to, &out, step.why, step.deadline);
  if (step.counted) account(step.account_as, step.send_bytes, step.recv_bytes);
}

namespace {
// Element ranges of the n chunks of a buffer of `count` elements.
struct Chunks {
  int64_t count;
  int n;
  int64_t begin(int i) const { return i * (count / n) + std::min<int64_t>(i, count % n); }
  int64_t size(int i) const { return count / n + (i < count % n ? 1 : 0); }
};
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

// Large tensors go round the ring one segment at a time (each rank's chunk of a segment is
// kSegmentChunkBytes): a chunk that a rank has just reduced is still in cache when its neighbour
// copies it in the all-gather half, instead of coming back from DRAM. Same bytes, same ledger.
static constexpr int64_t kSegmentChunkBytes = int64_t{1} << 20;

void ThreadsProcessGroup::all_reduce_on_host(const Tensor& tensor, ReduceOp op, uint64_t sequence) {
  const int n = size(), r = rank();
  if (n == 1) return;  // sum, avg, max and min of one value
  const int64_t es = static_cast<int64_t>(dtype_size(tensor.dtype()));
  const int64_t count = tensor.numel();
  // A multiple of n elements, so that S divisible by n gives equal chunks in every segment; the
  // step field of the tags (16 bits) bounds the number of segments.
  const int64_t max_segments = std::max<int64_t>(1, 65536 / (2 * n));
  int64_t segment = std::max<int64_t>(n * (kSegmentChunkBytes / es), (count + max_segments - 1) / max_segments);
  segment = (segment + n - 1) / n * n;
  WaitContext why{"all_reduce", sequence, world_rank()};
  Clock::time_point deadline = Clock::now() + options().timeout;
  for (int64_t first = 0, s = 0; first < count || s == 0; first += segment, ++s) {
    auto* base = static_cast<std::byte*>(tensor.raw_data()) + first * es;
    Chunks chunks{std::min(segment, count - first), n};
    auto at = [&](int i) { return base + chunks.begin(i) * es; };
    auto bytes = [&](int i) { return static_cast<int64_t>(chunks.size(i) * es); };
    const uint64_t step0 = static_cast<uint64_t>(s) * 2 * n;
    // Reduce-scatter: after n-1 steps rank r holds the full reduction of chunk r+1.
    for (int k = 0; k < n - 1; ++k) {
      int send = mod(r - k, n), recv = mod(r - k - 1, n);
      ring_step({at(send), bytes(send), at(recv), bytes(recv), at(recv), tensor.dtype(), op,
                 collective_tag(CommOp::all_reduce, sequence, step0 + k), CommOp::all_reduce, why, deadline});
    }
    int mine = mod(r + 1, n);
    if (op == ReduceOp::avg) scale_buffer(tensor.dtype(), at(mine), chunks.size(mine), 1.0 / n);
    // All-gather: pass the finished chunks around the ring.
    for (int k = 0; k < n - 1; ++k) {
      int send = mod(r + 1 - k, n), recv = mod(r - k, n);
      ring_step({at(send), bytes(send), at(recv), bytes(recv), nullptr, tensor.dtype(), op,
                 collective_tag(CommOp::all_reduce, sequence, step0 + n + k), CommOp::all_reduce, why, deadline});
    }
  }
}

void ThreadsProcessGroup::ring_all_gather_bytes(void* output, int64_t bytes_per_rank, uint64_t tag_base,
                                                const WaitContext& why, Clock::time_point deadline) {
  const int n = size(), r = rank();
  auto* base = static_cast<std::byte*>(output);
  bool counted = static_cast<CommOp>((tag_base >> 56) & 0x7f) == CommOp::all_gather;
  for (int k = 0; k < n - 1; ++k) {
    int send = mod(r - k, n), recv = mod(r - k - 1, n);
    ring_step({base + send * bytes_per_rank, bytes_per_rank, base + recv * bytes_per_rank, bytes_per_rank, nullptr,
               DType::f32, ReduceOp::sum, tag_base | static_cast<uint64_t>(k), CommOp::all_gather, why, deadline,
               counted});
  }
}

void ThreadsProcessGroup::all_gather_on_host(const Tensor& output, const Tensor& input, uint64_t sequence) {
  const int64_t chunk = input.nbytes();
  auto* out = static_cast<std::byte*>(output.raw_data());
  if (chunk > 0) std::memcpy(out + rank() * chunk, input.raw_data(), chunk);
  if (size() == 1) return;
  ring_all_gather_bytes(out, chunk, collective_tag(CommOp::all_gather, sequence, 0),
                        {"all_gather", sequence, world_rank()}, Clock::now() + options().timeout);
}

void ThreadsProcessGroup::exchange(const void* mine, void* out, size_t bytes, uint64_t sequence) {
  std::memcpy(static_cast<std::byte*>(out) + rank() * bytes, mine, bytes);
  if (size() == 1) return;
  ring_all_gather_bytes(out, static_cast<int64_t>(bytes), collective_tag(kExchangeOp, sequence, 0),
                        {"fingerprint exchange", sequence, world_rank()}, Clock::now() + options().timeout);
}

void ThreadsProcessGroup::reduce_scatter_on_host(const Tensor& output, const Tensor& input, ReduceOp op,
                                             uint64_t sequence) {
  const int n = size(), r = rank();
  const int64_t chunk = output.nbytes();
  const auto* in = static_cast<const std::byte*>(input.raw_data());
  auto* out = static_cast<std::byte*>(output.raw_data());
  if (n == 1) {
    if (chunk > 0 && out != in) std::memcpy(out, in, chunk);  // in place (out is chunk 0 of in): nothing to do
    return;
  }
  // Partial sums travel around the ring in two scratch buffers (one being read by the right
  // neighbour while the next is written); the last step lands in `output`, which ends as chunk r.
  MemoryScope scope(MemoryCategory::comm);
  Tensor scratch = Tensor::empty(Shape({2 * output.numel()}), output.options());
  auto* partial = static_cast<std::byte*>(scratch.raw_data());
  WaitContext why{"reduce_scatter", sequence, world_rank()};
  Clock::time_point deadline = Clock::now() + options().timeout;
  for (int k = 0; k < n - 1; ++k) {
    const std::byte* send = k == 0 ? in + mod(r - 1, n) * chunk : partial + ((k - 1) % 2) * chunk;
    std::byte* dst = k == n - 2 ? out : partial + (k % 2) * chunk;
    const std::byte* lhs = in + mod(r - k - 2, n) * chunk;
    ring_step({send, chunk, dst, chunk, lhs, input.dtype(), op, collective_tag(CommOp::reduce_scatter, sequence, k),
               CommOp::reduce_scatter, why, deadline});
  }
  if (op == ReduceOp::avg) scale_buffer(output.dtype(), out, output.numel(), 1.0 / n);
}

void ThreadsProcessGroup::broadcast_on_host(const Tensor& tensor, int root, uint64_t sequence) {
  const int n = size();
  if (n == 1) return;
  // A chain from the root: position 0 is the root, position n-1 the last rank. Segments pipeline
  // the chain: while rank p forwards segment s, rank p-1 is already sending it segment s+1.
  const int position = mod(rank() - root, n);
  const int64_t total = tensor.nbytes();
  const int64_t segment = std::max<int64_t>(int64_t{1} << 20, (total + 255) / 256);
  const int64_t segments = std::max<int64_t>(1, (total + segment - 1) / segment);
  WaitContext why{"broadcast", sequence, world_rank()};
  Clock::time_point deadline = Clock::now() + options().timeout;
  ThreadWorld::Envelope out;
  bool sending = false;
  try {
    // The size first, uncounted: another size fails at once (not as the root's timeout), naming both.
    int64_t announced = total;
    const uint64_t size_tag = collective_tag(CommOp::broadcast, sequence, 0xffff);
    if (position > 0) {
      ThreadWorld::Envelope* in = world_->take(world_rank(), left(), context_, size_tag, why, deadline);
      std::memcpy(&announced, in->data, sizeof(announced));
      world_->release(world_rank(), in);
      SL_CHECK(announced == total, "broadcast #", sequence, " on rank ", world_rank(), ": the root's tensor has ",
               announced, " bytes but this rank's ", total, " (same shapes on every rank?)");
    }
    if (position < n - 1) world_->post(right(), &(out = {context_, size_tag, world_rank(), &announced, 8}));
    sending = position < n - 1;
    for (int64_t s = 0; s < segments; ++s) {
      std::byte* seg = static_cast<std::byte*>(tensor.raw_data()) + s * segment;
      int64_t seg_bytes = std::min(segment, total - s * segment);
      uint64_t tag = collective_tag(CommOp::broadcast, sequence, static_cast<uint64_t>(s));
      if (position > 0) {
        ThreadWorld::Envelope* in = world_->take(world_rank(), left(), context_, tag, why, deadline);
        SL_CHECK(in->bytes == seg_bytes, "broadcast #", sequence, " on rank ", world_rank(), ": rank ", left(),
                 " sent ", in->bytes, " bytes where ", seg_bytes, " were expected (same shapes on every rank?)");
        if (seg_bytes > 0) std::memcpy(seg, in->data, seg_bytes);
        account_link(CommOp::broadcast, in->link_s);
        world_->release(world_rank(), in);
        account(CommOp::broadcast, 0, seg_bytes);
      }
      if (position < n - 1) {
        if (sending) world_->wait_consumed(right(), &out, why, deadline);
        world_->post(right(), &(out = {context_, tag, world_rank(), seg, seg_bytes}));
        sending = true;
        account(CommOp::broadcast, seg_bytes, 0);
      }
    }
    if (sending) world_->wait_consumed(right(), &out, why, deadline);
  } catch (...) {
    if (sending) world_->retract(right(), &out);
    throw;
  }
}

void ThreadsProcessGroup::run_barrier(uint64_t sequence) {
  const int n = size();
  if (n == 1) return;
  // A zero-byte token goes round the ring twice: after the first lap rank 0 knows that everyone
  // has arrived, the second lap tells everyone else.
  WaitContext why{"barrier", sequence, world_rank()};
  Clock::time_point deadline = Clock::now() + options().timeout;
  for (int lap = 0; lap < 2; ++lap) {
    uint64_t tag = collective_tag(CommOp::barrier, sequence, lap);
    ThreadWorld::Envelope token{context_, tag, world_rank(), nullptr, 0};
    auto pass_on = [&] {
      world_->post(right(), &token);
      world_->wait_consumed(right(), &token, why, deadline);
    };
    auto wait_for_token = [&] {
      ThreadWorld::Envelope* in = world_->take(world_rank(), left(), context_, tag, why, deadline);
      account_link(CommOp::barrier, in->link_s);
      world_->release(world_rank(), in);
    };
    if (rank() == 0) pass_on(), wait_for_token();  // rank 0 starts the lap, everyone else joins it
    else wait_for_token(), pass_on();
  }
}

// ---- sub-groups ----------------------------------------------------------------------------------
std::shared_ptr<ProcessGroup> ThreadsProcessGroup::make_subgroup(const std::vector<int>& members,
                                                                 uint64_t child_index) {
  auto me = std::find(members.begin(), members.end(), rank());
  if (me == members.end()) return nullptr;
  // Every member derives the same context id from the parent's, the child index and the members
  // (split() makes several groups with one child index, one per color).
  uint64_t context = context_ * 0x9E3779B97F4A7C15ull + child_index + 1;
  std::vector<int> world_members;
  for (int m : members) {
    world_members.push_back(members_[m]);
    context = (context ^ static_cast<uint64_t>(members_[m] + 1)) * 0x100000001B3ull;
  }
  return std::make_shared<ThreadsProcessGroup>(world_, world_members, static_cast<int>(me - members.begin()), context,
                                               options());
}

}  // namespace sl::parallel
