// exercises/projects/02_allreduce_algorithm/wrong_chunks_round_down.cpp — a direct all-reduce whose chunks round down.
//
// A common mistake: cutting the tensor into n chunks of numel / n elements. The algorithm (each rank
// sums one chunk from everyone, then sends its sum to everyone: 2 latencies, 2(n-1)/n·S bytes) is
// sound, and every test with numel a multiple of n passes. But integer division drops the last
// numel % n elements, which stay this rank's own values, and when numel < n every chunk is empty and
// nothing is summed at all. Chunk r is [r·numel/n, (r+1)·numel/n) with the products taken first.
// expect: chunks of numel / n rounded down leave out the last numel % n elements
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace project02 {

void my_all_reduce(sl::parallel::ProcessGroup& group, const sl::Tensor& tensor) {
  const int n = group.size(), me = group.rank();
  const int64_t chunk = tensor.numel() / n;  // the mistake: numel % n elements are in no chunk
  auto part = [&](int r) { return tensor.flat_view(r * chunk, sl::Shape({chunk})); };
  // Reduce-scatter: chunk r goes to rank r, which adds the n-1 copies it receives into its own.
  std::vector<sl::parallel::WorkPtr> sends;
  for (int r = 0; r < n; ++r)
    if (r != me) sends.push_back(group.isend(part(r), r, /*tag=*/0));
  const sl::Tensor incoming = sl::zeros({chunk});
  for (int r = 0; r < n; ++r)
    if (r != me) {
      group.recv(incoming, r, 0);
      part(me).add_(incoming);
    }
  for (const auto& work : sends) work->wait();
  // All-gather: my summed chunk to everyone; theirs into their places.
  sends.clear();
  for (int r = 0; r < n; ++r)
    if (r != me) sends.push_back(group.isend(part(me), r, /*tag=*/1));
  for (int r = 0; r < n; ++r)
    if (r != me) group.recv(part(r), r, 1);
  for (const auto& work : sends) work->wait();
}

}  // namespace project02
