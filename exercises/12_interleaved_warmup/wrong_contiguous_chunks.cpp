// exercises/12_interleaved_warmup/wrong_contiguous_chunks.cpp — a wrong solution: chunks in contiguous blocks.
//
// A common mistake: reading the global chunk as if each rank held v consecutive chunks (rank r: r·v ..
// r·v+v-1), so that its local index is c mod v. Interleaving deals the chunks round-robin instead: rank
// r holds r, r+p, r+2p, ..., so that a micro-batch laps the whole ring v times; global chunk c is local
// chunk c / p of rank c mod p.
// expect: chunks are dealt round-robin (rank r holds r, r+p, r+2p, ...)
#include <algorithm>

#include "exercises/grader.h"

namespace exercise12 {

double predicted_rank0_peak_layers() {
  return 11;
}  // warm-up 2·3 + 4 = 10, plus the first steady forward; 1 layer a chunk

int forward_position(int micro, int chunk, int stages, int virtual_stages) {
  const int local = chunk % virtual_stages;  // should be chunk / p;
  return (micro / stages) * stages * virtual_stages + local * stages + micro % stages;
}

int backward_position(int micro, int chunk, int stages, int virtual_stages) {
  const int local = virtual_stages - 1 - chunk % virtual_stages;  // should be v - 1 - chunk / p;
  return (micro / stages) * stages * virtual_stages + local * stages + micro % stages;
}

int peak_in_flight(int stages, int micro_batches, int virtual_stages, int rank) {
  const int all = micro_batches * virtual_stages;
  const int warmup = std::min(2 * (stages - rank - 1) + (virtual_stages - 1) * stages, all);
  return warmup < all ? warmup + 1 : all;  // the first steady forward runs before its backward;
}

}  // namespace exercise12
