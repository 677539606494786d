// exercises/11_one_f_one_b/student.cpp — time a pipeline's action lists: when each F and B starts.
//
// Lesson 09 writes 1F1B's lists and hands them to the library's simulator, which says when every
// action starts. Here you are the simulator. p ranks, one stage each (rank r owns chunk r); each rank
// runs its list in order, one action at a time. With costs F (a forward) and B (a backward):
//
//   F(i) on rank r can start when   rank r has finished its previous action, and
//                                   F(i) on rank r-1 has ended (its activation arrives; rank 0 has none to wait for)
//   B(i) on rank r can start when   rank r has finished its previous action, and
//                                   B(i) on rank r+1 has ended (its gradient comes back; the last rank waits
//                                   only for its own F(i), which its list already ran earlier)
//   Messages are free. An action starts at the latest of the ends it waits for.
//
//   1F1B, p = 3, m = 4, F = 1, B = 2, one character a tick (digits: forwards, letters: backwards, '.': idle):
//     rank 0  012....aa3bb.cc.dd     rank 0's B0 waits for B0 to come back from rank 2 through rank 1
//     rank 1  .01..aa2bb3cc.dd..
//     rank 2  ..0aa1bb2cc3dd....
//
// Lists whose actions wait for each other in a circle never finish (a deadlock): refuse them.
//
// The bubble of the step: span = the latest end over every rank; a rank's idle share is
// (span - its busy time) / span; the bubble is the mean of the ranks' shares. For 1F1B and GPipe it
// comes out (p-1)/(m+p-1) whatever F and B are.
//
// The tools (parallel/pipeline/schedule.h):
//   using Kind = sl::parallel::Action::Kind;
//   a.kind (Kind::forward or Kind::backward), a.micro (the micro-batch), a.chunk (= the rank here)
//   The grader hands you the lists: make_schedule's (naive, GPipe, 1F1B) and some it does not make.
//
// Grade it:  make exercise N=11
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"
#include "tensor/error.h"

namespace exercise11 {

// PREDICT FIRST, before any code. Lesson 09's 1F1B: p = 4, m = 8, F = 1, B = 2. Rank 0 runs
// F0 F1 F2 F3 and then wants B0. At what tick does rank 0's B0 start? Replace the throw with your
// number; the grader measures it with the library's simulator.
double predicted_first_backward_tick() {
  throw exercises::NotImplemented("predicted_first_backward_tick (predict first)");
}

// orders[r]: rank r's F and B actions in the order it runs them (chunk = r). Returns starts[r][k], the
// tick at which orders[r][k] starts. Lists that cannot finish throw sl::Error naming a rank that waits.
std::vector<std::vector<double>> start_ticks(const std::vector<std::vector<sl::parallel::Action>>& orders,
                                             double forward_cost, double backward_cost) {
  // TODO: move every rank forward as far as its next action's waits allow, until none can move.
  throw exercises::NotImplemented("start_ticks");
}

// The bubble of the step that `starts` (start_ticks' answer) describes: the mean over ranks of
// (span - busy) / span, with span the latest end over every rank.
double bubble(const std::vector<std::vector<sl::parallel::Action>>& orders,
              const std::vector<std::vector<double>>& starts, double forward_cost, double backward_cost) {
  // TODO: each rank's busy time, the step's span, the mean idle share.
  throw exercises::NotImplemented("bubble");
}

// The most micro-batches one rank holds activations for at once: forwards run, their backwards not yet.
int peak_in_flight(const std::vector<sl::parallel::Action>& order) {
  // TODO: count up at F, down at B.
  throw exercises::NotImplemented("peak_in_flight");
}

}  // namespace exercise11
