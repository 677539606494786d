// exercises/02_backward/grader.cpp — grades GELU's forward and backward (student.cpp).
//
// Reference: the library's sl::gelu and its own backward (autograd through sl::gelu); gradcheck
// (autograd/gradcheck.h) compares the Function's backward with finite differences in f64.
// With -DSL_SOLUTION the library's sl::gelu stands in for the student's functions.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "exercises/grader_values.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::all_close;
using exercises::expect;

namespace exercise02 {
double predicted_slope_at_zero();
Tensor gelu_forward(const Tensor& x);
Tensor gelu_backward(const Tensor& x, const Tensor& grad_y);
Tensor gelu(const Tensor& x);
}  // namespace exercise02

#ifdef SL_SOLUTION
// The library's GELU: forward with no graph, backward through its own autograd.
namespace solution {
Tensor gelu_forward(const Tensor& x) {
  NoGradGuard no_grad;
  return sl::gelu(x);
}
Tensor gelu_backward(const Tensor& x, const Tensor& grad_y) {
  Tensor leaf = x.detach().clone();
  leaf.set_requires_grad(true);
  sl::gelu(leaf).backward(grad_y);
  return leaf.grad();
}
Tensor gelu(const Tensor& x) { return sl::gelu(x); }
// y = x·Φ(x): dy/dx = Φ(x) + x·Φ'(x); at 0 the second term vanishes and Φ(0) = 0.5 (tanh 0 = 0).
double predicted_slope_at_zero() { return 0.5 * (1 + 0.0) + 0.0; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise02;
#endif

// The library's derivative dy/dx * grad_y, the value every backward is held to.
static std::vector<double> reference_backward(const Tensor& x, const Tensor& grad_y) {
  Tensor leaf = x.detach().clone();
  leaf.set_requires_grad(true);
  sl::gelu(leaf).backward(grad_y);
  return leaf.grad().to_vector();
}

static std::string show(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

static std::string first_difference(const Tensor& x, const std::vector<double>& got, const std::vector<double>& want) {
  const std::vector<double> xs = x.to_vector();
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-9 * (1 + std::abs(want[i]))))
      return "at x = " + show(xs[i]) + ": you give " + show(got[i]) + ", expected " + show(want[i]);
  return "";
}

// Common slips, each as dy/dx at x: the student's backward is compared with them to say which it is.
static double derivative_variant(double x, const std::string& slip) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  const double t = std::tanh(k * (x + c * x * x * x));
  const double du = k * (1 + (slip == "inner" ? c : 3 * c) * x * x);
  if (slip == "first_term_only") return 0.5 * (1 + t);
  if (slip == "no_half") return (1 + t) + x * (1 - t * t) * du;
  if (slip == "tanh_not_squared") return 0.5 * (1 + t) + 0.5 * x * (1 - t) * du;
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du;  // "inner" changes du only
}

static std::string diagnose_backward(const Tensor& x, const std::vector<double>& got) {
  const std::vector<double> xs = x.to_vector();
  const std::vector<std::pair<std::string, std::string>> slips = {
      {"first_term_only", "you return 0.5 (1 + tanh u) only: the product rule's second term, 0.5 x (1 - tanh^2 u) du/dx, is missing"},
      {"no_half", "your derivative is 2x the expected one: the factor 0.5 is missing"},
      {"tanh_not_squared", "you wrote (1 - tanh u) where d/du tanh(u) = 1 - tanh(u)^2"},
      {"inner", "du/dx is wrong: d/dx (x + 0.044715 x^3) = 1 + 3 * 0.044715 x^2 (the 3 is missing)"}};
  for (const auto& [slip, message] : slips) {
    std::vector<double> want;
    for (double v : xs) want.push_back(derivative_variant(v, slip));
    if (all_close(got, want, 1e-9, 1e-9)) return message;
  }
  return "";
}

// The prediction's measured value: autograd's dy/dx of the library's sl::gelu at x = 0.
static double measured_slope_at_zero() {
  Tensor x = zeros({1});
  x.set_requires_grad(true);
  sum(gelu(x)).backward();
  return x.grad().to_vector()[0];
}

