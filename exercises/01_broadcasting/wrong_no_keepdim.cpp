// exercises/01_broadcasting/wrong_no_keepdim.cpp — a wrong reduce_to_shape: the stretched dims summed away.
//
// A common mistake: summing a stretched size-1 dim with keepdim = false. The values are right, but
// an operand of shape [B, 1, C] gets a gradient [B, C]: the optimizer cannot add it to the weight
// (or, worse, a later broadcast lines it up with other dims). Leading dims that broadcasting ADDED
// are summed away; dims it STRETCHED keep their size 1.
// expect: you dropped the size-1 dims; sum a stretched dim with keepdim = true
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
  for (int i = 0; i < lead; ++i) g = sl::sum(g, 0);          // the added leading dims
  for (int i = shape.dim() - 1; i >= 0; --i)                 // from the right, so the dims left of i keep their index
    if (shape[i] == 1 && g.size(i) != 1) g = sl::sum(g, i);  // the mistake: keepdim = false drops the 1
  return g;
}

}  // namespace exercise01
