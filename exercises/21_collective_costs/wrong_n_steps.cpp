// exercises/21_collective_costs/wrong_n_steps.cpp — a wrong ring time: n steps per pass instead of n-1.
//
// A common mistake: "n ranks, so n steps". Each rank already holds its own chunk: a reduce-scatter
// needs n-1 steps for every chunk to pass the other n-1 ranks, and an all-gather n-1 steps for every
// finished chunk to reach them. Counting n charges one latency and one chunk too many per pass,
// which matters most at small n (n = 2: twice the time).
// expect: that is n steps per pass: a ring of n ranks needs n-1

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"
#include "tensor/error.h"

namespace exercise21 {

using sl::parallel::CommOp;
using sl::parallel::Link;

double predicted_small_all_reduce_us() { return 2 * (8 - 1) * (50.0 + 4096.0 / 8 / 1e9 * 1e6); }  // 14 steps

double ring_seconds(CommOp op, int n, double bytes, const Link& link) {
  SL_CHECK(op == CommOp::all_reduce || op == CommOp::reduce_scatter || op == CommOp::all_gather,
           "ring_seconds: not a ring collective");
  SL_CHECK(n >= 1, "ring_seconds: n = ", n);
  const int steps = (op == CommOp::all_reduce ? 2 : 1) * n;  // the mistake: n-1 steps per pass
  return steps * (link.latency_s + bytes / n / link.bytes_per_s);
}

double ring_bytes_sent(CommOp op, int n, double bytes) { throw exercises::NotImplemented("ring_bytes_sent"); }

double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  throw exercises::NotImplemented("zero_bytes_per_rank");
}

}  // namespace exercise21
