// exercises/05_ring_collectives/wrong_gather_own_chunk.cpp — a wrong solution: the all-gather resends its own chunk.
//
// A common mistake: every step of the all-gather sends the rank's own input to the right. At world 2
// that is right (one step), so a quick test passes; from world 3 on, step k must pass on the slot that
// came in at step k-1, or the slots further round the ring receive the left neighbour's chunk again.
// expect: receive slot r-k-1 at step k, and send the slot you received the step before
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise05 {

double predicted_reduce_scatter_bytes() { return (8.0 - 1) / 8 * 4 * 1200; }

void ring_reduce_scatter(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  throw exercises::NotImplemented("ring_reduce_scatter");
}

void ring_all_gather(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  const int n = group.size(), r = group.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t c = input.numel();
  auto slot = [&](int j) { return output.flat_view(((j % n) + n) % n * c, sl::Shape({c})); };
  slot(r).copy_(input);
  for (int k = 0; k < n - 1; ++k) {
    sl::parallel::WorkPtr sending = group.isend(input, right, k);  // should be slot(r - k)
    group.recv(slot(r - k - 1), left, k);
    sending->wait();
  }
}

}  // namespace exercise05
