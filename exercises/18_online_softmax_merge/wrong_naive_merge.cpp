// exercises/18_online_softmax_merge/wrong_naive_merge.cpp — a wrong merge_blocks: log(e^lse_a + e^lse_b) as written.
//
// A common mistake: the merge formula typed straight from the page, lse = log(exp(lse_a) + exp(lse_b)).
// It is exact on paper and for small scores, but exp overflows f64 once lse passes ~709: with large
// logits (a long context, or an un-normalised model) the merged lse is inf and the outputs are lost.
// Subtract the max first, m + log(exp(lse_a - m) + exp(lse_b - m)): every exponent is then <= 0.
// expect: inf in the merge
#include <cmath>
#include <cstdint>
#include <vector>

#include "exercises/grader.h"
#include "parallel/context_parallel/attention_block.h"
#include "tensor/ops.h"

namespace exercise18 {

double predicted_weight_of_a() { return 4.0 / 6; }  // 4 of the 6 visible keys are in A

sl::parallel::BlockOutput attend_block(const sl::Tensor& q, const sl::Tensor& k, const sl::Tensor& v,
                                       const std::vector<int64_t>& pos_q, const std::vector<int64_t>& pos_k,
                                       bool causal) {
  throw exercises::NotImplemented("attend_block");
}

sl::parallel::BlockOutput merge_blocks(const sl::parallel::BlockOutput& a, const sl::parallel::BlockOutput& b) {
  const sl::Tensor out = sl::zeros(a.out.shape(), sl::DType::f64), lse = a.lse.clone();
  const int64_t rows = a.lse.numel(), HS = a.out.size(3);
  const double *oa = a.out.data<double>(), *ob = b.out.data<double>();
  const double *la = a.lse.data<double>(), *lb = b.lse.data<double>();
  double *o = out.data<double>(), *l = lse.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    if (la[r] == lb[r] && std::isinf(la[r])) continue;   // neither block saw a key: out 0, lse -inf
    l[r] = std::log(std::exp(la[r]) + std::exp(lb[r]));  // the mistake: exp(1000) is inf
    const double wa = std::exp(la[r] - l[r]), wb = std::exp(lb[r] - l[r]);
    for (int64_t d = 0; d < HS; ++d) o[r * HS + d] = wa * oa[r * HS + d] + wb * ob[r * HS + d];
  }
  return {out, lse};
}

}  // namespace exercise18
