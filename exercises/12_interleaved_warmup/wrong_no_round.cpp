// exercises/12_interleaved_warmup/wrong_no_round.cpp — a wrong solution: the warm-up without (v-1)·p.
//
// A common mistake: 1F1B's fill, doubled, 2(p-r-1), and nothing for the chunks. But rank r's first
// backward needs micro-batch 0 to have run through ALL v·p chunks and come back: before it can arrive,
// rank r runs a whole round of its other v-1 chunks, (v-1)·p more forwards. Too short a warm-up puts a
// backward where its gradient cannot have come back yet.
// expect: the (v-1)·p term is missing (a whole round of the other chunks)
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise12 {

using Kind = sl::parallel::Action::Kind;

int interleaved_warmup(int stages, int micro_batches, int virtual_stages, int rank) {
  return std::min(2 * (stages - rank - 1), micro_batches * virtual_stages);  // 1F1B's fill doubled, no (v-1)·p
}

sl::parallel::Action interleaved_kth_action(int k, int stages, int virtual_stages, int rank, bool forward) {
  const int group = k / (stages * virtual_stages), in_group = k % (stages * virtual_stages);
  const int local = forward ? in_group / stages : virtual_stages - 1 - in_group / stages;  // backwards: reversed
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