int main() {
  exercises::Grader grader("02_backward");
  grader.predict("GELU's slope dy/dx at x = 0", impl::predicted_slope_at_zero, measured_slope_at_zero, 1e-6, "(dy/dx)");
  // x from -6 to 6 in f64 (and 0 itself): the tails, the bend and the middle.
  std::vector<double> xs;
  for (int i = -24; i <= 24; ++i) xs.push_back(i * 0.25);
  const Tensor x64 = from_vector(xs, Shape({7, 7}), DType::f64);

  grader.check("gelu_forward: the tanh form of GELU, same shape and dtype as x", [&] {
    const Tensor y = impl::gelu_forward(x64);
    expect(y.defined(), "gelu_forward returned an undefined Tensor");
    expect(y.shape() == x64.shape(), "gelu_forward changed the shape: got " + y.shape().str() + ", expected [7, 7]");
    expect(y.dtype() == DType::f64, "gelu_forward changed the dtype of an f64 input: keep x's dtype");
    NoGradGuard no_grad;
    const std::vector<double> got = y.to_vector(), want = sl::gelu(x64).to_vector();
    std::vector<double> erf_form;
    for (double v : xs) erf_form.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    expect(!all_close(got, erf_form, 1e-12, 1e-12) || all_close(got, want, 1e-12, 1e-12),
           "you computed the erf form of GELU; GPT-2 (and this exercise) uses the tanh approximation");
    expect(all_close(got, want, 1e-12, 1e-12), "forward differs from sl::gelu " + first_difference(x64, got, want));
    const Tensor y32 = impl::gelu_forward(x64.to(DType::f32));
    expect(y32.dtype() == DType::f32, "gelu_forward of an f32 input must stay f32");
  });

  grader.check("gelu_backward: dy/dx with grad_y = 1", [&] {
    const Tensor ones = full(x64.shape(), 1.0, DType::f64);
    const Tensor g = impl::gelu_backward(x64, ones);
    expect(g.defined() && g.shape() == x64.shape(), "gelu_backward must return a Tensor of x's shape");
    const std::vector<double> got = g.to_vector(), want = reference_backward(x64, ones);
    if (!all_close(got, want, 1e-9, 1e-9)) {
      const std::string slip = diagnose_backward(x64, got);
      expect(false, slip.empty() ? "dy/dx differs from the library's " + first_difference(x64, got, want) : slip);
    }
  });

  grader.check("gelu_backward: multiplies by grad_y (the chain rule)", [&] {
    std::vector<double> gys;
    for (size_t i = 0; i < xs.size(); ++i) gys.push_back(0.5 + std::sin(3.0 * i));
    const Tensor grad_y = from_vector(gys, x64.shape(), DType::f64);
    const std::vector<double> got = impl::gelu_backward(x64, grad_y).to_vector();
    const std::vector<double> want = reference_backward(x64, grad_y);
    const std::vector<double> with_ones = reference_backward(x64, full(x64.shape(), 1.0, DType::f64));
    expect(!all_close(got, with_ones, 1e-9, 1e-9),
           "your gradient ignores grad_y: backward must return grad_y * dy/dx, the gradient of the loss, not dy/dx");
    expect(all_close(got, want, 1e-9, 1e-9),
           "grad_y * dy/dx differs from the library's " + first_difference(x64, got, want));
  });

  grader.check("gradcheck: the Function's backward against finite differences (f64)", [&] {
    Tensor x = from_vector(xs, Shape({7, 7}), DType::f64);
    x.set_requires_grad(true);
    const GradcheckResult result = gradcheck([](const TensorList& in) { return impl::gelu(in[0]); }, {x});
    expect(result.ok, "gradcheck failed: " + result.message);
    expect(result.checked == 49, "gradcheck compared " + std::to_string(result.checked) + " elements, expected 49");
  });

  grader.check("large |x|: finite, y -> x and dy/dx -> 1 for x >> 0, both -> 0 for x << 0", [&] {
    const Tensor big = from_vector({-50, -20, 20, 50}, Shape({4}), DType::f32);
    const std::vector<double> y = impl::gelu_forward(big).to_vector();
    const std::vector<double> g = impl::gelu_backward(big, full({4}, 1.0)).to_vector();
    for (int i = 0; i < 4; ++i)
      expect(std::isfinite(y[i]) && std::isfinite(g[i]),
             "NaN or inf at x = " + std::to_string(big.to_vector()[i]) +
                 " in f32: compute tanh with sl::tanh, not from exp (exp(2u) overflows)");
    expect(all_close(y, {0, 0, 20, 50}, 1e-6, 1e-6) && all_close(g, {0, 0, 1, 1}, 1e-6, 1e-6),
           "at x = -50, -20, 20, 50 expected y = 0, 0, 20, 50 and dy/dx = 0, 0, 1, 1");
  });

  return grader.finish();
}
