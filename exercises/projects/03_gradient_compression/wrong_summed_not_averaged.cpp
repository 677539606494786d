// exercises/projects/03_gradient_compression/wrong_summed_not_averaged.cpp — the ranks' pieces never divided by n.
//
// A common mistake: decompressing the sum of the ranks' sparse pieces and forgetting to divide it by
// n. Data parallelism averages: each rank's gradient is already the mean over its rows, so the sum is
// n times the batch's gradient. AdamW hides most of the scale (it divides by sqrt(v)), but SGD, a
// gradient clip or a learning-rate schedule tuned on one GPU do not.
// expect: the ranks' pieces were summed; divide the sum by n
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
  if (error_.empty())
    for (const sl::Tensor& grad : grads) error_.push_back(sl::zeros(grad.shape()));
  for (size_t t = 0; t < grads.size(); ++t) {
    const sl::Tensor& grad = grads[t];
    const int64_t numel = grad.numel(), k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(keep_ * numel)));
    if (k == numel) {           // keep = 1: every entry, dense (the ring sends less than gathering every entry)
      group_.all_reduce(grad);  // the mistake again: summed over the ranks, never divided by n
      continue;
    }
    error_[t].add_(grad);  // e ← e + g
    std::vector<double> e = error_[t].to_vector();
    std::vector<int64_t> order(static_cast<size_t>(numel));
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), [&](int64_t a, int64_t b) {
      return std::abs(e[a]) > std::abs(e[b]) || (std::abs(e[a]) == std::abs(e[b]) && a < b);
    });
    std::vector<double> values(static_cast<size_t>(k)), indices(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i)
      indices[i] = static_cast<double>(order[i]), values[i] = e[order[i]], e[order[i]] = 0;
    error_[t].copy_(sl::from_vector(e, grad.shape()));  // e ← e − sent
    // Every rank's k values and indices, in rank order; summed the same way on every rank.
    const sl::Tensor all_values = sl::zeros({n * k}), all_indices = sl::zeros({n * k});
    group_.all_gather(all_values, sl::from_vector(values, sl::Shape({k})));
    group_.all_gather(all_indices, sl::from_vector(indices, sl::Shape({k})));
    std::vector<double> sum(static_cast<size_t>(numel), 0.0);
    const std::vector<double> v = all_values.to_vector(), at = all_indices.to_vector();
    for (size_t j = 0; j < v.size(); ++j) sum[static_cast<size_t>(at[j])] += v[j];
    grad.copy_(sl::from_vector(sum, grad.shape()));  // the mistake: n ranks' pieces summed, not divided by n
  }
}

}  // namespace project03
