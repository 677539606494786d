// exercises/01_broadcasting/wrong_mean_over_copies.cpp — a wrong reduce_to_shape: the copies' gradients averaged.
//
// A common mistake: "the operand was copied k times, so its gradient is the average of the copies'".
// Each copy of the element went into the output and changed the loss on its own: the chain rule adds
// their contributions. With mean a bias [C] under [B, T, C] learns B·T times too slowly. Shapes come
// out right, so only the values show it.
// expect: is the mean over the copies
#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/shape.h"

namespace exercise01 {

double predicted_terms_per_bias_gradient() { return 16 * 256; }  // one term per row of [B, T]

sl::Shape broadcast_shape(const sl::Shape& a, const sl::Shape& b) {
  throw exercises::NotImplemented("broadcast_shape");
}

sl::Tensor reduce_to_shape(const sl::Tensor& grad, const sl::Shape& shape) {
  const int lead = grad.dim() - shape.dim();
  SL_CHECK(lead >= 0, shape.str(), " does not broadcast to ", grad.shape().str());
  for (int i = 0; i < shape.dim(); ++i)
    SL_CHECK(shape[i] == 1 || shape[i] == grad.size(lead + i), shape.str(), " does not broadcast to ",
             grad.shape().str());
  sl::Tensor g = grad;
  for (int i = 0; i < lead; ++i) g = sl::mean(g, 0);  // the mistake: the copies' gradients add up, mean divides
  for (int i = 0; i < shape.dim(); ++i)
    if (shape[i] == 1 && g.size(i) != 1) g = sl::mean(g, i, /*keepdim=*/true);
  return g;
}

}  // namespace exercise01
