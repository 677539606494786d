// sliced_cross_entropy.h — the per-row kernels of a cross-entropy whose classes are cut into slices,
// one per rank (the vocab-parallel loss of Megatron-LM: parallel/tensor_parallel/vocab.h). Between
// them the caller combines the rows over the ranks: an all-reduce max of m, then sums of S and xt.
//
//   x [N, Vs]  this slice's logits (f32 or f64), of which the first `real` columns are classes and
//              the rest padding (never counted)
//   target_column [N] i64: the row's target as a column of this slice, -1 when it is not here
//   ignored [N] i32: 1 for a row whose target is ignore_index (it adds no gradient)
//
//   slice_row_max       m[n]  = max over my real columns of x[n, v]     (-inf when I hold none)
//   slice_row_sums      S[n]  = Σ over my real columns of exp(x[n, v] - m[n])
//                       xt[n] = x[n, target_column[n]] - m[n] where the target is mine, else 0
//   slice_cross_entropy_grad
//                       dx[n, v] = (exp(x[n, v] - m[n]) / S[n] - [v == target_column[n]]) · scale,
//                       0 for ignored rows and padding columns
//   with m and S already combined over the ranks (the whole row's max and Σ exp).
//
// CPU tensors run row loops (each row summed in order, in x's dtype); CUDA tensors the same math as
// engine ops (composed:: below, which also runs on CPU tensors: tests/tensor/test_sliced_cross_entropy.cpp
// checks it against the loops). No autograd: the vocab-parallel loss is the Function around them.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace sl {

struct SliceRowSums {
  Tensor sum_exp;       // S [N]
  Tensor target_logit;  // xt [N]
};

Tensor slice_row_max(const Tensor& x, int64_t real);
SliceRowSums slice_row_sums(const Tensor& x, const Tensor& m, const Tensor& target_column, int64_t real);
Tensor slice_cross_entropy_grad(const Tensor& x, const Tensor& m, const Tensor& sum_exp, const Tensor& target_column,
                                const Tensor& ignored, double scale, int64_t real);

namespace composed {
Tensor slice_row_max(const Tensor& x, int64_t real);
SliceRowSums slice_row_sums(const Tensor& x, const Tensor& m, const Tensor& target_column, int64_t real);
Tensor slice_cross_entropy_grad(const Tensor& x, const Tensor& m, const Tensor& sum_exp, const Tensor& target_column,
                                const Tensor& ignored, double scale, int64_t real);
}  // namespace composed

}  // namespace sl
