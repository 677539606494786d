// exercises/05_ring_collectives/wrong_in_place.cpp — a wrong solution: the ring runs inside the caller's input.
//
// A common mistake: lesson 05's all-reduce works in place on its data, so the partial sums are added
// straight into input's chunks. The output comes out right, but the caller's input is now a mix of
// partial sums: DDP's or ZeRO's gradients, read again after the collective, are garbage. A reduce-scatter
// into a separate output works on a copy (input.clone()).
// expect: 's input changed: the ring adds into a working copy (input.clone())
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise05 {

double predicted_reduce_scatter_bytes() { return (8.0 - 1) / 8 * 4 * 1200; }

void ring_reduce_scatter(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  const int n = group.size(), r = group.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t c = output.numel();
  const sl::Tensor& work = input;  // the caller's tensor, not a copy
  auto chunk = [&](int j) { return work.flat_view(((j % n) + n) % n * c, sl::Shape({c})); };
  sl::Tensor incoming = sl::zeros({c});
  for (int k = 0; k < n - 1; ++k) {
    sl::parallel::WorkPtr sending = group.isend(chunk(r - k - 1), right, k);
    group.recv(incoming, left, k);
    chunk(r - k - 2).add_(incoming);
    sending->wait();
  }
  output.copy_(chunk(r));
}

void ring_all_gather(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  throw exercises::NotImplemented("ring_all_gather");
}

}  // namespace exercise05
