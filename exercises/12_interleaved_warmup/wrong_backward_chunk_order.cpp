// exercises/12_interleaved_warmup/wrong_backward_chunk_order.cpp — a wrong solution: backward chunks not reversed.
//
// A common mistake: a backward's position computed exactly like its forward's. A micro-batch's gradient
// comes back through the chunks in reverse: rank r's last local chunk (v-1) is the first to receive it,
// and its chunk 0 the last. Inside a group of p micro-batches the backwards run local chunk v-1-c.
// expect: backwards walk the chunks in reverse (local chunk v-1-c)
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
  const int local = chunk / stages;  // should be v - 1 - chunk / p;
  return (micro / stages) * stages * virtual_stages + local * stages + micro % stages;
}

int peak_in_flight(int stages, int micro_batches, int virtual_stages, int rank) {
  const int all = micro_batches * virtual_stages;
  const int warmup = std::min(2 * (stages - rank - 1) + (virtual_stages - 1) * stages, all);
  return warmup < all ? warmup + 1 : all;  // the first steady forward runs before its backward;
}

}  // namespace exercise12
