// exercises/02_backward/wrong_ignores_grad_y.cpp — a wrong solution: backward returns dy/dx.
//
// A common mistake: gelu_backward returns the derivative dy/dx and forgets to multiply by grad_y. With
// a loss of y itself (grad_y = 1) the numbers even look right, but a backward receives dL/dy and must
// return dL/dx = grad_y * dy/dx (the chain rule): anything after GELU in the graph is lost otherwise.
// expect: your gradient ignores grad_y
#include <cmath>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise02 {

double predicted_slope_at_zero() { return 0.5; }

static sl::Tensor tanh_u(const sl::Tensor& x) {
  const double k = std::sqrt(2.0 / M_PI);
  return sl::tanh(sl::mul(sl::add(x, sl::mul(sl::pow(x, 3.0), 0.044715)), k));
}

sl::Tensor gelu_forward(const sl::Tensor& x) { return sl::mul(sl::mul(x, 0.5), sl::add(tanh_u(x), 1.0)); }

sl::Tensor gelu_backward(const sl::Tensor& x, const sl::Tensor& grad_y) {
  const sl::Tensor t = tanh_u(x);
  const sl::Tensor du = sl::mul(sl::add(sl::mul(sl::pow(x, 2.0), 3 * 0.044715), 1.0), std::sqrt(2.0 / M_PI));
  const sl::Tensor first = sl::mul(sl::add(t, 1.0), 0.5);
  const sl::Tensor second = sl::mul(sl::mul(sl::mul(x, 0.5), sl::sub(1.0, sl::mul(t, t))), du);
  return sl::add(first, second);  // dy/dx: grad_y is never used
}

struct GeluFn : sl::Function<GeluFn> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x) {
    ctx.save_for_backward({x});
    return gelu_forward(x);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    return {gelu_backward(ctx.saved()[0], grads[0])};
  }
};

sl::Tensor gelu(const sl::Tensor& x) { return GeluFn::apply(x); }

}  // namespace exercise02
