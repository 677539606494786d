// exercises/21_collective_costs/student.cpp — what a collective costs on a ring, and what the model's
// states cost per rank: the two numbers the planner (parallel/planner/) weighs every layout by.
//
// The alpha-beta model (parallel/comm/topology.h): a message of b bytes over a link costs
//
//     alpha + b / beta        alpha = link.latency_s (seconds), beta = link.bytes_per_s (BYTES per second)
//
// A ring over n ranks cuts a tensor of S bytes into n chunks of S/n. In one step every rank sends one
// chunk to its right neighbour and receives one from its left, all hops at once:
//
//   reduce-scatter   n-1 steps: after step k each rank has summed k+1 ranks' copies of one chunk
//   all-gather       n-1 steps: each finished chunk travels once round the ring
//   all-reduce       reduce-scatter then all-gather: 2(n-1) steps
//
//     time(all-reduce)              = 2(n-1) · (alpha + S/(n·beta))
//     time(reduce-scatter, gather)  =  (n-1) · (alpha + S/(n·beta))
//     bytes a rank sends            = steps · S/n      (2(n-1)/n · S for all-reduce: almost 2S, for any n)
//
// S is always the WHOLE tensor: the all-reduced tensor, the reduce-scatter's input, the all-gather's
// output. n = 1 moves nothing and costs nothing. The grader uses S divisible by n.
//
// Model states per rank (Rajbhandari et al. 2020, "ZeRO", Table 1): Ψ parameters over N_d data-parallel
// ranks, Adam. Per parameter:
//     mixed precision   2 (f16 weights) + 2 (f16 gradients) + K = 12 (f32 master weights, m, v)
//     f32               4 (weights)     + 4 (gradients)     + K = 8  (m, v)
//   stage 0 (DDP)     everything replicated                 (w + g + K) Ψ
//   stage 1 (P_os)    optimizer state sharded               (w + g) Ψ + K Ψ / N_d
//   stage 2 (P_os+g)  + gradients sharded                   w Ψ + (g + K) Ψ / N_d
//   stage 3 (P_os+g+p)+ weights sharded (FSDP)              (w + g + K) Ψ / N_d
// e.g. Ψ = 7.5e9, N_d = 64, mixed precision: 120 GB at stage 0, 31.4 GB at stage 1, 1.9 GB at stage 3.
//
// Tools: sl::parallel::Link (parallel/comm/topology.h), sl::parallel::CommOp (parallel/comm/process_group.h).
// Do not call the planner here: the grader compares you with it.
//
// Grade it:  make exercise N=21
#include <cstdint>

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"
#include "tensor/error.h"

namespace exercise21 {

using sl::parallel::CommOp;
using sl::parallel::Link;

// PREDICT FIRST, before any code. An all-reduce of 1024 f32 (4 KiB) on a ring of 8 ranks whose links
// have a latency of 50 µs and 1 GB/s of bandwidth: how many microseconds does it take (what each
// rank's links are charged)? Replace the throw with your number; the grader runs the library's ring
// over such a simulated link and reads each rank's ledger.
double predicted_small_all_reduce_us() { throw exercises::NotImplemented("predicted_small_all_reduce_us (predict first)"); }

// Seconds one call of `op` (all_reduce, reduce_scatter or all_gather) takes on a ring of n ranks whose
// every hop is `link`, for a tensor of S = `bytes` bytes. Throw sl::Error (SL_CHECK) for another op or n < 1.
double ring_seconds(CommOp op, int n, double bytes, const Link& link) {
  // TODO: the number of ring steps for this op, times one step: alpha + (S/n) / beta.
  throw exercises::NotImplemented("ring_seconds");
}

// Bytes one rank sends in that call (it receives as many).
double ring_bytes_sent(CommOp op, int n, double bytes) {
  // TODO: the number of steps times one chunk of S/n.
  throw exercises::NotImplemented("ring_bytes_sent");
}

// Model-state bytes (weights + gradients + optimizer) one rank holds at ZeRO `stage` (0..3) for
// `parameters` = Ψ over `dp` = N_d ranks; mixed_precision picks 2 + 2 + 12, else 4 + 4 + 8.
// Throw sl::Error for a stage outside 0..3 or dp < 1.
double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  // TODO: w, g and K for the precision; then divide the sharded parts by N_d.
  throw exercises::NotImplemented("zero_bytes_per_rank");
}

}  // namespace exercise21
