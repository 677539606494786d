// exercises/11_one_f_one_b/wrong_bubble_own_span.cpp — a wrong solution: each rank's idle time ends at its own last
// action.
//
// A common mistake: a rank's idle share measured up to its own last action. The step ends when the
// LAST rank finishes (the optimizer step waits for every gradient), so a rank that is done early idles
// until then: in 1F1B the last stage finishes p-1 backwards before rank 0, and that tail is bubble too.
// expect: each rank's idle time counts up to the end of the whole step (the latest end over every rank)
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
        const int from = forward ? r - 1 : r + 1;  // the neighbour whose F(i) or B(i) this one waits for
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
  for (size_t r = 0; r < orders.size(); ++r) idle += (last[r] - busy[r]) / last[r];
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
