// exercises/01_broadcasting/student.cpp — NumPy broadcasting, forward (the shape) and backward (the sum).
//
// Lesson 01 adds a bias [C] to every row of x [B, T, C] without copying it: the shapes line up from
// the right and the bias is "stretched" along B and T. The rule, for shapes a and b:
//
//   1. align from the right; the shorter shape gets leading 1s:   [C] vs [B, T, C]  ->  [1, 1, C]
//   2. per dim: equal sizes stay; a 1 stretches to the other size; anything else is an error
//
//        [B, T, C] + [C]        -> [B, T, C]
//        [B, 1, C] + [T, 1]     -> [B, T, C]        (each operand stretches a different dim)
//        [2, 3]    + [2]        -> error: 3 vs 2 in the last dim
//        []        + [V]        -> [V]              (a scalar has rank 0: all its dims are "missing")
//
// Its backward: out = a + b uses each element of b once per copy, so b's gradient is the SUM of the
// output gradient over the copies. For grad of the output's shape and the operand's shape:
//
//   - the dims broadcasting ADDED (the leading grad.dim() - shape.dim() dims): sum them away
//   - the dims it STRETCHED (shape[i] == 1, the grad's size not 1): sum them, keeping size 1 (keepdim)
//
//        grad [B, T, C] -> [C]          sum over B and T
//        grad [B, T, C] -> [B, 1, C]    sum over T, keep it as 1
//        grad [B, T, C] -> []           sum of everything
//
// Tools (tensor/shape.h, tensor/ops.h): Shape is a std::vector<int64_t> (dim(), str() prints
// "[2, 3]"); sl::sum(x, dim, keepdim) sums one dim; x.reshape(shape); x.shape(), x.dim(), x.size(d).
// Throw errors with SL_CHECK(condition, parts...) from tensor/error.h (it throws sl::Error). Do not
// call sl::broadcast_shapes or sl::sum_to: they are the answers.
//
// Grade it:  make exercise N=01
#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/shape.h"

namespace exercise01 {

// PREDICT FIRST, before any code. GPT-2 small adds the bias b [768] of a Linear to x [16, 256, 768]
// (B 16, T 256, C 768). In the backward, how many elements of the output's gradient are added into
// each element of b's gradient? Replace the throw with your number; the grader measures it.
double predicted_terms_per_bias_gradient() {
  throw exercises::NotImplemented("predicted_terms_per_bias_gradient (predict first)");
}

// The shape of add(a, b) under NumPy's rule. A pair that does not broadcast throws sl::Error whose
// message names both shapes, e.g. "shapes [2, 3] and [2] cannot be broadcast".
sl::Shape broadcast_shape(const sl::Shape& a, const sl::Shape& b) {
  // TODO: the result has max(a.dim(), b.dim()) dims; read each operand's size from the right
  // (a missing dim is 1), check the pair, keep the size that is not 1.
  throw exercises::NotImplemented("broadcast_shape");
}

// The backward of broadcasting: grad has the broadcast output's shape; return its sums with `shape`
// (the operand's shape). If `shape` does not broadcast to grad's shape, throw sl::Error.
sl::Tensor reduce_to_shape(const sl::Tensor& grad, const sl::Shape& shape) {
  // TODO: check that shape fits grad's shape; sum the leading added dims away; sum each stretched
  // size-1 dim with keepdim = true. Return a tensor of exactly `shape`.
  throw exercises::NotImplemented("reduce_to_shape");
}

}  // namespace exercise01
