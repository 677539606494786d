// threads_all_to_all.cpp — all-to-all on the threads backend: the pairwise exchange, written out.
//
//   Every rank has one chunk for every rank. In step k (k = 1 .. n-1) rank r sends its chunk for
//   rank r+k and receives rank r-k's chunk for it, so every pair meets exactly once and no rank
//   waits on two peers at a time (n = 4):
//
//     step 1   0→1 1→2 2→3 3→0        step 2   0→2 1→3 2→0 3→1        step 3   0→3 1→0 2→1 3→2
//
//   The chunk for itself is a local copy (step 0). Each rank sends Σ_{d≠r} its chunks, for equal
//   chunks (n-1)/n of its input, and every byte crosses one link once: all-to-all cannot do better,
//   unlike all-gather, where a ring beats sending everything to everyone.
#include <cstring>

#include "parallel/comm/backends/threads_backend.h"
#include "parallel/comm/errors.h"

namespace sl::parallel {

void ThreadsProcessGroup::all_to_all_on_host(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                                         uint64_t sequence) {
  const int n = size(), r = rank();
  const auto* in = static_cast<const std::byte*>(input.raw_data());
  auto* out = static_cast<std::byte*>(output.raw_data());
  // Its own chunk is a disagreement of split sizes like any other: a CollectiveMismatch (as on MPI).
  if (layout.send_bytes[r] != layout.recv_bytes[r])
    throw CollectiveMismatch("all_to_all #" + std::to_string(sequence) + " on rank " + std::to_string(world_rank()) +
                             ": this rank sends itself " + std::to_string(layout.send_bytes[r]) +
                             " bytes but expects " + std::to_string(layout.recv_bytes[r]) +
                             " from itself (input_splits[" + std::to_string(r) + "] != output_splits[" +
                             std::to_string(r) + "])");
  if (layout.send_bytes[r] > 0) std::memcpy(out + layout.recv_offset[r], in + layout.send_offset[r], layout.send_bytes[r]);
  WaitContext why{"all_to_all", sequence, world_rank()};
  const auto deadline = std::chrono::steady_clock::now() + options().timeout;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    Step step{in + layout.send_offset[to], layout.send_bytes[to], out + layout.recv_offset[from],
              layout.recv_bytes[from], nullptr, input.dtype(), ReduceOp::sum,
              collective_tag(CommOp::all_to_all, sequence, static_cast<uint64_t>(k)), CommOp::all_to_all, why,
              deadline};
    step.to = to;
    step.from = from;
    ring_step(step);
  }
}

}  // namespace sl::parallel
