// Elementwise ops (tensor/ops/unary.cpp, binary.cpp): values against hand-worked numbers and simple
// reference loops, broadcasting, error messages, bf16/f16 against f32, and gradchecks in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

Tensor f64(std::vector<double> values, Shape shape) { return from_vector(values, shape, kF64); }

using test_support::expect_close;  // every element within the tolerance (tests/support/compare.h)

// ---- unary forward -----------------------------------------------------------------------------------

struct UnaryOp {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> reference;
  bool positive_inputs;  // log, sqrt, rsqrt, pow with a fractional exponent
};

const std::vector<UnaryOp>& unary_ops() {
  static const std::vector<UnaryOp> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, false},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, false},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, true},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, true},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, false},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, false},
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, false},
      {"pow2", [](const Tensor& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, false},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, false},
      {"pow_half", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, true},
      {"pow_minus_1_5", [](const Tensor& x) { return pow(x, -1.5); }, [](double x) { return std::pow(x, -1.5); }, true},
      {"pow0", [](const Tensor& x) { return pow(x, 0.0); }, [](double) { return 1.0; }, false},
  };
  return ops;
}

std::vector<double> inputs_for(const UnaryOp& op) {
  if (op.positive_inputs) return {0.1, 0.5, 1.0, 2.0, 3.7, 10.0};
  return {-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.5};
}

TEST(Elementwise, UnaryMatchesAReferenceLoopInF64) {
  for (const UnaryOp& op : unary_ops()) {
    SCOPED_TRACE(op.name);
    std::vector<double> x = inputs_for(op), want;
    for (double v : x) want.push_back(op.reference(v));
    Tensor y = op.op(f64(x, {static_cast<int64_t>(x.size())}));
    EXPECT_EQ(y.dtype(), DType::f64);
    expect_close(y.to_vector(), want, {.atol = 1e-14}, op.name);
  }
}

TEST(Elementwise, UnaryHandWorkedValues) {
  // gelu(1) = 0.5 (1 + tanh(0.7978845608 * 1.044715)) = 0.8411919906
  expect_close(gelu(f64({-1, 0, 1}, {3})).to_vector(), {-0.15880800939172324, 0.0, 0.8411919906082768}, {.atol = 1e-15},
               "gelu");
  EXPECT_EQ(relu(f64({-2, 0, 3}, {3})).to_vector(), (std::vector<double>{0, 0, 3}));
  EXPECT_EQ(sigmoid(f64({0}, {1})).item(), 0.5);
  EXPECT_EQ(rsqrt(f64({4}, {1})).item(), 0.5);
  EXPECT_EQ(pow(f64({2, 3}, {2}), 2.0).to_vector(), (std::vector<double>{4, 9}));
  // Saturated sigmoid is 0 and 1, not NaN, even where e^-x overflows.
  EXPECT_EQ(sigmoid(from_vector({-1000, 1000}, {2})).to_vector(), (std::vector<double>{0, 1}));
  EXPECT_TRUE(std::isnan(relu(f64({NAN}, {1})).item()));  // NaN propagates
}

TEST(Elementwise, GeluIsAccurateInF32AndFiniteAtTheTails) {
  // Reference: the tanh form in long double (1 + tanh u keeps 12+ digits down to x = -5).
  std::vector<double> xs;
  for (double x = -5; x <= 12; x += 0.01) xs.push_back(static_cast<double>(static_cast<float>(x)));
  std::vector<double> got = gelu(from_vector(xs, {static_cast<int64_t>(xs.size())})).to_vector();
  for (size_t i = 0; i < xs.size(); ++i) {
    long double x = xs[i], u = std::sqrt(2.0L / M_PI) * (x + 0.044715L * x * x * x);
    double want = static_cast<double>(0.5L * x * (1 + std::tanh(u)));
    EXPECT_NEAR(got[i], want, 5e-6 * std::abs(want) + 1e-30) << "x = " << xs[i];
  }
  // Far left e^-2u overflows: y = 0 and dy/dx = 0, not NaN; far right y = x, dy/dx = 1.
  Tensor tails = from_vector({-100, 100}, {2}, TensorOptions{}.with_requires_grad());
  Tensor y = gelu(tails);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{0, 100}));
  y.backward(ones({2}));
  EXPECT_EQ(tails.grad().to_vector(), (std::vector<double>{0, 1}));
}

