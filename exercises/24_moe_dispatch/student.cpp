// exercises/24_moe_dispatch/student.cpp — the dispatch plan of a mixture of experts, and the gather.
//
// A router chose k experts for each of N tokens: experts[n·k + j] is token n's j-th choice (best
// first). Each of the E experts computes at most `capacity` assignments:
//
//   capacity = ceil(capacity_factor · N · k / E)        capacity_factor 0: no limit (return -1)
//
// The plan says which assignments each expert computes, in the order it was SERVED them:
//
//   for j in 0 .. k-1:               every token's first choice before any token's second
//     for n in 0 .. N-1:             then in token order
//       e = experts[n·k + j]; routed[e] += 1
//       if e already kept `capacity` assignments: dropped (nothing else happens)
//       else: e keeps it: token n, choice entry n·k + j (its index into the weights [N, k], flattened)
//
// The plan lists expert 0's kept assignments first (in service order), then expert 1's, and so on:
//
//   token  [M]  the token of each kept assignment      (M = Σ kept)
//   choice [M]  its entry n·k + j
//   routed [E]  assignments routed to each expert (before the cut)
//   kept   [E]  those it computes: min(routed, capacity)
//
// dispatch gathers those rows: rows[m] = x[token[m]], so expert e's rows are the kept[e] rows starting
// at offsets[e] = kept[0] + ... + kept[e-1] (offsets has E + 1 entries, the last is M). It must pass
// gradient back to x: build it from sl::index_select (tensor/ops.h), which does.
//
// Do not call nn::plan_dispatch, nn::dispatch or nn::expert_capacity: they are the answer.
//
// Grade it:  make exercise N=24
#include <cmath>
#include <cstdint>
#include <vector>

#include "exercises/24_moe_dispatch/dispatch_plan.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise24 {

// PREDICT FIRST, before any code. N 8, E 4, k 2, capacity factor 1.0; (first, second) choices:
// token 0 (0, 1), 1 (0, 2), 2 (0, 1), 3 (0, 3), 4 (0, 1), 5 (1, 0), 6 (2, 0), 7 (3, 0).
// How many of the 16 assignments are dropped? Replace the throw with your number.
double predicted_dropped() { throw exercises::NotImplemented("predicted_dropped (predict first)"); }

// ceil(capacity_factor · tokens · k / experts); -1 when capacity_factor is 0 (dropless).
int64_t capacity_of(double capacity_factor, int64_t tokens, int64_t k, int64_t experts) {
  // TODO
  throw exercises::NotImplemented("capacity_of");
}

// experts: [N·k] row-major (token n's choices at n·k .. n·k + k-1), each in [0, E); capacity -1: no limit.
// An expert id outside [0, E) is refused: throw sl::Error (SL_CHECK in tensor/error.h) naming it.
Plan plan_dispatch(const std::vector<int64_t>& experts, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  // TODO: the two loops above, one list per expert, then the lists one after the other.
  throw exercises::NotImplemented("plan_dispatch");
}

// x [N, C] -> rows [M, C] in the plan's order, and offsets [E + 1].
Dispatched dispatch(const sl::Tensor& x, const Plan& plan) {
  // TODO: index_select needs the tokens as an i64 tensor: sl::from_vector(values, {M}, sl::DType::i64).
  throw exercises::NotImplemented("dispatch");
}

}  // namespace exercise24
