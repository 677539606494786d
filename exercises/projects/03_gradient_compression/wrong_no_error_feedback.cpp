// exercises/projects/03_gradient_compression/wrong_no_error_feedback.cpp — top-k without error feedback.
//
// A common mistake: each step, send the k largest entries of this step's gradient and drop the rest.
// With a smooth gradient the same large entries win every step and the small ones never travel: the
// model only ever moves along a few coordinates, whatever the loss says about the others. Error
// feedback keeps what was not sent (e ← e + g − sent) so it grows until it is sent: late, never lost.
// expect: keep what was not sent (e ← e + g − sent)
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
  const int n = group_.size();
  for (const sl::Tensor& grad : grads) {
    const int64_t numel = grad.numel(), k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(keep_ * numel)));
    if (k == numel) {  // keep = 1: the uncompressed average; the ring sends less than gathering every entry
      group_.all_reduce(grad, sl::parallel::ReduceOp::avg);
      continue;
    }
    const std::vector<double> g = grad.to_vector();  // the mistake: no error memory, the rest is dropped
    std::vector<int64_t> order(static_cast<size_t>(numel));
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), [&](int64_t a, int64_t b) {
      return std::abs(g[a]) > std::abs(g[b]) || (std::abs(g[a]) == std::abs(g[b]) && a < b);
    });
    std::vector<double> values(static_cast<size_t>(k)), indices(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) indices[i] = static_cast<double>(order[i]), values[i] = g[order[i]];
    // Every rank's k values and indices, in rank order; summed the same way on every rank.
    const sl::Tensor all_values = sl::zeros({n * k}), all_indices = sl::zeros({n * k});
    group_.all_gather(all_values, sl::from_vector(values, sl::Shape({k})));
    group_.all_gather(all_indices, sl::from_vector(indices, sl::Shape({k})));
    std::vector<double> sum(static_cast<size_t>(numel), 0.0);
    const std::vector<double> v = all_values.to_vector(), at = all_indices.to_vector();
    for (size_t j = 0; j < v.size(); ++j) sum[static_cast<size_t>(at[j])] += v[j];
    for (double& s : sum) s /= n;
    grad.copy_(sl::from_vector(sum, grad.shape()));
  }
}

}  // namespace project03
