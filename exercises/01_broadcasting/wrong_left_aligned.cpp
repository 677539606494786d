// exercises/01_broadcasting/wrong_left_aligned.cpp — a wrong broadcast_shape: shapes aligned from the left.
//
// A common mistake: padding the shorter shape with 1s at the END, so dim 0 meets dim 0. Shapes of
// equal rank come out right, which hides it, but a bias [C] under x [B, T, C] then meets B instead of
// C and is refused (or, when the sizes happen to agree, stretched along the wrong dim). NumPy aligns
// from the right: the missing dims are the leading ones.
// expect: you aligned the shapes from the left; NumPy aligns from the RIGHT
#include <algorithm>

#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/shape.h"

namespace exercise01 {

double predicted_terms_per_bias_gradient() { return 16 * 256; }  // one term per row of [B, T]

sl::Shape broadcast_shape(const sl::Shape& a, const sl::Shape& b) {
  const int ndim = std::max(a.dim(), b.dim());
  sl::Shape out(ndim, 1);
  for (int i = 0; i < ndim; ++i) {  // the mistake: dim i of a meets dim i of b, counted from the left
    const int64_t sa = i < a.dim() ? a[i] : 1, sb = i < b.dim() ? b[i] : 1;
    SL_CHECK(sa == sb || sa == 1 || sb == 1, "shapes ", a.str(), " and ", b.str(), " cannot be broadcast");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

sl::Tensor reduce_to_shape(const sl::Tensor& grad, const sl::Shape& shape) {
  throw exercises::NotImplemented("reduce_to_shape");
}

}  // namespace exercise01