TEST(Elementwise, UnaryKeepsShapeAndHandlesEmptyAndScalar) {
  EXPECT_EQ(exp(zeros({2, 0, 3})).shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(exp(scalar_tensor(0.0)).item(), 1.0);
  EXPECT_EQ(tanh(zeros({4, 5})).shape(), (Shape{4, 5}));
}

TEST(Elementwise, NegNegatesIntegersAndOtherUnaryOpsRejectThem) {
  Tensor ids = from_vector({1, -2, 3}, {3}, TensorOptions{DType::i64});
  Tensor negated = neg(ids);
  EXPECT_EQ(negated.dtype(), DType::i64);
  EXPECT_EQ(negated.to_vector(), (std::vector<double>{-1, 2, -3}));
  std::string message = message_of([&] { gelu(ids); });
  EXPECT_NE(message.find("gelu: expected a floating tensor"), std::string::npos) << message;
  EXPECT_NE(message.find("i64"), std::string::npos) << message;
}

TEST(Elementwise, SavedOutputDoesNotKeepItselfAlive) {
  // exp saves its output for backward; the node must not hold the very tensor that holds the node.
  Tensor x = randn({3}, TensorOptions{}.with_requires_grad());
  std::weak_ptr<TensorImpl> watched;
  {
    Tensor y = exp(x);
    watched = y.impl_ptr();
  }
  EXPECT_TRUE(watched.expired());
}

// ---- binary forward and broadcasting ----------------------------------------------------------------------

// Reference broadcast: for every output position, the flat index each operand reads.
int64_t source_index(const Shape& operand, const Shape& out, int64_t out_flat) {
  std::vector<int64_t> index(out.size());
  for (int d = out.dim() - 1; d >= 0; --d) {
    index[d] = out[d] == 0 ? 0 : out_flat % out[d];
    out_flat = out[d] == 0 ? 0 : out_flat / out[d];
  }
  int64_t flat = 0;
  int lead = out.dim() - operand.dim();
  for (int d = 0; d < operand.dim(); ++d) flat = flat * operand[d] + (operand[d] == 1 ? 0 : index[lead + d]);
  return flat;
}

struct BinaryOp {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> reference;
};

const std::vector<BinaryOp>& binary_ops() {
  static const std::vector<BinaryOp> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double a, double b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return a >= b ? a : b; }},
  };
  return ops;
}

// Every forward path: equal shapes, one-element operands, trailing rows (both sides), strided.
const std::vector<std::pair<Shape, Shape>> kBroadcastPairs = {
    {{2, 3}, {2, 3}},       {{2, 3}, {3}}, {{3}, {2, 3}}, {{2, 1, 4}, {3, 1}},    {{2, 3}, {2, 1}},
    {{1, 1}, {2, 3}},       {{}, {2, 3}},  {{2, 3}, {}},  {{4, 1, 3}, {1, 5, 1}}, {{2, 3, 4}, {3, 4}},
    {{2, 3, 4}, {2, 1, 4}}, {{0, 3}, {3}}, {{5}, {1}},    {{1, 3, 1}, {2, 1, 4}},
};

TEST(Elementwise, BinaryBroadcastingMatchesAReferenceLoop) {
  Generator generator(7);
  for (const auto& [a_shape, b_shape] : kBroadcastPairs) {
    Tensor a = randn(a_shape, kF64, &generator), b = randn(b_shape, kF64, &generator);
    Shape out_shape = broadcast_shapes(a_shape, b_shape, "test");
    std::vector<double> av = a.to_vector(), bv = b.to_vector();
    for (const BinaryOp& op : binary_ops()) {
      SCOPED_TRACE(std::string(op.name) + " " + a_shape.str() + " " + b_shape.str());
      Tensor out = op.op(a, b);
      ASSERT_EQ(out.shape(), out_shape);
      std::vector<double> got = out.to_vector();
      for (int64_t i = 0; i < out_shape.numel(); ++i)
        EXPECT_EQ(got[i],
                  op.reference(av[source_index(a_shape, out_shape, i)], bv[source_index(b_shape, out_shape, i)]))
            << "element " << i;
    }
  }
}

