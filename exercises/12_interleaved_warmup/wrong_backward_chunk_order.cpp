// exercises/12_interleaved_warmup/wrong_backward_chunk_order.cpp — a wrong solution: backward chunks not reversed.
//
// A common mistake: the k-th backward computed exactly like the k-th forward. A micro-batch's gradient
// comes back through the chunks in reverse: rank r's last local chunk (v-1) is the first to receive it,
// and its chunk 0 the last. The k-th backward's local chunk is v-1-c.
// expect: backwards walk the chunks in reverse (local chunk v-1-c)
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
  const int local = in_group / stages;  // for a backward too: should be v - 1 - in_group / p
  const int micro = group * stages + in_group % stages;
  return {forward ? Kind::forward : Kind::backward, micro, local * stages + rank};
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
