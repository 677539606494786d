// exercises/21_collective_costs/wrong_predict_bandwidth_only.cpp — a wrong prediction: the bytes over the bandwidth.
//
// The common wrong prediction: an all-reduce sends 2(n-1)/n·S bytes a rank, so it takes that over the
// bandwidth, 2·7/8·4096 B / 1 GB/s = 7.168 µs. Every one of its 2(n-1) = 14 ring steps is a message
// that pays the link's 50 µs latency first: for a 4 KiB tensor the latency is 99% of the time. (The
// functions are left unwritten: the prediction is the mistake shown here.)
// expect: is not the measured 707.168 µs

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"
#include "tensor/error.h"

namespace exercise21 {

using sl::parallel::CommOp;
using sl::parallel::Link;

double predicted_small_all_reduce_us() { return 2.0 * (8 - 1) / 8 * 4096 / 1e9 * 1e6; }  // bytes / bandwidth only

double ring_seconds(CommOp op, int n, double bytes, const Link& link) { throw exercises::NotImplemented("ring_seconds"); }

double ring_bytes_sent(CommOp op, int n, double bytes) { throw exercises::NotImplemented("ring_bytes_sent"); }

double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  throw exercises::NotImplemented("zero_bytes_per_rank");
}

}  // namespace exercise21