TEST(Elementwise, BinaryHandWorkedBroadcasts) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(add(a, f64({10, 20, 30}, {3})).to_vector(), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(div(a, f64({1, 2}, {2, 1})).to_vector(), (std::vector<double>{1, 2, 3, 2, 2.5, 3}));
  Tensor p = mul(f64({1, 2}, {2, 1, 1}), f64({1, 10, 100}, {3, 1}));  // [2,1,1] * [3,1] -> [2,3,1]
  EXPECT_EQ(p.shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(p.to_vector(), (std::vector<double>{1, 10, 100, 2, 20, 200}));
  EXPECT_EQ(maximum(f64({1, 5, 3}, {3}), f64({2, 2, 3}, {3})).to_vector(), (std::vector<double>{2, 5, 3}));
}

TEST(Elementwise, ScalarForms) {
  Tensor a = f64({1, -2, 4}, {3});
  EXPECT_EQ(add(a, 1.5).to_vector(), (std::vector<double>{2.5, -0.5, 5.5}));
  EXPECT_EQ(sub(a, 1.0).to_vector(), (std::vector<double>{0, -3, 3}));
  EXPECT_EQ(mul(a, -2.0).to_vector(), (std::vector<double>{-2, 4, -8}));
  EXPECT_EQ(div(a, 4.0).to_vector(), (std::vector<double>{0.25, -0.5, 1}));
  EXPECT_EQ(maximum(a, 0.0).to_vector(), (std::vector<double>{1, 0, 4}));
  EXPECT_EQ((2.0 * a - 1.0).to_vector(), (std::vector<double>{1, -5, 7}));
  EXPECT_EQ(mul(a, 2.0).dtype(), DType::f64);
}

TEST(Elementwise, ScalarFirstForms) {
  Tensor a = f64({1, -2, 4}, {3});
  EXPECT_EQ(add(1.5, a).to_vector(), (std::vector<double>{2.5, -0.5, 5.5}));
  EXPECT_EQ(sub(1.0, a).to_vector(), (std::vector<double>{0, 3, -3}));
  EXPECT_EQ(mul(-2.0, a).to_vector(), (std::vector<double>{-2, 4, -8}));
  EXPECT_EQ(div(2.0, a).to_vector(), (std::vector<double>{2, -1, 0.5}));
  EXPECT_EQ((1.0 - a).to_vector(), (std::vector<double>{0, 3, -3}));
  EXPECT_EQ((1.0 + a).to_vector(), (std::vector<double>{2, -1, 5}));
  EXPECT_EQ((4.0 / a).to_vector(), (std::vector<double>{4, -2, 1}));
  EXPECT_EQ((1.0 / a).shape(), a.shape());
  EXPECT_EQ(div(1.0, zeros({2, 0})).shape(), (Shape{2, 0}));
  // One rounding, as a / x in f64 arithmetic: 1/3 is the nearest double, not 3^-1 * 1 rounded twice.
  EXPECT_EQ(div(1.0, f64({3, 7}, {2})).to_vector(), (std::vector<double>{1.0 / 3.0, 1.0 / 7.0}));
  Tensor x = f64({2, 4}, {2}).set_requires_grad();
  EXPECT_EQ(div(1.0, x).grad_fn()->name(), "DivBackward");
  EXPECT_EQ((3.0 - x).dtype(), DType::f64);
  Tensor f = from_vector({2, 4}, {2}, TensorOptions{DType::bf16});
  EXPECT_EQ((1.0 / f).dtype(), DType::bf16);
  EXPECT_EQ((1.0 / f).to_vector(), (std::vector<double>{0.5, 0.25}));
}

TEST(Elementwise, ScalarFirstFormsOnIntegers) {
  const TensorOptions i64{DType::i64};
  Tensor a = from_vector({1, 2, 3}, {3}, i64);
  EXPECT_EQ(sub(10.0, a).to_vector(), (std::vector<double>{9, 8, 7}));
  EXPECT_EQ(sub(10.0, a).dtype(), DType::i64);
  EXPECT_EQ((1.0 + a).to_vector(), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ((2.0 * a).to_vector(), (std::vector<double>{2, 4, 6}));
  std::string message = message_of([&] { sub(0.5, a); });
  EXPECT_NE(message.find("sub: the scalar 0.5 does not suit the i64 tensor (shape [3])"), std::string::npos) << message;
  message = message_of([&] { sub(1e10, from_vector({1}, {1}, TensorOptions{DType::i32})); });
  EXPECT_NE(message.find("sub: the scalar 1e+10 does not suit the i32 tensor"), std::string::npos) << message;
  message = message_of([&] { add(0.5, a); });
  EXPECT_NE(message.find("add: the scalar 0.5 does not suit the i64 tensor"), std::string::npos) << message;
  message = message_of([&] { div(1.0, a); });
  EXPECT_NE(message.find("div: cannot divide 1 by the i64 tensor of shape [3]: div is floating only"),
            std::string::npos)
      << message;
}

TEST(Elementwise, IntegerAddSubMulMaximumWorkAndDivIsRejected) {
  const TensorOptions i64{DType::i64};
  Tensor a = from_vector({1, 2, 3}, {3}, i64), b = from_vector({10, -20}, {2, 1}, i64);
  Tensor s = add(a, b);
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(s.to_vector(), (std::vector<double>{11, 12, 13, -19, -18, -17}));
  EXPECT_EQ(mul(a, a).to_vector(), (std::vector<double>{1, 4, 9}));
  EXPECT_EQ(sub(a, 1.0).to_vector(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(maximum(a, 2.0).to_vector(), (std::vector<double>{2, 2, 3}));
  std::string message = message_of([&] { div(a, a); });
  EXPECT_NE(message.find("div: expected a floating tensor"), std::string::npos) << message;
  message = message_of([&] { add(a, 1.5); });
  EXPECT_NE(message.find("add: the scalar 1.5 does not suit the i64 tensor"), std::string::npos) << message;
  message = message_of([&] { add(from_vector({1}, {1}, TensorOptions{DType::i32}), 1e10); });
  EXPECT_NE(message.find("i32"), std::string::npos) << message;
}

TEST(Elementwise, ErrorsNameShapesDtypesAndDevices) {
  std::string message = message_of([] { add(zeros({2, 3}), zeros({4})); });
  EXPECT_NE(message.find("add: shapes [2, 3] and [4] cannot be broadcast"), std::string::npos) << message;
  message = message_of([] { mul(zeros({2}), zeros({2}, kF64)); });
  EXPECT_NE(message.find("mul: dtype mismatch (f32 and f64)"), std::string::npos) << message;
  message = message_of([] { add(zeros({2}), zeros({2}, TensorOptions{}.with_device(Device::cpu(1)))); });
  EXPECT_NE(message.find("add: tensors on cpu:0 and cpu:1"), std::string::npos) << message;
  message = message_of([] { maximum(Tensor(), zeros({2})); });
  EXPECT_NE(message.find("undefined"), std::string::npos) << message;
  message = message_of([] { sum_to(zeros({2, 3}), Shape{2}); });
  EXPECT_NE(message.find("sum_to"), std::string::npos) << message;
  message = message_of([] { sum_to(zeros({3}), Shape{2, 3}); });
  EXPECT_NE(message.find("sum_to"), std::string::npos) << message;
}

TEST(Elementwise, SumToMatchesAReferenceLoop) {
  Generator generator(11);
  for (const auto& [a_shape, b_shape] : kBroadcastPairs) {
    Shape out_shape = broadcast_shapes(a_shape, b_shape, "test");
    Tensor x = randn(out_shape, kF64, &generator);
    std::vector<double> xv = x.to_vector();
    for (const Shape& target : {a_shape, b_shape}) {
      SCOPED_TRACE(out_shape.str() + " -> " + target.str());
      std::vector<double> want(target.numel(), 0.0);
      for (int64_t i = 0; i < out_shape.numel(); ++i) want[source_index(target, out_shape, i)] += xv[i];
      Tensor reduced = sum_to(x, target);
      EXPECT_EQ(reduced.shape(), target);
      expect_close(reduced.to_vector(), want, {.atol = 1e-12}, "sum_to");
    }
  }
  EXPECT_EQ(sum_to(f64({1, 2, 3, 4, 5, 6}, {2, 3}), Shape{}).item(), 21.0);
  EXPECT_EQ(sum_to(f64({1, 2, 3, 4, 5, 6}, {2, 3}), Shape{2, 1}).to_vector(), (std::vector<double>{6, 15}));
}

// ---- gradients by hand (explicit upstream gradient) -------------------------------------------------------

TEST(Elementwise, BroadcastGradientsSumBackToEachShape) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad();
  Tensor b = f64({10, 20, 30}, {3}).set_requires_grad();
  mul(a, b).backward(ones({2, 3}, kF64));
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{10, 20, 30, 10, 20, 30}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{5, 7, 9}));  // columns of a, summed over rows
  Tensor x = f64({1, -2, 3}, {3}).set_requires_grad();
  mul(x, x).backward(ones({3}, kF64));  // x used twice: 2x
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, -4, 6}));
  Tensor m = f64({1, 5, 3}, {3}).set_requires_grad(), n = f64({2, 2, 3}, {3}).set_requires_grad();
  maximum(m, n).backward(ones({3}, kF64));  // the tie (3, 3) goes to the first operand
  EXPECT_EQ(m.grad().to_vector(), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(n.grad().to_vector(), (std::vector<double>{1, 0, 0}));
}

