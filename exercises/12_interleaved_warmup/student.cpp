// exercises/12_interleaved_warmup/student.cpp — Megatron's interleaved 1F1B for one rank.
//
// p ranks, each holding v chunks of the model: rank r holds the global chunks r, r+p, …, r+(v-1)·p
// (its local chunks 0..v-1). A micro-batch goes through chunk 0 on rank 0, chunk 1 on rank 1, …,
// chunk p-1 on rank p-1, then wraps around to chunk p on rank 0 again: v laps of the ring.
// m micro-batches, m a multiple of p (Megatron's rule). Every rank runs m·v forwards and m·v backwards.
//
//   The order (the k-th forward of a rank, k = 0 .. m·v-1): micro-batches in groups of p; each group
//   goes through local chunk 0, then local chunk 1, … (p forwards per chunk):
//
//     p = 2, v = 2, m = 4 on rank 0:   k      0    1    2    3    4    5    6    7
//                                      F    0.0  1.0  0.2  1.2  2.0  3.0  2.2  3.2     (micro.chunk)
//                                      B    0.2  1.2  0.0  1.0  2.2  3.2  2.0  3.0     (chunks reversed)
//
//   The warm-up (forwards before the steady state) of rank r:
//       2·(p-r-1) + (v-1)·p,  capped at m·v
//     (v-1)·p: the first micro-batch comes back for its next chunk only after all p ranks ran it, so
//     rank r must run a whole round of the other chunks before its first backward can arrive;
//     2·(p-r-1): the 1F1B fill, doubled because in the steady state a forward and a backward alternate.
//   Then the steady state: warm-up+k-th forward, k-th backward; then the cool-down backwards.
//
//   The bubble: (p-1)/(v·m+p-1), v times smaller than 1F1B's, for v times the messages.
//
// The tools (parallel/pipeline/schedule.h):
//   using Kind = sl::parallel::Action::Kind;
//   sl::parallel::Action{Kind::forward, micro, chunk}    F of micro-batch `micro` through GLOBAL chunk `chunk`
//   sl::parallel::Action{Kind::backward, micro, chunk}   its backward
// Return only F and B actions: the grader adds the messages and hands your list to the simulator.
//
// Grade it:  make exercise N=12
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise12 {

// How many forwards rank `rank` runs before its steady state begins.
int interleaved_warmup(int stages, int micro_batches, int virtual_stages, int rank) {
  // TODO: Megatron's rule, capped at micro_batches * virtual_stages.
  throw exercises::NotImplemented("interleaved_warmup");
}

// Rank `rank`'s k-th forward (forward = true) or k-th backward: its micro-batch and GLOBAL chunk.
sl::parallel::Action interleaved_kth_action(int k, int stages, int virtual_stages, int rank, bool forward) {
  // TODO: the group of p micro-batches, the local chunk inside it (reversed for a backward), the global chunk.
  throw exercises::NotImplemented("interleaved_kth_action");
}

// Rank `rank`'s whole compute order: warm-up forwards, steady (forward, backward) pairs, cool-down backwards.
std::vector<sl::parallel::Action> interleaved_order(int stages, int micro_batches, int virtual_stages, int rank) {
  // TODO: the three phases, from the two functions above.
  throw exercises::NotImplemented("interleaved_order");
}

}  // namespace exercise12
