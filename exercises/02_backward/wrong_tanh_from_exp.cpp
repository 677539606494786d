// exercises/02_backward/wrong_tanh_from_exp.cpp — a wrong solution: tanh built from exp.
//
// A common mistake: tanh(u) written out as (exp(2u) - 1) / (exp(2u) + 1). The algebra is right and
// every f64 check near 0 passes, but in f32 exp(2u) overflows to inf once u > 44 (x > about 9), and
// inf / inf is NaN: one large activation poisons the whole step. sl::tanh saturates to ±1 instead.
// expect: compute tanh with sl::tanh, not from exp
#include <cmath>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise02 {

double predicted_slope_at_zero() { return 0.5; }

static sl::Tensor tanh_u(const sl::Tensor& x) {
  const double k = std::sqrt(2.0 / M_PI);
  const sl::Tensor e = sl::exp(sl::mul(sl::add(x, sl::mul(sl::pow(x, 3.0), 0.044715)), 2 * k));  // exp(2u)
  return sl::div(sl::sub(e, 1.0), sl::add(e, 1.0));
}

sl::Tensor gelu_forward(const sl::Tensor& x) { return sl::mul(sl::mul(x, 0.5), sl::add(tanh_u(x), 1.0)); }

sl::Tensor gelu_backward(const sl::Tensor& x, const sl::Tensor& grad_y) {
  const sl::Tensor t = tanh_u(x);
  const sl::Tensor du = sl::mul(sl::add(sl::mul(sl::pow(x, 2.0), 3 * 0.044715), 1.0), std::sqrt(2.0 / M_PI));
  const sl::Tensor first = sl::mul(sl::add(t, 1.0), 0.5);
  const sl::Tensor second = sl::mul(sl::mul(sl::mul(x, 0.5), sl::sub(1.0, sl::mul(t, t))), du);
  return sl::mul(grad_y, sl::add(first, second));
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
