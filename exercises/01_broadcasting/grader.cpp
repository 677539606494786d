// exercises/01_broadcasting/grader.cpp — grades broadcast_shape and reduce_to_shape (student.cpp).
//
// References, computed here independently of the student's code:
//   the shape:     sl::add(zeros(a), zeros(b)).shape(), and whether add refuses the pair (sl::Error)
//   the backward:  x.grad after sum(mul(x, y)).backward(): autograd's own gradient of a broadcast
//                  operand x, which the student reproduces from grad = y stretched to the output shape
// With -DSL_SOLUTION the library's sl::broadcast_shapes and sl::sum_to stand in for the student's.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "exercises/grader_values.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::all_close;
using exercises::expect;

namespace exercise01 {
Shape broadcast_shape(const Shape& a, const Shape& b);
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape);
double predicted_terms_per_bias_gradient();
}  // namespace exercise01

#ifdef SL_SOLUTION
namespace solution {
Shape broadcast_shape(const Shape& a, const Shape& b) { return sl::broadcast_shapes(a, b, "broadcast_shape"); }
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) { return sl::sum_to(grad, shape); }
double predicted_terms_per_bias_gradient() { return 16.0 * 256; }  // the dims broadcasting added: B·T
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise01;
#endif

// ---- the shape -----------------------------------------------------------------------------------

// The library's answer: the shape add produces, or "refused" when add throws sl::Error.
static bool library_refuses(const Shape& a, const Shape& b) {
  try {
    (void)add(zeros(a), zeros(b));
    return false;
  } catch (const Error&) {
    return true;
  }
}

