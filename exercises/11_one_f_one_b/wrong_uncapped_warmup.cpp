// exercises/11_one_f_one_b/wrong_uncapped_warmup.cpp — a wrong solution: the warm-up not capped at m.
//
// A common mistake: the warm-up is p-r-1 forwards, without min(., m). With at least as many micro-batches
// as stages that is right; with fewer (a small batch on a deep pipeline) the early ranks run forwards
// of micro-batches that do not exist. The warm-up is min(p-r-1, m).
// expect: with m < p-r-1 the warm-up is capped at m (min(p-r-1, m))
#include <algorithm>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"

namespace exercise11 {

std::vector<sl::parallel::Action> one_f_one_b_order(int stages, int micro_batches, int rank) {
  using Kind = sl::parallel::Action::Kind;
  std::vector<sl::parallel::Action> order;
  const int warmup = stages - rank - 1;  // should be min(p - r - 1, m)
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
