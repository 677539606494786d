// exercises/12_interleaved_warmup/wrong_peak_is_warmup.cpp — a wrong solution: the peak taken to be the warm-up.
//
// A common mistake: "the warm-up forwards are what is in flight". But the steady state starts with a
// forward, and its backward comes after it: at that moment the rank holds warm-up + 1 pairs. Only when
// the warm-up already runs every forward (m·v) is there nothing to add.
// expect: one more than the warm-up: the first steady forward runs before its backward frees anything
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
  const int warmup = std::min(2 * (stages - rank - 1) + (virtual_stages - 1) * stages, all);
  return warmup;  // should add the first steady forward;
}

}  // namespace exercise12
