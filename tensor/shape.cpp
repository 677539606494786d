#include "tensor/shape.h"

#include <sstream>

#include "tensor/error.h"

namespace sl {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t size : *this) n *= size;
  return n;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  return out << ']';
}

int normalize_dim(int dim, const Shape& shape, const char* op) {
  int ndim = shape.dim();
  SL_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim, " is out of range for a tensor of shape ", shape,
           " (expected a dim in [", -ndim, ", ", ndim - 1, "])");
  return dim < 0 ? dim + ndim : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int ndim = std::max(a.dim(), b.dim());
  Shape out(ndim, 1);
  for (int i = 0; i < ndim; ++i) {
    int64_t sa = i < ndim - a.dim() ? 1 : a[i - (ndim - a.dim())];
    int64_t sb = i < ndim - b.dim() ? 1 : b[i - (ndim - b.dim())];
    SL_CHECK(sa == sb || sa == 1 || sb == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast (dim ", i,
             " of the result: ", sa, " vs ", sb, ")");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = shape.dim() - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

}  // namespace sl
