// exercises/24_moe_dispatch/wrong_grouped_by_token.cpp — a wrong plan_dispatch: each expert's rows sorted by token.
//
// The right assignments are kept, but each expert lists them by token, not in the order it served
// them (first choices, then second choices). The plan is an order: the all-to-all, the expert's rows
// and the combine all read it, and every rank must build the same one.
// expect: the order the expert served them
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "exercises/24_moe_dispatch/dispatch_plan.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise24 {

double predicted_dropped() { return 4; }  // expert 0 is chosen 8 times and keeps 4

int64_t capacity_of(double capacity_factor, int64_t tokens, int64_t k, int64_t experts) {
  if (capacity_factor == 0) return -1;
  return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens * k) / static_cast<double>(experts)));
}

Plan plan_dispatch(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  std::vector<std::vector<int64_t>> token(E), choice(E);
  Plan plan{{}, {}, std::vector<int64_t>(E, 0), std::vector<int64_t>(E, 0)};
  for (int64_t j = 0; j < k; ++j)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t e = experts[n * k + j];
      SL_CHECK(e >= 0 && e < E, "plan_dispatch: token ", n, " chose expert ", e, " of ", E);
      ++plan.routed[e];
      if (capacity >= 0 && plan.kept[e] >= capacity) continue;
      ++plan.kept[e];
      token[e].push_back(n);
      choice[e].push_back(n * k + j);
    }
  for (int64_t e = 0; e < E; ++e) {
    std::vector<size_t> by(token[e].size());  // the mistake: sorted by token
    for (size_t i = 0; i < by.size(); ++i) by[i] = i;
    std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return token[e][a] < token[e][b]; });
    std::vector<int64_t> t, c;
    for (size_t i : by) t.push_back(token[e][i]), c.push_back(choice[e][i]);
    token[e] = t, choice[e] = c;
    plan.token.insert(plan.token.end(), token[e].begin(), token[e].end());
    plan.choice.insert(plan.choice.end(), choice[e].begin(), choice[e].end());
  }
  return plan;
}

Dispatched dispatch(const sl::Tensor& x, const Plan& plan) {
  const auto M = static_cast<int64_t>(plan.token.size());
  Dispatched out{sl::index_select(x, sl::from_vector({plan.token.begin(), plan.token.end()}, {M}, sl::DType::i64)), {0}};
  for (int64_t kept : plan.kept) out.offsets.push_back(out.offsets.back() + kept);
  return out;
}

}  // namespace exercise24
