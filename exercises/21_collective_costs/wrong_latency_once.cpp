// exercises/21_collective_costs/wrong_latency_once.cpp — a wrong ring time: the latency paid once per call.
//
// A common mistake: time = alpha + steps · S/(n·beta), as if the call were one message. Every ring
// step is its own message on every hop, and each waits for the one before it (it forwards what it
// just received), so each pays the latency: 2(n-1) times for an all-reduce. That latency term is
// why the ring loses to trees for small messages on many ranks.
// expect: the latency alpha is paid once per step

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
  const int steps = (op == CommOp::all_reduce ? 2 : 1) * (n - 1);
  return link.latency_s + steps * bytes / n / link.bytes_per_s;  // the mistake: alpha belongs to every step
}

double ring_bytes_sent(CommOp op, int n, double bytes) { throw exercises::NotImplemented("ring_bytes_sent"); }

double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  throw exercises::NotImplemented("zero_bytes_per_rank");
}

}  // namespace exercise21
