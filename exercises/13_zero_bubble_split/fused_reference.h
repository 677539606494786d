// exercises/13_zero_bubble_split/fused_reference.h — the grader's reference: the library's fused backward.
//
// A Problem is M micro-batches through one Linear [out, in] (x_k [N, in], dy_k [N, out], fixed seeds);
// fused() runs linear(x_k, W, b).backward(dy_k) for k = 0..M-1 through autograd, one after another,
// as a training step without the split does: each dX_k, and dW and db summed over the micro-batches.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

namespace exercise13 {

using namespace sl;  // this header is the grader's own, not the student's
using Values = std::vector<double>;

inline Values values(const Tensor& t) { return t.defined() ? t.to_vector() : Values{}; }

// M micro-batches through one Linear [out, in]: x_k [N, in], dy_k [N, out], from fixed seeds.
struct Problem {
  int64_t N, in, out;
  Tensor weight, bias;
  std::vector<Tensor> xs, dys;
  Problem(int64_t N, int64_t in, int64_t out, int micros, uint64_t seed) : N(N), in(in), out(out) {
    Generator g(seed);
    weight = randn({out, in}, {}, &g);
    bias = randn({out}, {}, &g);
    for (int k = 0; k < micros; ++k) {
      xs.push_back(randn({N, in}, {}, &g));
      dys.push_back(randn({N, out}, {}, &g));
    }
  }
};

// The fused backward of micro-batches 0..M-1, one after another: each dX, and the summed dW and db.
struct Fused {
  std::vector<Values> dx;
  Values dw, db;
};
inline Fused fused(const Problem& p, int micros) {
  Tensor w = p.weight.clone(), b = p.bias.clone();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Fused out;
  for (int k = 0; k < micros; ++k) {
    Tensor x = p.xs[k].clone();
    x.set_requires_grad(true);
    linear(x, w, b).backward(p.dys[k]);
    out.dx.push_back(values(x.grad()));
  }
  out.dw = values(w.grad());
  out.db = values(b.grad());
  return out;
}

// Σ over the given (dy, x) pairs of dyᵀ · x: what W would sum with the wrong micro-batches' tensors.
inline Values weight_grad_of(const Problem& p, const std::vector<std::pair<int, int>>& dy_x) {
  NoGradGuard no_grad;
  Tensor total = zeros({p.out, p.in});
  for (auto [d, x] : dy_x) total = add(total, matmul(p.dys[d], p.xs[x], true, false));
  return values(total);
}
}  // namespace exercise13
