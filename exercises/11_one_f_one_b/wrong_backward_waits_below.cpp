// exercises/11_one_f_one_b/wrong_backward_waits_below.cpp — a wrong solution: a backward waits for the rank before it.
//
// A common mistake: both kinds of action wait for rank r-1, as the forwards do. A gradient flows the
// other way: B(i) on rank r needs dL/d(output of stage r), which B(i) on rank r+1 computes. Rank 0's B0
// is the LAST backward of micro-batch 0, not the first.
// expect: the gradient comes back from the next stage (r+1)
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/schedule.h"
#include "tensor/error.h"

namespace exercise11 {

using Kind = sl::parallel::Action::Kind;
using Orders = std::vector<std::vector<sl::parallel::Action>>;

double predicted_first_backward_tick() { return 4 * 1.0 + (4 - 1) * 2.0; }  // F0 down 4 stages, B0 up 3

std::vector<std::vector<double>> start_ticks(const Orders& orders, double forward_cost, double backward_cost) {
  const int p = static_cast<int>(orders.size());
  std::vector<std::vector<double>> starts(orders.size());
  std::map<std::tuple<bool, int, int>, double> ended;  // (forward?, micro, rank) -> end tick
  std::vector<size_t> next(orders.size(), 0);
  std::vector<double> free_at(orders.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r)
      while (next[r] < orders[r].size()) {
        const sl::parallel::Action& a = orders[r][next[r]];
        const bool forward = a.kind == Kind::forward;
        double start = free_at[r];
        const int from = r - 1;  // should be r + 1 for a backward
        if (from >= 0 && from < p) {
          auto it = ended.find({forward, a.micro, from});
          if (it == ended.end()) break;  // not run yet: try the other ranks
          start = std::max(start, it->second);
        }
        starts[r].push_back(start);
        free_at[r] = start + (forward ? forward_cost : backward_cost);
        ended[{forward, a.micro, r}] = free_at[r];
        ++next[r];
        moved = true;
      }
  }
  for (int r = 0; r < p; ++r)
    if (next[r] < orders[r].size())
      throw sl::Error("rank " + std::to_string(r) + " waits forever in " + orders[r][next[r]].str());
  return starts;
}

double bubble(const Orders& orders, const std::vector<std::vector<double>>& starts, double forward_cost,
              double backward_cost) {
  double span = 0;
  std::vector<double> busy(orders.size(), 0), last(orders.size(), 0);
  for (size_t r = 0; r < orders.size(); ++r)
    for (size_t k = 0; k < orders[r].size(); ++k) {
      const double cost = orders[r][k].kind == Kind::forward ? forward_cost : backward_cost;
      busy[r] += cost;
      last[r] = std::max(last[r], starts[r][k] + cost);
      span = std::max(span, starts[r][k] + cost);
    }
  double idle = 0;
  for (size_t r = 0; r < orders.size(); ++r) idle += (span - busy[r]) / span;
  return idle / static_cast<double>(orders.size());
}

int peak_in_flight(const std::vector<sl::parallel::Action>& order) {
  int live = 0, peak = 0;
  for (const sl::parallel::Action& a : order) {
    live += a.kind == Kind::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace exercise11
