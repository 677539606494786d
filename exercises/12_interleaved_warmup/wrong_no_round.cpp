// exercises/12_interleaved_warmup/wrong_no_round.cpp — a wrong solution: the peak without the (v-1)·p round.
//
// A common mistake: 1F1B's fill, doubled, 2(p-r-1), and nothing for the chunks. But rank r's first
// backward needs micro-batch 0 to have run through ALL v·p chunks and come back: before it can arrive,
// rank r runs a whole round of its other v-1 chunks, (v-1)·p more forwards, and holds them all.
// Interleaving shrinks the bubble but makes the first rank hold more, not less.
// expect: the (v-1)·p term is missing (a whole round of the other chunks
#include <algorithm>

#include "exercises/grader.h"

namespace exercise12 {

double predicted_rank0_peak_layers() {
  return 11;
}  // warm-up 2·3 + 4 = 10, plus the first steady forward; 1 layer a chunk

int forward_position(int micro, int chunk, int stages, int virtual_stages) {
  const int local = chunk / stages;  // rank chunk mod p holds chunks r, r+p, ...: local chunk c is global c·p + r;
  return (micro / stages) * stages * virtual_stages + local * stages + micro % stages;
}

int backward_position(int micro, int chunk, int stages, int virtual_stages) {
  const int local = virtual_stages - 1 - chunk / stages;  // the gradient comes back through the chunks in reverse;
  return (micro / stages) * stages * virtual_stages + local * stages + micro % stages;
}

int peak_in_flight(int stages, int micro_batches, int virtual_stages, int rank) {
  const int all = micro_batches * virtual_stages;
  const int warmup = std::min(2 * (stages - rank - 1), all);
  return warmup < all ? warmup + 1 : all;  // the first steady forward runs before its backward;
}

}  // namespace exercise12
