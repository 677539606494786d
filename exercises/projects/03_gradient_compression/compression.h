// exercises/projects/03_gradient_compression/compression.h — the interface the grader trains with.
//
// Data parallelism averages every gradient over the n replicas each step: the ring all-reduce sends
// 2(n-1)/n · S bytes per rank for S bytes of gradients. Compression sends less:
//
//   top-k       each rank sends only its k largest-magnitude entries (values + indices) of
//               (gradient + error); the ranks' sparse pieces are summed, so the average is sparse
//   PowerSGD    each gradient matrix [R, C] ≈ P Qᵀ with rank q: all-reduce P [R, q] and Q [C, q]
//               instead of [R, C] (Vogels et al. 2019)
//
// Error feedback keeps what was not sent and adds it to the next step's gradient:
//
//   e ← e + g          (g: this rank's local gradient)
//   send compress(e)    the part that goes out this step
//   e ← e − decompress(compress(e))
//
// so nothing is lost, only late, and SGD/AdamW still converge. Every rank must apply the same
// averaged gradient, or the replicas drift apart.
//
// You may add members and helpers here (the grader includes this file).
#pragma once
#include <vector>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace project03 {

class CompressedAverager {
 public:
  // keep: the fraction of each gradient's elements (top-k) or the rank budget (PowerSGD) a rank
  // sends per step, 0 < keep <= 1. keep = 1 must give the uncompressed average.
  CompressedAverager(sl::parallel::ProcessGroup& group, double keep);

  // grads: this rank's local gradients (f32, contiguous), one per parameter, the same list and order
  // every step. On return each holds the averaged gradient the optimizer will apply, identical on
  // every rank; what was not sent stays in the error-feedback memory for the next step.
  void average(const std::vector<sl::Tensor>& grads);

 private:
  sl::parallel::ProcessGroup& group_;
  double keep_;
  std::vector<sl::Tensor> error_;  // [numel of grad i] each: the residual not yet sent (error feedback)
};

}  // namespace project03
