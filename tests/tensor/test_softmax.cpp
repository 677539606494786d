// softmax and log_softmax (tensor/ops/softmax.cpp): values against a plain loop, stability, dtypes,
// backward by hand and by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// Softmax of each row of a [N, C] list of values, written the obvious way (no max shift).
std::vector<double> reference_softmax(const std::vector<double>& x, int64_t C) {
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / C; ++row) {
    double total = 0;
    for (int64_t i = 0; i < C; ++i) total += std::exp(x[row * C + i]);
    for (int64_t i = 0; i < C; ++i) y[row * C + i] = std::exp(x[row * C + i]) / total;
  }
  return y;
}

// Within t·(1 + |expected|) everywhere (tests/support/compare.h).
using test_support::expect_close;
using test_support::within;

TEST(Softmax, MatchesAPlainLoopAndRowsSumToOne) {
  Generator generator(1);
  Tensor x = randn({2, 3, 5}, kF64, &generator);
  std::vector<double> y = softmax(x).to_vector();
  expect_close(y, reference_softmax(x.to_vector(), 5), within(1e-12), "softmax");
  for (int row = 0; row < 6; ++row) {
    double total = 0;
    for (int i = 0; i < 5; ++i) total += y[row * 5 + i];
    EXPECT_NEAR(total, 1.0, 1e-12);
  }
  EXPECT_EQ(softmax(x).shape(), (Shape{2, 3, 5}));
}

TEST(Softmax, LogSoftmaxIsTheLogOfSoftmax) {
  Generator generator(2);
  Tensor x = randn({4, 7}, kF64, &generator);
  std::vector<double> expected = reference_softmax(x.to_vector(), 7);
  for (double& value : expected) value = std::log(value);
  expect_close(log_softmax(x).to_vector(), expected, within(1e-12), "log_softmax");
}

TEST(Softmax, HugeLogitsDoNotOverflow) {
  // exp(1000) is inf in double; shifting by the row max keeps every exponent <= 0.
  Tensor x = from_vector({1000, 1001, 1002}, {1, 3}, kF64);
  double total = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  expect_close(softmax(x).to_vector(), {std::exp(-2.0) / total, std::exp(-1.0) / total, 1.0 / total}, within(1e-12),
               "softmax");
  expect_close(log_softmax(x).to_vector(), {-2 - std::log(total), -1 - std::log(total), -std::log(total)},
               within(1e-12), "log_softmax");
  // The same in f32, where exp(89) already overflows.
  expect_close(softmax(x.to(DType::f32)).to_vector(), softmax(x).to_vector(), within(1e-6), "softmax in f32");
}

TEST(Softmax, MinusInfinityGetsZeroProbability) {
  // A masked attention score: -inf takes no probability, the rest renormalise.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = from_vector({0, -inf, 0, 1, -inf, -inf}, {2, 3}, kF64);
  expect_close(softmax(x).to_vector(), {0.5, 0, 0.5, 1, 0, 0}, within(1e-12), "softmax");
  std::vector<double> log_y = log_softmax(x).to_vector();
  EXPECT_NEAR(log_y[0], std::log(0.5), 1e-12);
  EXPECT_EQ(log_y[1], -inf);
  EXPECT_EQ(log_y[3], 0.0);
}

