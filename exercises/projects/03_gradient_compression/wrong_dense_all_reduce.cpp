// exercises/projects/03_gradient_compression/wrong_dense_all_reduce.cpp — top-k sent as a dense tensor of zeros.
//
// A common mistake: choosing the top k entries (with error feedback, correctly) and then
// all-reducing a dense tensor that holds them and zeros elsewhere. The average is right, but the
// zeros travel too: the ring moves 2(n-1)/n·S bytes, exactly the uncompressed cost, and the
// compression saved nothing. Only the kept values and their indices must go on the wire.
// expect: send only the kept entries (values and indices), not dense tensors
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "exercises/grader.h"
#include "exercises/projects/03_gradient_compression/compression.h"
#include "tensor/ops.h"

namespace project03 {

CompressedAverager::CompressedAverager(sl::parallel::ProcessGroup& group, double keep) : group_(group), keep_(keep) {
  SL_CHECK(keep > 0 && keep <= 1, "CompressedAverager: keep must be in (0, 1], got ", keep);
}

void CompressedAverager::average(const std::vector<sl::Tensor>& grads) {
  if (error_.empty())
    for (const sl::Tensor& grad : grads) error_.push_back(sl::zeros(grad.shape()));
  for (size_t t = 0; t < grads.size(); ++t) {
    const sl::Tensor& grad = grads[t];
    const int64_t numel = grad.numel(), k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(keep_ * numel)));
    error_[t].add_(grad);  // e ← e + g
    std::vector<double> e = error_[t].to_vector();
    std::vector<int64_t> order(static_cast<size_t>(numel));
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), [&](int64_t a, int64_t b) {
      return std::abs(e[a]) > std::abs(e[b]) || (std::abs(e[a]) == std::abs(e[b]) && a < b);
    });
    std::vector<double> sent(static_cast<size_t>(numel), 0.0);
    for (int64_t i = 0; i < k; ++i) sent[order[i]] = e[order[i]], e[order[i]] = 0;  // e ← e − sent
    error_[t].copy_(sl::from_vector(e, grad.shape()));
    grad.copy_(sl::from_vector(sent, grad.shape()));
    group_.all_reduce(grad, sl::parallel::ReduceOp::avg);  // the mistake: numel floats on the wire, zeros included
  }
}

}  // namespace project03
