// exercises/24_moe_dispatch/grader.cpp — grades capacity_of, plan_dispatch and dispatch (student.cpp).
//
// The reference is the library's own (nn/moe_routing.h): expert_capacity, plan_dispatch, dispatch.
// The routings come from nn::route on seeded random logits. With -DSL_SOLUTION those functions stand in.
#include "exercises/grader.h"
#include "exercises/grader_values.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "exercises/24_moe_dispatch/dispatch_plan.h"
#include "nn/moe_routing.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::expect;
using exercise24::Dispatched;
using exercise24::Plan;

namespace exercise24 {
double predicted_dropped();
int64_t capacity_of(double capacity_factor, int64_t tokens, int64_t k, int64_t experts);
Plan plan_dispatch(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity);
Dispatched dispatch(const Tensor& x, const Plan& plan);
}  // namespace exercise24

static std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : t.to_vector()) out.push_back(static_cast<int64_t>(v));
  return out;
}
static Tensor ids(const std::vector<int64_t>& v, const Shape& shape) {
  return from_vector(std::vector<double>(v.begin(), v.end()), shape, DType::i64);
}
// The library's plan, in the exercise's types.
static Plan library_plan(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  const nn::DispatchPlan p = nn::plan_dispatch(ids(experts, {N, k}), E, capacity, Device::cpu());
  return {ints(p.token), ints(p.choice), p.routed, p.kept};
}

