// exercises/05_ring_collectives/wrong_lesson_indices.cpp — a wrong solution: lesson 05's indices kept.
//
// A common mistake: lesson 05's reduce-scatter copied as it is (send chunk r-k, receive chunk r-k-1),
// and the chunk finished last handed out. The sums are right, but that chunk is r+1: lesson 05 goes on
// with an all-gather, which does not care, while reduce_scatter's contract (ZeRO's, FSDP's) is that
// rank r holds chunk r. Every index must be shifted by one.
// expect: shift your ring indices (off by 1)
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
  int last = r;
  for (int k = 0; k < n - 1; ++k) {
    sl::parallel::WorkPtr sending = group.isend(chunk(r - k), right, k);
    group.recv(incoming, left, k);
    chunk(r - k - 1).add_(incoming);
    last = r - k - 1;
    sending->wait();
  }
  output.copy_(chunk(last));  // the finished chunk: r+1, not r
}

void ring_all_gather(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  throw exercises::NotImplemented("ring_all_gather");
}

}  // namespace exercise05
