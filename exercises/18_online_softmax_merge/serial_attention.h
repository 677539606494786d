// exercises/18_online_softmax_merge/serial_attention.h — the grader's reference: serial softmax attention.
//
// f64 loops with the max trick over every key a query may see (by positions), independent of the
// library's attention blocks: out, lse and each row's max score, which the diagnostics compare a wrong
// answer with (no scale, no mask, a strict mask, lse without its max).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace exercise18::serial {

using sl::Tensor;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct Reference {
  std::vector<double> out, lse, max;  // [B·NH·Tq·HS], [B·NH·Tq], each row's max score [B·NH·Tq]
};

// mode: 0 pos_k <= pos_q (the rule), 1 pos_k < pos_q (a strict mask), 2 no mask; scale <= 0: 1/sqrt(HS).
inline Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& pos_q,
                           const std::vector<int64_t>& pos_k, bool causal, bool strict = false, double scale = 0) {
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2), HS = q.size(3);
  if (scale <= 0) scale = 1 / std::sqrt(static_cast<double>(HS));
  const std::vector<double> Q = q.to_vector(), K = k.to_vector(), V = v.to_vector();
  Reference ref{std::vector<double>(BH * Tq * HS, 0.0), std::vector<double>(BH * Tq, -kInf),
                std::vector<double>(BH * Tq, -kInf)};
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(Tk, -kInf);
      double m = -kInf;
      for (int64_t j = 0; j < Tk; ++j) {
        if (causal && (strict ? pos_k[j] >= pos_q[i] : pos_k[j] > pos_q[i])) continue;
        double dot = 0;
        for (int64_t d = 0; d < HS; ++d) dot += Q[(bh * Tq + i) * HS + d] * K[(bh * Tk + j) * HS + d];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      if (m == -kInf) continue;  // no visible key: out 0, lse -inf
      double total = 0;
      for (int64_t j = 0; j < Tk; ++j) total += std::exp(s[j] - m);
      ref.lse[bh * Tq + i] = m + std::log(total);
      ref.max[bh * Tq + i] = m;
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < HS; ++d)
          ref.out[(bh * Tq + i) * HS + d] += std::exp(s[j] - m) / total * V[(bh * Tk + j) * HS + d];
    }
  return ref;
}

}  // namespace exercise18::serial
