// exercises/18_online_softmax_merge/wrong_no_scale.cpp — a wrong attend_block: the scores are not scaled.
//
// A common mistake: the score of a query and a key taken as the plain dot product q·k. Attention
// scales it by 1/sqrt(HS): the dot of two HS-long random vectors grows like sqrt(HS), and unscaled
// scores make the softmax nearly one-hot, its gradients vanishing. Every lse and out differs, with
// or without the mask.
// expect: lse is the one of unscaled scores
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "exercises/grader.h"
#include "parallel/context_parallel/attention_block.h"
#include "tensor/ops.h"

namespace exercise18 {

double predicted_weight_of_a() { return 4.0 / 6; }  // 4 of the 6 visible keys are in A

sl::parallel::BlockOutput attend_block(const sl::Tensor& q, const sl::Tensor& k, const sl::Tensor& v,
                                       const std::vector<int64_t>& pos_q, const std::vector<int64_t>& pos_k,
                                       bool causal) {
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2), HS = q.size(3);
  const double inf = std::numeric_limits<double>::infinity();
  sl::Tensor out = sl::zeros({q.size(0), q.size(1), Tq, HS}, sl::DType::f64);
  sl::Tensor lse = sl::full({q.size(0), q.size(1), Tq}, -inf, sl::DType::f64);
  const double *Q = q.data<double>(), *K = k.data<double>(), *V = v.data<double>();
  double *O = out.data<double>(), *L = lse.data<double>();
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(Tk, -inf);
      double m = -inf;
      for (int64_t j = 0; j < Tk; ++j) {
        if (causal && pos_k[j] > pos_q[i]) continue;
        double dot = 0;
        for (int64_t d = 0; d < HS; ++d) dot += Q[(bh * Tq + i) * HS + d] * K[(bh * Tk + j) * HS + d];
        s[j] = dot;  // the mistake: no 1/sqrt(HS)
        m = std::max(m, s[j]);
      }
      if (m == -inf) continue;  // no visible key: out 0, lse -inf
      double total = 0;
      for (int64_t j = 0; j < Tk; ++j) total += std::exp(s[j] - m);
      L[bh * Tq + i] = m + std::log(total);
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < HS; ++d)
          O[(bh * Tq + i) * HS + d] += std::exp(s[j] - L[bh * Tq + i]) * V[(bh * Tk + j) * HS + d];
    }
  return {out, lse};
}

sl::parallel::BlockOutput merge_blocks(const sl::parallel::BlockOutput& a, const sl::parallel::BlockOutput& b) {
  throw exercises::NotImplemented("merge_blocks");
}

}  // namespace exercise18
