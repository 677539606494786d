// scalar_first.cpp — number op tensor: 2.0 - x, 1.0 / x (and 2.0 + x, 2.0 * x for symmetry).
//
// No Function of their own: each is a composition of differentiable ops, so autograd comes free.
//
//   a + x = x + a          a * x = x * a                 (commutative)
//   a - x = (-x) + a       dx = -dy                      (exact: negation rounds nothing)
//   a / x = [a] / x        dx = -dy a / x^2              ([a]: a one-element tensor of x's dtype,
//                                                         broadcast by div, so a / x rounds once)
//
// dtypes follow the tensor-op-number forms: integer tensors work for add, sub and mul, with a whole
// number a that fits their type; div is floating only.
#include <cmath>

#include "tensor/ops.h"

namespace sl {

Tensor add(double a, const Tensor& b) { return add(b, a); }

Tensor sub(double a, const Tensor& b) {
  // The check add(x, a) makes for integer tensors, made here so that the message names sub.
  if (is_integer(b.dtype())) {
    const double limit = b.dtype() == DType::i32 ? 2147483648.0 : 9223372036854775808.0;  // 2^31, 2^63
    SL_CHECK(a >= -limit && a < limit && a == std::trunc(a), "sub: the scalar ", a, " does not suit the ",
             dtype_name(b.dtype()), " tensor (shape ", b.shape(),
             "): integer tensors take only whole numbers that fit their type");
  }
  return add(neg(b), a);
}

Tensor mul(double a, const Tensor& b) { return mul(b, a); }

Tensor div(double a, const Tensor& b) {
  SL_CHECK(is_floating(b.dtype()), "div: cannot divide ", a, " by the ", dtype_name(b.dtype()), " tensor of shape ",
           b.shape(), ": div is floating only (cast with .to(dtype) first)");
  return div(scalar_tensor(a, b.options()), b);
}

}  // namespace sl
