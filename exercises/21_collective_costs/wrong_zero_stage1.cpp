// exercises/21_collective_costs/wrong_zero_stage1.cpp — wrong ZeRO bytes: stage 1 shards the gradients too.
//
// A common mistake: taking ZeRO-1 to shard "the optimizer's inputs and state", gradients included.
// Stage 1 (P_os) shards only the optimizer state K·Ψ: every rank still all-reduces and keeps the
// whole gradient, (w + g)·Ψ + K·Ψ/N_d. Sharding the gradients as well is stage 2 (P_os+g), which
// needs a reduce-scatter in place of the all-reduce.
// expect: that is stage 2's; stage 1 shards only the optimizer state

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"
#include "tensor/error.h"

namespace exercise21 {

using sl::parallel::CommOp;
using sl::parallel::Link;

double predicted_small_all_reduce_us() { return 2 * (8 - 1) * (50.0 + 4096.0 / 8 / 1e9 * 1e6); }  // 14 steps

double ring_seconds(CommOp op, int n, double bytes, const Link& link) {
  throw exercises::NotImplemented("ring_seconds");
}

double ring_bytes_sent(CommOp op, int n, double bytes) { throw exercises::NotImplemented("ring_bytes_sent"); }

double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  SL_CHECK(stage >= 0 && stage <= 3 && dp >= 1, "zero_bytes_per_rank: stage ", stage, ", N_d ", dp);
  const double w = mixed_precision ? 2 : 4, g = w, K = mixed_precision ? 12 : 8, psi = parameters;
  if (stage == 0) return (w + g + K) * psi;
  if (stage == 3) return (w + g + K) * psi / dp;
  return w * psi + (g + K) * psi / dp;  // the mistake: stage 1 keeps the whole gradient, (w + g)Ψ + KΨ/N_d
}

}  // namespace exercise21