TEST(Softmax, ScalarAndEmptyTensors) {
  EXPECT_EQ(softmax(scalar_tensor(3.0)).item(), 1.0);
  EXPECT_EQ(log_softmax(scalar_tensor(3.0)).item(), 0.0);
  EXPECT_EQ(softmax(zeros({0, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(softmax(zeros({3, 0})).shape(), (Shape{3, 0}));
}

TEST(Softmax, LowPrecisionMatchesF32) {
  Generator generator(3);
  Tensor x = randn({8, 33}, TensorOptions{DType::f32}, &generator);
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor low = x.to(dtype);
    EXPECT_EQ(softmax(low).dtype(), dtype);
    // Compare against f32 on the same (rounded) inputs: the error is then the op's own.
    expect_close(softmax(low).to_vector(), softmax(low.to(DType::f32)).to_vector(), within(1e-2), "softmax");
    expect_close(log_softmax(low).to_vector(), log_softmax(low.to(DType::f32)).to_vector(), within(1e-2),
                 "log_softmax");
  }
}

TEST(Softmax, IntegerInputIsAnError) {
  try {
    softmax(arange(4));
    FAIL() << "softmax accepted an i64 tensor";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "softmax: expected a floating tensor (f32, f64, bf16, f16) but got i64");
  }
}

TEST(Softmax, BackwardMatchesTheFormulaByHand) {
  // dx = y (g - sum(g y)) and, for log_softmax, dx = g - softmax(x) sum(g), written out for one row.
  Tensor x = from_vector({0.5, -1, 2}, {1, 3}, kF64.with_requires_grad());
  std::vector<double> g = {1, -2, 0.5};
  std::vector<double> y = reference_softmax(x.to_vector(), 3);
  softmax(x).backward(from_vector(g, {1, 3}, kF64));
  double dot = g[0] * y[0] + g[1] * y[1] + g[2] * y[2];
  expect_close(x.grad().to_vector(), {y[0] * (g[0] - dot), y[1] * (g[1] - dot), y[2] * (g[2] - dot)}, within(1e-12),
               "softmax's gradient");

  x.set_grad(Tensor());
  log_softmax(x).backward(from_vector(g, {1, 3}, kF64));
  double g_total = g[0] + g[1] + g[2];
  expect_close(x.grad().to_vector(), {g[0] - y[0] * g_total, g[1] - y[1] * g_total, g[2] - y[2] * g_total},
               within(1e-12), "log_softmax's gradient");
}

// ---- finite differences --------------------------------------------------------------------------

struct SoftmaxCase {
  const char* name;
  Shape shape;
  TensorFn fn;
};

class SoftmaxGradcheck : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxGradcheck, MatchesFiniteDifferences) {
  Generator generator(11);
  Tensor x = randn(GetParam().shape, kF64.with_requires_grad(), &generator);
  expect_gradcheck(GetParam().fn, {x}, GetParam().shape.numel());
}

INSTANTIATE_TEST_SUITE_P(
    Ops, SoftmaxGradcheck,
    ::testing::Values(
        SoftmaxCase{"softmax_2x5", {2, 5}, [](const TensorList& in) { return softmax(in[0]); }},
        SoftmaxCase{"softmax_B2_T3_C4", {2, 3, 4}, [](const TensorList& in) { return softmax(in[0]); }},
        SoftmaxCase{"log_softmax_2x5", {2, 5}, [](const TensorList& in) { return log_softmax(in[0]); }},
        SoftmaxCase{"log_softmax_B2_T3_C4", {2, 3, 4}, [](const TensorList& in) { return log_softmax(in[0]); }},
        // x feeds both factors: p log p, the entropy integrand.
        SoftmaxCase{"p_log_p_same_input_twice",
                    {3, 4},
                    [](const TensorList& in) { return mul(softmax(in[0]), log_softmax(in[0])); }},
        SoftmaxCase{
            "softmax_of_log_softmax", {2, 6}, [](const TensorList& in) { return softmax(log_softmax(in[0])); }}),
    [](const ::testing::TestParamInfo<SoftmaxCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sl

// ---- causal_softmax (tensor/ops/attention.cpp) --------------------------------------------------

namespace sl {
namespace {

TEST(CausalSoftmax, EqualsScaleMaskThenSoftmax) {
  Generator gen(11);
  Tensor scores = randn({2, 3, 5, 5}, {}, &gen);
  const double scale = 0.37;
  Tensor expected = softmax(masked_fill(mul(scores, scale), causal_mask(5), -std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(allclose(causal_softmax(scores, scale), expected, 1e-6, 1e-7));
  // The future gets exactly zero weight, the first query attends only to itself.
  std::vector<double> y = causal_softmax(scores, scale).to_vector();
  EXPECT_EQ(y[0 * 5 + 1], 0.0);
  EXPECT_EQ(y[0], 1.0);
  for (DType dtype : {DType::bf16, DType::f16})
    EXPECT_TRUE(allclose(causal_softmax(scores.to(dtype), scale).to(DType::f32), expected, 1e-2, 1e-2));
}

TEST(CausalSoftmax, RejectsNonSquareScores) {
  try {
    causal_softmax(ones({2, 3, 4}), 1.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 4]"), std::string::npos) << e.what();
  }
}

TEST(CausalSoftmaxGradcheck, MatchesFiniteDifferences) {
  Tensor scores = randn({2, 2, 4, 4}, TensorOptions(DType::f64).with_requires_grad());
  expect_gradcheck([](const TensorList& t) { return causal_softmax(t[0], 0.5); }, {scores}, 64);
  // The scores used twice: causal_softmax(s) * s.
  expect_gradcheck([](const TensorList& t) { return mul(causal_softmax(t[0], 2.0), t[0]); }, {scores}, 64);
}

}  // namespace
}  // namespace sl
