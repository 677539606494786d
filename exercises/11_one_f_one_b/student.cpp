// exercises/11_one_f_one_b/student.cpp — the 1F1B compute order of one pipeline rank.
//
// p stages, one per rank; m micro-batches. Rank r owns chunk r of the model. A forward F(i) of
// micro-batch i needs stage r-1's activation of i; a backward B(i) needs stage r+1's gradient of i,
// which comes back only after micro-batch i has gone all the way down the pipe and up again.
//
//   GPipe   all m forwards, then all m backwards: rank r holds m micro-batches' activations.
//   1F1B    warm-up:  min(p-r-1, m) forwards: just enough to keep the stages below busy
//           steady:   m - warm-up pairs "F(next), B(oldest)": each backward frees one micro-batch
//           cool-down: the backwards still owed, oldest first
//
//   p = 4, m = 4   rank 0  F0 F1 F2 F3 B0 B1 B2 B3         (warm-up 3)
//                  rank 1  F0 F1 F2 B0 F3 B1 B2 B3         (warm-up 2)
//                  rank 2  F0 F1 B0 F2 B1 F3 B2 B3         (warm-up 1)
//                  rank 3  F0 B0 F1 B1 F2 B2 F3 B3         (no warm-up)
//
//   Rank r then holds at most min(p-r, m) micro-batches between their F and B, and the bubble is
//   still GPipe's (p-1)/(m+p-1). Backwards always run in micro-batch order (B0, B1, ...), so the
//   gradients accumulate in the serial order.
//
// The tools (parallel/pipeline/schedule.h):
//   using Kind = sl::parallel::Action::Kind;
//   sl::parallel::Action{Kind::forward, micro, chunk}    F(micro) through chunk `chunk` (here: chunk = rank)
//   sl::parallel::Action{Kind::backward, micro, chunk}   its backward
// Return only F and B actions: the grader adds the sends and receives (with_communication) and hands
// your list to the simulator.
//
// Grade it:  make exercise N=11
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise11 {

// Rank `rank`'s compute order: F and B of every micro-batch 0..micro_batches-1, chunk = rank.
std::vector<sl::parallel::Action> one_f_one_b_order(int stages, int micro_batches, int rank) {
  // TODO: the warm-up forwards, the steady F,B pairs, the cool-down backwards.
  throw exercises::NotImplemented("one_f_one_b_order");
}

}  // namespace exercise11