// The slip of aligning from the LEFT: the shorter shape padded with 1s at the end. Empty if that fails.
static Shape left_aligned(const Shape& a, const Shape& b) {
  const int ndim = std::max(a.dim(), b.dim());
  Shape out(ndim, 1);
  for (int i = 0; i < ndim; ++i) {
    const int64_t sa = i < a.dim() ? a[i] : 1, sb = i < b.dim() ? b[i] : 1;
    if (sa != sb && sa != 1 && sb != 1) return {};
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

static std::string pair_text(const Shape& a, const Shape& b) { return a.str() + " and " + b.str(); }

// One pair that the library broadcasts: the student's shape must equal add's, both orders.
static void expect_shape(const Shape& a, const Shape& b) {
  const Shape want = add(zeros(a), zeros(b)).shape();
  for (const auto& [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    Shape got;
    try {
      got = impl::broadcast_shape(x, y);
    } catch (const Error& e) {
      expect(!(x.dim() != y.dim() && left_aligned(x, y).empty()),
             "you refused " + pair_text(x, y) + ", which broadcast to " + want.str() +
                 ": you aligned the shapes from the left; NumPy aligns from the RIGHT (a bias [C] meets the last dim)");
      expect(false, "you refused " + pair_text(x, y) + ", which broadcast to " + want.str() +
                        " (a size-1 or missing dim stretches): " + e.what());
    }
    if (got == want) continue;
    const Shape left = left_aligned(x, y);
    expect(!(x.dim() != y.dim() && got == left),
           "for " + pair_text(x, y) + " you give " + got.str() + ", expected " + want.str() +
               ": you aligned the shapes from the left; NumPy aligns from the RIGHT (a bias [C] meets the last dim)");
    expect(got.dim() == want.dim(), "for " + pair_text(x, y) + " you give " + got.str() + ", expected " + want.str() +
                                        ": the result has max(rank a, rank b) dims");
    expect(false, "for " + pair_text(x, y) + " you give " + got.str() + ", expected " + want.str() +
                      ": where one size is 1, the result takes the OTHER size (the 1 stretches)");
  }
}

static void check_shapes(exercises::Grader& grader) {
  grader.check("broadcast_shape: equal shapes, scalars [] and rank 0-4", [] {
    for (const Shape& s : {Shape{}, Shape{5}, Shape{2, 3}, Shape{2, 3, 4}, Shape{2, 1, 3, 4}}) expect_shape(s, s);
    for (const Shape& s : {Shape{1}, Shape{7}, Shape{2, 3}, Shape{2, 1, 3, 4}}) expect_shape(Shape{}, s);
  });
  grader.check("broadcast_shape: size-1 dims stretch, in either operand", [] {
    expect_shape({3, 1}, {1, 4});
    expect_shape({2, 1, 4}, {2, 3, 1});
    expect_shape({1, 1}, {5, 6});
    expect_shape({2, 1, 3, 1}, {1, 4, 1, 5});
  });
  grader.check("broadcast_shape: different ranks align from the right", [] {
    expect_shape({4}, {2, 3, 4});
    expect_shape({3, 1}, {2, 1, 1, 5});
    expect_shape({5, 1}, {2, 5, 3});
    expect_shape({2, 3}, {4, 1, 2, 3});
  });
  grader.check("broadcast_shape: a mismatch is refused with sl::Error naming both shapes", [] {
    const std::vector<std::pair<Shape, Shape>> bad = {
        {{2, 3}, {2}}, {{3}, {4}}, {{2, 3, 4}, {3, 1, 5}}, {{2, 1}, {4, 3, 3}}, {{4, 2, 3}, {4, 3}}};
    for (const auto& [a, b] : bad) {
      expect(library_refuses(a, b), "grader bug: add accepts " + pair_text(a, b));
      bool refused = false;
      try {
        const Shape got = impl::broadcast_shape(a, b);
        expect(got != left_aligned(a, b), "you accepted " + pair_text(a, b) + " (gave " + got.str() +
                                              "): you aligned from the left; from the right the sizes clash");
        expect(false, "you accepted " + pair_text(a, b) + " (gave " + got.str() +
                          "), which add refuses: sizes that differ and are not 1 must throw sl::Error");
      } catch (const Error& e) {
        refused = true;
        const std::string message = e.what();
        expect(message.find(a.str()) != std::string::npos && message.find(b.str()) != std::string::npos,
               "your error for " + pair_text(a, b) + " reads \"" + message +
                   "\": name both shapes (Shape::str() or streamed into SL_CHECK) so the user sees what clashed");
      }
      expect(refused, "no sl::Error for " + pair_text(a, b));
    }
  });
}

// ---- the backward --------------------------------------------------------------------------------

// y of `shape` with distinct, non-symmetric values (no two slips give the same numbers), in f64.
static Tensor distinct_values(const Shape& shape) {
  std::vector<double> values(shape.numel());
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(1.3 * i + 0.4) + 0.01 * i;
  return from_vector(values, shape, DType::f64);
}

static Shape without_ones(const Shape& shape) {
  Shape out;
  for (int64_t s : shape)
    if (s != 1) out.push_back(s);
  return out;
}

// Says what is wrong with a result of the wrong shape.
static std::string diagnose_shape(const Shape& got, const Shape& want, const Shape& grad_shape) {
  const std::string head = "reduce_to_shape(grad " + grad_shape.str() + ", " + want.str() + ") has shape " + got.str();
  if (got == without_ones(want))
    return head + ": you dropped the size-1 dims; sum a stretched dim with keepdim = true so the 1 stays";
  if (got.dim() == grad_shape.dim() && got.dim() != want.dim())
    return head + ": you kept the leading dims broadcasting added; sum them away (the result has " +
           std::to_string(want.dim()) + " dims)";
  return head + ", expected " + want.str() + ": the result must have exactly the operand's shape";
}

// x of x_shape times y of y_shape: autograd's x.grad against reduce_to_shape(y stretched, x_shape).
static void expect_backward(const Shape& x_shape, const Shape& y_shape) {
  Tensor x = distinct_values(x_shape);
  x.set_requires_grad(true);
  const Tensor y = distinct_values(y_shape);
  sum(mul(x, y)).backward();
  const std::vector<double> want = x.grad().to_vector();
  Tensor grad;  // d sum(x * y) / d out = 1, times y: y stretched to the output's shape
  {
    NoGradGuard no_grad;
    grad = mul(ones(broadcast_shapes(x_shape, y_shape, "grader"), DType::f64), y);
  }
  Tensor got;
  try {
    got = impl::reduce_to_shape(grad, x_shape);
  } catch (const Error& e) {
    expect(false, "reduce_to_shape(grad " + grad.shape().str() + ", " + x_shape.str() + ") threw sl::Error, but " +
                      x_shape.str() + " broadcasts to " + grad.shape().str() + " (check broadcast_shape first): " + e.what());
  }
  expect(got.defined(), "reduce_to_shape returned an undefined Tensor");
  expect(got.shape() == x_shape, diagnose_shape(got.shape(), x_shape, grad.shape()));
  const std::vector<double> values = got.to_vector();
  if (all_close(values, want, 1e-9, 1e-9)) return;
  const std::string head = "reduce_to_shape(grad " + grad.shape().str() + ", " + x_shape.str() + ")";
  const double copies = double(grad.numel()) / double(x_shape.numel());
  std::vector<double> averaged = want;
  for (double& v : averaged) v /= copies;
  expect(!all_close(values, averaged, 1e-9, 1e-9),
         head + " is the mean over the copies, " + std::to_string(int(copies)) +
             "x too small: an operand used once per copy gets the SUM of their gradients");
  if (x_shape.dim() == 1 && grad.dim() == 2) {
    NoGradGuard no_grad;
    expect(!all_close(values, sum(grad, 1).to_vector(), 1e-9, 1e-9),
           head + ": you summed the LAST dim; align from the right, so [C] matches grad's last dim and dim 0 is summed");
  }
  for (size_t i = 0; i < values.size(); ++i)
    expect(std::abs(values[i] - want[i]) <= 1e-9 * (1 + std::abs(want[i])),
           head + " at flat index " + std::to_string(i) + " gives " + std::to_string(values[i]) + ", autograd's x.grad " +
               std::to_string(want[i]) + ": summed over the wrong dims? sum exactly the added and the stretched ones");
}

static void check_backward(exercises::Grader& grader) {
  grader.check("reduce_to_shape: a shape equal to grad's keeps grad's values", [] {
    expect_backward({2, 3}, {2, 3});
    expect_backward({2, 3, 4}, {2, 3, 4});
  });
  grader.check("reduce_to_shape: the added leading dims summed away (a bias [C] under [B, T, C])", [] {
    expect_backward({3}, {3, 3});
    expect_backward({4}, {2, 3, 4});
    expect_backward({3, 4}, {2, 3, 4});
  });
  grader.check("reduce_to_shape: stretched size-1 dims summed and kept as 1 (keepdim)", [] {
    expect_backward({2, 1, 4}, {2, 3, 4});
    expect_backward({1, 4}, {3, 4});
    expect_backward({3, 1}, {3, 4});
    expect_backward({1, 1}, {2, 3});
  });
  grader.check("reduce_to_shape: scalars, both operands stretched, rank 4: equal to autograd's x.grad", [] {
    expect_backward({}, {2, 3});
    expect_backward({1}, {2, 3});
    expect_backward({2, 1, 4}, {3, 1});
    expect_backward({3, 1, 5}, {2, 1, 4, 1});
    expect_backward({1, 3, 1, 1}, {2, 3, 4, 5});
  });
  grader.check("reduce_to_shape: a shape that does not broadcast to grad's is refused with sl::Error", [] {
    const Tensor grad = distinct_values({2, 3});
    for (const Shape& bad : {Shape{2}, Shape{4, 3}, Shape{2, 2, 3}, Shape{3, 3}}) {
      bool refused = false;
      try {
        const Tensor got = impl::reduce_to_shape(grad, bad);
        expect(false, "reduce_to_shape(grad [2, 3], " + bad.str() + ") gave " + got.shape().str() +
                          ": that shape does not broadcast to [2, 3], so it was never its operand; throw sl::Error");
      } catch (const Error&) {
        refused = true;
      }
      expect(refused, "no sl::Error for " + bad.str());
    }
  });
}

// The prediction's measured value: b.grad[0] of sum(x + b) is the number of output elements that used
// b[0], since each contributes a gradient of exactly 1.
static double measured_terms_per_bias_gradient() {
  const Tensor x = zeros({16, 256, 768});
  Tensor b = zeros({768});
  b.set_requires_grad(true);
  sum(add(x, b)).backward();
  return b.grad().to_vector()[0];
}

int main() {
  exercises::Grader grader("01_broadcasting");
  grader.predict("terms summed into one element of a bias [768]'s gradient under x [16, 256, 768]",
                 impl::predicted_terms_per_bias_gradient, measured_terms_per_bias_gradient, 0, "terms");
  check_shapes(grader);
  check_backward(grader);
  return grader.finish();
}
