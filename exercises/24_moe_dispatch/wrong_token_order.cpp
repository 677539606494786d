// exercises/24_moe_dispatch/wrong_token_order.cpp — a wrong plan_dispatch: served token by token, not choice by choice.
//
// A natural first loop: for each token, for each of its choices. But then token 0's second choice is
// served before token 7's first, and an expert full of early tokens' second choices drops a late
// token's first choice. The rule serves every token's first choice before any token's second.
// expect: token order
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
  for (int64_t n = 0; n < N; ++n)  // the mistake: token by token
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = experts[n * k + j];
      SL_CHECK(e >= 0 && e < E, "plan_dispatch: token ", n, " chose expert ", e, " of ", E);
      ++plan.routed[e];
      if (capacity >= 0 && plan.kept[e] >= capacity) continue;
      ++plan.kept[e];
      token[e].push_back(n);
      choice[e].push_back(n * k + j);
    }
  for (int64_t e = 0; e < E; ++e) {
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
