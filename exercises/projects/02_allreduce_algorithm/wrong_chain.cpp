// exercises/projects/02_allreduce_algorithm/wrong_chain.cpp — reduce and broadcast along a chain of ranks.
//
// A common mistake: "reduce to one rank, broadcast back" written as a chain: rank r receives the
// running sum from r-1, adds its own and passes it to r+1; the last rank sends the total back down
// the same way. The sums are exact, but every hop waits for the one before it: 2(n-1) latencies on
// the critical path, as many as the ring, for n times the ring's bytes on the busiest link. A tree
// (rank r talks to r ± 2^k) shortens the path to about 2·log2(n) hops.
// expect: a chain of messages pays one latency per hop
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace project02 {

void my_all_reduce(sl::parallel::ProcessGroup& group, const sl::Tensor& tensor) {
  const int n = group.size(), me = group.rank();
  if (n == 1) return;
  // Reduce up the chain: 0 -> 1 -> ... -> n-1, each adding its own tensor.
  if (me > 0) {
    const sl::Tensor partial = sl::zeros({tensor.numel()});
    group.recv(partial, me - 1, /*tag=*/0);
    tensor.add_(partial.reshape(tensor.shape()));
  }
  if (me < n - 1) group.isend(tensor, me + 1, 0)->wait();
  // Broadcast down the chain: n-1 -> n-2 -> ... -> 0 (the mistake: one hop at a time, n-1 of them).
  if (me < n - 1) group.recv(tensor, me + 1, /*tag=*/1);
  if (me > 0) group.isend(tensor, me - 1, 1)->wait();
}

}  // namespace project02
