// exercises/11_one_f_one_b/wrong_gpipe.cpp — a wrong solution: GPipe's order.
//
// A common mistake: every forward first, then every backward in order. That is GPipe: valid, no deadlock,
// and the same bubble, but rank r holds all m micro-batches' activations at its peak instead of
// min(p-r, m). 1F1B runs each backward as soon as its gradient can be back, after a warm-up of
// min(p-r-1, m) forwards, and so frees the activations early.
// expect: all forwards first is GPipe, not 1F1B
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise11 {

std::vector<sl::parallel::Action> one_f_one_b_order(int stages, int micro_batches, int rank) {
  using Kind = sl::parallel::Action::Kind;
  std::vector<sl::parallel::Action> order;
  for (int f = 0; f < micro_batches; ++f) order.push_back({Kind::forward, f, rank});
  for (int b = 0; b < micro_batches; ++b) order.push_back({Kind::backward, b, rank});
  return order;
}

}  // namespace exercise11
