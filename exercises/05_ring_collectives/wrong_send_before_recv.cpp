// exercises/05_ring_collectives/wrong_send_before_recv.cpp — a wrong solution: blocking sends.
//
// A common mistake: each step written as send(...) then recv(...). The indices are right, but a
// blocking send returns only once the receiver has taken the message, and every rank of the ring is
// inside its send, none inside a recv: all of them wait forever. isend first (it returns at once),
// then recv, then wait on the send.
// expect: a rank waited 4 s for a message that never came (a deadlock?)
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise05 {

double predicted_reduce_scatter_bytes() { return (8.0 - 1) / 8 * 4 * 1200; }

void ring_reduce_scatter(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  const int n = group.size(), r = group.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t c = output.numel();
  const sl::Tensor work = input.clone();
  auto chunk = [&](int j) { return work.flat_view(((j % n) + n) % n * c, sl::Shape({c})); };
  sl::Tensor incoming = sl::zeros({c});
  for (int k = 0; k < n - 1; ++k) {
    group.send(chunk(r - k - 1), right, k);  // blocks until the right neighbour receives: it never does
    group.recv(incoming, left, k);
    chunk(r - k - 2).add_(incoming);
  }
  output.copy_(chunk(r));
}

void ring_all_gather(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  throw exercises::NotImplemented("ring_all_gather");
}

}  // namespace exercise05
