// exercises/02_backward/student.cpp — GELU's backward, written as an autograd Function.
//
// GPT-2's MLP uses the tanh form of GELU (Hendrycks & Gimpel, 2016):
//
//   y = 0.5 x (1 + tanh(u)),      u = sqrt(2/pi) (x + 0.044715 x^3)
//
// The library has it (sl::gelu, tensor/ops/unary.cpp), forward and backward side by side. Here you write
// both halves yourself, then wire them into an sl::Function (autograd/function.h) so backward() finds them.
//
//   forward:   elementwise, any shape, keep the input's dtype (f32 in training, f64 for gradcheck)
//   backward:  receives grad_y (dL/dy, the shape of y) and returns grad_x = grad_y * dy/dx (the chain rule)
//
//   dy/dx = 0.5 (1 + tanh u)  +  0.5 x (1 - tanh(u)^2) du/dx,     du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//
// Build the result from library ops (sl::tanh, sl::mul, sl::add, sl::pow ... in tensor/ops.h): every op
// works on any floating dtype. backward runs with grad mode off, so these ops build no graph.
//
// Grade it:  make exercise N=02
#include <cmath>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise02 {

// PREDICT FIRST, before any code. What is GELU's slope dy/dx at x = 0, in the tanh form below?
// Work it out from the product rule on paper; replace the throw with your number.
double predicted_slope_at_zero() {
  throw exercises::NotImplemented("predicted_slope_at_zero (predict first)");
}

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise.
sl::Tensor gelu_forward(const sl::Tensor& x) {
  // TODO: compute u, then y. Keep x's shape and dtype.
  throw exercises::NotImplemented("gelu_forward");
}

// grad_x = grad_y * dy/dx at x (formula above). x and grad_y have the same shape.
sl::Tensor gelu_backward(const sl::Tensor& x, const sl::Tensor& grad_y) {
  // TODO: compute tanh(u) once, then both terms of dy/dx, then multiply by grad_y.
  throw exercises::NotImplemented("gelu_backward");
}

// The wiring (given): forward saves x, backward hands your gelu_backward the gradient of its output.
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