#ifdef SL_SOLUTION
namespace solution {
// Expert 0 is chosen 8 times (first by tokens 0-4, second by 5-7) and keeps capacity 8·2/4 = 4.
double predicted_dropped() { return 4; }
int64_t capacity_of(double f, int64_t tokens, int64_t k, int64_t experts) { return nn::expert_capacity(f, tokens, k, experts); }
Plan plan_dispatch(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  return library_plan(experts, N, k, E, capacity);
}
Dispatched dispatch(const Tensor& x, const Plan& plan) {
  nn::DispatchPlan p;
  p.token = ids(plan.token, {static_cast<int64_t>(plan.token.size())});
  Dispatched out{nn::dispatch(x, p), {0}};
  for (int64_t kept : plan.kept) out.offsets.push_back(out.offsets.back() + kept);
  return out;
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise24;
#endif

// The predict-first routing: (first, second) choices of 8 tokens over 4 experts.
static const std::vector<int64_t> kPuzzle = {0, 1, 0, 2, 0, 1, 0, 3, 0, 1, 1, 0, 2, 0, 3, 0};

// ---- what a wrong plan looks like -----------------------------------------------------------------------
// The same plan served token by token (both choices of token 0, then token 1's, ...).
static Plan token_order_plan(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  std::vector<std::vector<int64_t>> token(E), choice(E);
  Plan p{{}, {}, std::vector<int64_t>(E, 0), std::vector<int64_t>(E, 0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = experts[n * k + j];
      ++p.routed[e];
      if (capacity >= 0 && p.kept[e] >= capacity) continue;
      ++p.kept[e], token[e].push_back(n), choice[e].push_back(n * k + j);
    }
  for (int64_t e = 0; e < E; ++e)
    p.token.insert(p.token.end(), token[e].begin(), token[e].end()),
        p.choice.insert(p.choice.end(), choice[e].begin(), choice[e].end());
  return p;
}

static std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 12; ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s + (v.size() > 12 ? " ...]" : "]");
}

// Same kept set per expert, only the order inside an expert differs?
static bool same_sets_per_expert(const Plan& got, const Plan& want) {
  if (got.kept != want.kept || got.choice.size() != want.choice.size()) return false;
  size_t first = 0;
  for (int64_t kept : want.kept) {
    std::vector<int64_t> a(got.choice.begin() + first, got.choice.begin() + first + kept),
        b(want.choice.begin() + first, want.choice.begin() + first + kept);
    std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
    if (a != b) return false;
    first += kept;
  }
  return true;
}

static void expect_plan(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity,
                        const std::string& what) {
  const Plan got = impl::plan_dispatch(experts, N, k, E, capacity), want = library_plan(experts, N, k, E, capacity);
  const std::string where = what + " (N " + std::to_string(N) + ", k " + std::to_string(k) + ", E " +
                            std::to_string(E) + ", capacity " + std::to_string(capacity) + ")";
  expect(got.routed == want.routed, where + ": routed per expert " + list(got.routed) + ", expected " + list(want.routed) +
                                        ": count every assignment routed to e, kept or dropped");
  if (got.kept == want.kept && got.token == want.token && got.choice == want.choice) return;
  expect(got.kept == want.kept, where + ": kept per expert " + list(got.kept) + ", expected " + list(want.kept) +
                                    ": an expert keeps min(routed, capacity)");
  if (same_sets_per_expert(got, want))
    expect(false, where + ": each expert keeps the right assignments but lists them out of order (choice entries " +
                      list(got.choice) + ", expected " + list(want.choice) +
                      "): list them in the order the expert served them, not sorted by token");
  const Plan by_token = token_order_plan(experts, N, k, E, capacity);
  if (got.kept == by_token.kept && got.choice == by_token.choice)
    expect(false, where + ": you served the assignments in token order (token 0's choices, then token 1's); "
                          "serve choice by choice: every token's first choice before any token's second");
  expect(got.choice == want.choice, where + ": choice entries " + list(got.choice) + ", expected " + list(want.choice) +
                                        " (expert 0's first, each in the order it served them)");
  expect(got.token == want.token, where + ": tokens " + list(got.token) + ", expected " + list(want.token) +
                                      ": the token of entry n·k + j is n");
}

// A seeded routing from the library's router: nn::route on random logits [N, E].
static std::vector<int64_t> seeded_routing(int64_t N, int64_t E, int64_t k, uint64_t seed) {
  return ints(nn::route(exercises::seeded_randn({N, E}, seed), k, nn::MoERouter::topk_softmax).experts);
}

static void check_dispatch(int64_t N, int64_t E, int64_t k, double factor, uint64_t seed) {
  const std::vector<int64_t> experts = seeded_routing(N, E, k, seed);
  const int64_t capacity = nn::expert_capacity(factor, N, k, E);
  const Plan plan = library_plan(experts, N, k, E, capacity);
  const Tensor x = exercises::seeded_randn({N, 5}, seed + 1).set_requires_grad();
  const Dispatched got = impl::dispatch(x, plan);
  nn::DispatchPlan lib = nn::plan_dispatch(ids(experts, {N, k}), E, capacity, Device::cpu());
  const Tensor want = nn::dispatch(x.detach(), lib);
  expect(got.rows.defined() && got.rows.shape() == want.shape() && max_abs_diff(got.rows, want) == 0,
         "dispatch: rows[m] must be x[token[m]] in the plan's order, [M, C] = " + want.shape().str());
  std::vector<int64_t> offsets{0};
  for (int64_t kept : plan.kept) offsets.push_back(offsets.back() + kept);
  expect(got.offsets == offsets, "dispatch: offsets " + list(got.offsets) + ", expected " + list(offsets) +
                                     " (E + 1 entries: 0, then the running sum of kept)");
  const Tensor w = exercises::seeded_randn(want.shape(), seed + 2);
  sum(mul(got.rows, w)).backward();
  expect(x.grad().defined(), "dispatch passed no gradient back to x: gather with sl::index_select (it has a backward)");
  const Tensor x2 = x.detach().clone().set_requires_grad();
  sum(mul(nn::dispatch(x2, lib), w)).backward();
  expect(max_abs_diff(x.grad(), x2.grad()) < 1e-6, "dispatch: the gradient of x differs from the library's: each "
                                                   "kept assignment's row gradient adds into its token's row");
}

int main() {
  exercises::Grader grader("24_moe_dispatch");
  grader.predict("assignments dropped at capacity factor 1.0 (N 8, E 4, k 2, the README's routing)",
                 impl::predicted_dropped,
                 [] { return static_cast<double>(nn::plan_dispatch(ids(kPuzzle, {8, 2}), 4, 4, Device::cpu()).dropped()); },
                 0, "assignments");
  grader.check("capacity_of == nn::expert_capacity: rounded up, factor 0 dropless (-1)", [] {
    for (double f : {0.0, 0.5, 1.0, 1.25, 2.0, 3.3})
      for (int64_t N : {1, 7, 10, 64})
        for (int64_t k : {1, 2, 3})
          for (int64_t E : {2, 3, 4, 8}) {
            const int64_t got = impl::capacity_of(f, N, k, E), want = nn::expert_capacity(f, N, k, E);
            if (got == want) continue;
            const std::string where = "capacity_of(" + std::to_string(f) + ", N " + std::to_string(N) + ", k " +
                                      std::to_string(k) + ", E " + std::to_string(E) + ") = " + std::to_string(got) +
                                      ", expected " + std::to_string(want);
            expect(!(f > 0 && got == static_cast<int64_t>(std::floor(f * N * k / E))),
                   where + ": round the capacity up (ceil): a fraction of a slot is a whole slot");
            expect(false, where + (f == 0 ? ": factor 0 means dropless, -1" : ""));
          }
  });
  grader.check("a token's first choice wins over an earlier token's second (N 2, E 2, capacity 1)", [] {
    // token 0 chose (0, 1), token 1 chose (1, 0): both first choices are kept, both second ones dropped
    expect_plan({0, 1, 1, 0}, 2, 2, 2, 1, "first choices first");
  });
  grader.check("the README's routing at capacity factor 1.0: the library's plan", [] {
    expect_plan(kPuzzle, 8, 2, 4, 4, "the README's routing");
  });
  grader.check("the README's routing dropless (capacity -1): nothing dropped, same service order", [] {
    expect_plan(kPuzzle, 8, 2, 4, -1, "dropless");
  });
  grader.check("160 seeded routings (N 1-40, E 2-8, k 1-3, factors 0, 0.5, 1, 1.25, 2) == nn::plan_dispatch", [] {
    uint64_t seed = 100;
    for (int64_t N : {1, 5, 16, 40})
      for (int64_t E : {2, 3, 8})
        for (int64_t k : {1, 2, 3}) {
          if (k > E) continue;
          for (double f : {0.0, 0.5, 1.0, 1.25, 2.0}) {
            const std::vector<int64_t> experts = seeded_routing(N, E, k, ++seed);
            expect_plan(experts, N, k, E, nn::expert_capacity(f, N, k, E), "seed " + std::to_string(seed));
          }
        }
  });
  grader.check("an expert id outside [0, E) is refused (an exception naming it)", [] {
    bool refused = false;
    try {
      impl::plan_dispatch({0, 1, 4, 0}, 2, 2, 4, -1);
    } catch (const exercises::NotImplemented&) {
      throw;
    } catch (const std::exception&) {
      refused = true;
    }
    expect(refused, "plan_dispatch accepted expert 4 of E = 4: check 0 <= e < E and throw (SL_CHECK)");
  });
  grader.check("dispatch == nn::dispatch, offsets from kept, and the gradient back to x", [] {
    check_dispatch(8, 4, 2, 1.0, 300);
    check_dispatch(33, 8, 3, 0.5, 310);
    check_dispatch(12, 3, 1, 0.0, 320);
  });
  return grader.finish();
}
