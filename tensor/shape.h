// shape.h — tensor shapes and the NumPy broadcasting rule.
//
// Shape is a list of sizes, outermost first ([B, T, C]); it prints as [2, 3, 4]. Negative dims
// count from the end (-1 is the last), as in PyTorch.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace sl {

struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(const std::vector<int64_t>& sizes) : std::vector<int64_t>(sizes) {}  // NOLINT
  int64_t numel() const;                                                     // product of the sizes; 1 for a scalar []
  int dim() const { return static_cast<int>(size()); }
  std::string str() const;  // "[2, 3]"
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

// Maps dim in [-ndim, ndim) to [0, ndim), or throws "op: dim d out of range for a tensor of shape [...]".
int normalize_dim(int dim, const Shape& shape, const char* op);

// The shape two broadcast operands produce, or throws "op: shapes [..] and [..] cannot be broadcast".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Row-major strides (in elements) of a contiguous tensor of this shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);

}  // namespace sl
