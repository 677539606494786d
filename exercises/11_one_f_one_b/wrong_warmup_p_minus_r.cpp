// exercises/11_one_f_one_b/wrong_warmup_p_minus_r.cpp — a wrong solution: a warm-up of p-r forwards.
//
// A common mistake: rank r warms up with p-r forwards, one per stage from r to the last. But the
// steady state's first pair starts with a forward too, so the warm-up needs only p-r-1: the last stage
// (r = p-1) can run B0 right after F0. One forward too many keeps one more micro-batch's activations
// alive on every rank and delays every backward by a step.
// expect: one warm-up forward too many (the last stage, r = p-1, warms up with none)
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise11 {

std::vector<sl::parallel::Action> one_f_one_b_order(int stages, int micro_batches, int rank) {
  using Kind = sl::parallel::Action::Kind;
  std::vector<sl::parallel::Action> order;
  const int warmup = std::min(stages - rank, micro_batches);  // should be p - r - 1
  int f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back({Kind::forward, f, rank});
  while (f < micro_batches) {  // steady: the next forward, then the oldest backward
    order.push_back({Kind::forward, f++, rank});
    order.push_back({Kind::backward, b++, rank});
  }
  while (b < micro_batches) order.push_back({Kind::backward, b++, rank});  // cool-down
  return order;
}

}  // namespace exercise11