TEST(Elementwise, GradFnNames) {
  Tensor x = randn({2}, TensorOptions{}.with_requires_grad());
  EXPECT_EQ(gelu(x).grad_fn()->name(), "GeluBackward");
  EXPECT_EQ(add(x, x).grad_fn()->name(), "AddBackward");
  EXPECT_EQ(mul(x, 2.0).grad_fn()->name(), "MulBackward");
  EXPECT_EQ(maximum(x, 0.0).grad_fn()->name(), "MaximumBackward");
}

// ---- bf16 / f16 against f32 --------------------------------------------------------------------------

// Both sides see the same (already rounded) inputs, so only the 16-bit rounding of the result differs.
void expect_close_to_f32(const Tensor& low, const Tensor& f32, const std::string& what) {
  std::vector<double> got = low.to_vector(), want = f32.to_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-2 * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
}

TEST(Elementwise, HalfPrecisionForwardMatchesF32) {
  for (DType low : {DType::bf16, DType::f16}) {
    Generator generator(3);
    Tensor x = randn({4, 8}, TensorOptions{low}, &generator);
    Tensor positive = from_vector({0.1, 0.7, 1.3, 2.0, 4.5, 9.0}, {6}, TensorOptions{low});
    for (const UnaryOp& op : unary_ops()) {
      const Tensor& input = op.positive_inputs ? positive : x;
      Tensor y = op.op(input);
      EXPECT_EQ(y.dtype(), low);
      expect_close_to_f32(y, op.op(input.to(DType::f32)), std::string(op.name) + " " + dtype_name(low));
    }
    Tensor b = add(rand({8}, TensorOptions{low}, &generator), 0.5);  // away from 0 for div
    for (const BinaryOp& op : binary_ops())
      expect_close_to_f32(op.op(x, b), op.op(x.to(DType::f32), b.to(DType::f32)),
                          std::string(op.name) + " " + dtype_name(low));
    expect_close_to_f32(sum_to(x, Shape{8}), sum_to(x.to(DType::f32), Shape{8}),
                        std::string("sum_to ") + dtype_name(low));
  }
}

