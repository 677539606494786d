// exercises/12_interleaved_warmup/wrong_local_chunk.cpp — a wrong solution: the local chunk returned.
//
// A common mistake: the action carries the rank's LOCAL chunk index c (0..v-1). The pipeline names
// chunks globally: rank r holds r, r+p, ..., r+(v-1)p (round-robin), so a micro-batch passes chunk c·p + r
// of the model when it is on rank r's local chunk c. With the local index every rank would claim chunk 0
// and the messages would go to the wrong neighbours.
// expect: that is the local chunk (or r·v + c, chunks in contiguous blocks)
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise12 {

using Kind = sl::parallel::Action::Kind;

int interleaved_warmup(int stages, int micro_batches, int virtual_stages, int rank) {
  return std::min(2 * (stages - rank - 1) + (virtual_stages - 1) * stages, micro_batches * virtual_stages);
}

sl::parallel::Action interleaved_kth_action(int k, int stages, int virtual_stages, int rank, bool forward) {
  const int group = k / (stages * virtual_stages), in_group = k % (stages * virtual_stages);
  const int local = forward ? in_group / stages : virtual_stages - 1 - in_group / stages;  // backwards: reversed
  const int micro = group * stages + in_group % stages;
  return {forward ? Kind::forward : Kind::backward, micro, local};  // should be local * p + rank
}

std::vector<sl::parallel::Action> interleaved_order(int stages, int micro_batches, int virtual_stages, int rank) {
  const int total = micro_batches * virtual_stages,
            warmup = interleaved_warmup(stages, micro_batches, virtual_stages, rank);
  std::vector<sl::parallel::Action> order;
  for (int k = 0; k < warmup; ++k) order.push_back(interleaved_kth_action(k, stages, virtual_stages, rank, true));
  for (int k = 0; k < total - warmup; ++k) {  // steady: a forward, then the oldest backward
    order.push_back(interleaved_kth_action(warmup + k, stages, virtual_stages, rank, true));
    order.push_back(interleaved_kth_action(k, stages, virtual_stages, rank, false));
  }
  for (int k = std::max(total - warmup, 0); k < total; ++k)
    order.push_back(interleaved_kth_action(k, stages, virtual_stages, rank, false));
  return order;
}

}  // namespace exercise12