// ---- gradchecks (f64, finite differences) --------------------------------------------------------------

// positive: log, sqrt, ...; away_from_zero: |x| >= 0.2 (relu's kink); no_ties: input k on the grid
// 0.2 Z + 0.1 k, so two operands of maximum always differ by at least 0.1.
enum class Domain { any, positive, away_from_zero, no_ties };

struct GradCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const TensorList&)> fn;
  Domain domain = Domain::any;
};

// randn inputs, moved into the op's domain.
TensorList make_inputs(const GradCase& c) {
  Generator generator(42);
  TensorList inputs;
  for (const Shape& shape : c.shapes) {
    Tensor t = randn(shape, kF64, &generator);
    for (double *p = t.data<double>(), *end = p + t.numel(); p != end; ++p) {
      if (c.domain == Domain::positive) *p = 0.5 + std::abs(*p);
      if (c.domain == Domain::away_from_zero) *p = (*p < 0 ? -0.2 : 0.2) + *p;
      if (c.domain == Domain::no_ties) *p = 0.2 * std::round(*p / 0.2) + 0.1 * static_cast<double>(inputs.size());
    }
    inputs.push_back(t.set_requires_grad());
  }
  return inputs;
}

void PrintTo(const GradCase& c, std::ostream* out) { *out << c.name; }  // gtest shows the name, not bytes

class ElementwiseGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(ElementwiseGradcheck, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  TensorList inputs = make_inputs(c);
  int64_t total = 0;  // from the case's shapes, not from the tensors gradcheck is handed
  for (const Shape& shape : c.shapes) total += shape.numel();
  expect_gradcheck(c.fn, inputs, total);
}

const GradCase kGradCases[] = {
    {"neg", {{3, 4}}, [](const TensorList& in) { return neg(in[0]); }},
    {"exp", {{3, 4}}, [](const TensorList& in) { return exp(in[0]); }},
    {"log", {{3, 4}}, [](const TensorList& in) { return log(in[0]); }, Domain::positive},
    {"sqrt", {{3, 4}}, [](const TensorList& in) { return sqrt(in[0]); }, Domain::positive},
    {"rsqrt", {{3, 4}}, [](const TensorList& in) { return rsqrt(in[0]); }, Domain::positive},
    {"tanh", {{3, 4}}, [](const TensorList& in) { return tanh(in[0]); }},
    {"sigmoid", {{3, 4}}, [](const TensorList& in) { return sigmoid(in[0]); }},
    {"relu", {{3, 4}}, [](const TensorList& in) { return relu(in[0]); }, Domain::away_from_zero},
    {"gelu", {{3, 4}}, [](const TensorList& in) { return gelu(in[0]); }},
    {"pow2", {{3, 4}}, [](const TensorList& in) { return pow(in[0], 2.0); }},
    {"pow3", {{3, 4}}, [](const TensorList& in) { return pow(in[0], 3.0); }},
    {"pow_half", {{3, 4}}, [](const TensorList& in) { return pow(in[0], 0.5); }, Domain::positive},
    {"pow_minus_1_5", {{3, 4}}, [](const TensorList& in) { return pow(in[0], -1.5); }, Domain::positive},
    {"pow0", {{3, 4}}, [](const TensorList& in) { return pow(in[0], 0.0); }},
    {"add_same_shape", {{2, 3}, {2, 3}}, [](const TensorList& in) { return add(in[0], in[1]); }},
    {"add_row_2x3_3", {{2, 3}, {3}}, [](const TensorList& in) { return add(in[0], in[1]); }},
    {"sub_2x1x4_3x1", {{2, 1, 4}, {3, 1}}, [](const TensorList& in) { return sub(in[0], in[1]); }},
    {"sub_3_2x3", {{3}, {2, 3}}, [](const TensorList& in) { return sub(in[0], in[1]); }},
    {"mul_2x1x4_3x1", {{2, 1, 4}, {3, 1}}, [](const TensorList& in) { return mul(in[0], in[1]); }},
    {"mul_column_2x3_2x1", {{2, 3}, {2, 1}}, [](const TensorList& in) { return mul(in[0], in[1]); }},
    {"mul_scalar_tensor", {{}, {2, 3}}, [](const TensorList& in) { return mul(in[0], in[1]); }},
    {"mul_x_x", {{2, 3}}, [](const TensorList& in) { return mul(in[0], in[0]); }},
    {"add_x_x", {{2, 3}}, [](const TensorList& in) { return add(in[0], in[0]); }},
    {"div_2x3_3", {{2, 3}, {3}}, [](const TensorList& in) { return div(in[0], in[1]); }, Domain::positive},
    {"div_1x3_2x1", {{1, 3}, {2, 1}}, [](const TensorList& in) { return div(in[0], in[1]); }, Domain::positive},
    {"div_x_x", {{2, 3}}, [](const TensorList& in) { return div(in[0], mul(in[0], in[0])); }, Domain::positive},
    {"maximum_2x3_2x3", {{2, 3}, {2, 3}}, [](const TensorList& in) { return maximum(in[0], in[1]); }, Domain::no_ties},
    {"maximum_2x3_3", {{2, 3}, {3}}, [](const TensorList& in) { return maximum(in[0], in[1]); }, Domain::no_ties},
    {"maximum_3_2x3", {{3}, {2, 3}}, [](const TensorList& in) { return maximum(in[0], in[1]); }, Domain::no_ties},
    {"maximum_2x1x4_3x1",
     {{2, 1, 4}, {3, 1}},
     [](const TensorList& in) { return maximum(in[0], in[1]); },
     Domain::no_ties},
    {"add_scalar", {{2, 3}}, [](const TensorList& in) { return add(in[0], 1.5); }},
    {"sub_scalar", {{2, 3}}, [](const TensorList& in) { return sub(in[0], 1.5); }},
    {"mul_scalar", {{2, 3}}, [](const TensorList& in) { return mul(in[0], -3.0); }},
    {"div_scalar", {{2, 3}}, [](const TensorList& in) { return div(in[0], 4.0); }},
    {"maximum_scalar", {{3, 4}}, [](const TensorList& in) { return maximum(in[0], 0.0); }, Domain::away_from_zero},
    {"scalar_add", {{2, 3}}, [](const TensorList& in) { return add(1.5, in[0]); }},
    {"scalar_sub", {{2, 3}}, [](const TensorList& in) { return sub(1.5, in[0]); }},
    {"scalar_mul", {{2, 3}}, [](const TensorList& in) { return mul(-3.0, in[0]); }},
    {"scalar_div", {{2, 3}}, [](const TensorList& in) { return div(2.0, in[0]); }, Domain::positive},
    {"scalar_div_negative", {{2, 3}}, [](const TensorList& in) { return div(-0.5, in[0]); }, Domain::away_from_zero},
    {"scalar_operators", {{2, 3}}, [](const TensorList& in) { return (1.0 - in[0]) * (2.0 / (1.0 + in[0] * in[0])); }},
    {"sum_to_2x3x4_3x1",
     {{2, 3, 4}},
     [](const TensorList& in) {
       return sum_to(in[0], Shape{3, 1});
     }},
    {"sum_to_2x3_scalar", {{2, 3}}, [](const TensorList& in) { return sum_to(in[0], Shape{}); }},
    {"gelu_of_broadcast_affine",
     {{2, 4}, {4}, {4}},
     [](const TensorList& in) { return gelu(add(mul(in[0], in[1]), in[2])); }},
};

INSTANTIATE_TEST_SUITE_P(Ops, ElementwiseGradcheck, ::testing::ValuesIn(kGradCases),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

}  // namespace
}  // namespace sl
