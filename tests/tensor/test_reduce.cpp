// test_reduce.cpp — sum, mean, max, argmax: values against simple loops, keepdim shapes, negative
// dims, accuracy, half precision, errors, and backward (formulas and finite differences).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace {

using sl::Shape;
using sl::Tensor;

using sl::expect_error;
using sl::expect_gradcheck;

// x [2, 3, 4] = 0, 1, ..., 23 with a few values moved so every max is unique and not always last.
Tensor sample(sl::DType dtype = sl::DType::f32) {
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = (i * 7) % 24 - 10;  // a permutation of -10..13
  return sl::from_vector(v, {2, 3, 4}, sl::TensorOptions{dtype});
}

// The reference: reduce dim d of a [2, 3, 4] tensor by `op` over its values, by index arithmetic.
enum class Op { sum, mean, max, argmax };
std::vector<double> reference(const std::vector<double>& x, int d, Op op) {
  const int sizes[3] = {2, 3, 4};
  std::vector<double> out;
  int a = d == 0 ? 1 : 0, b = d == 2 ? 1 : 2;  // the two dims that remain, in order
  for (int i = 0; i < sizes[a]; ++i)
    for (int j = 0; j < sizes[b]; ++j) {
      double total = 0, best = -1e300, best_k = 0;
      for (int k = 0; k < sizes[d]; ++k) {
        int idx[3];
        idx[d] = k, idx[a] = i, idx[b] = j;
        double value = x[(idx[0] * 3 + idx[1]) * 4 + idx[2]];
        total += value;
        if (value > best) best = value, best_k = k;
      }
      out.push_back(op == Op::sum ? total : op == Op::mean ? total / sizes[d] : op == Op::max ? best : best_k);
    }
  return out;
}

TEST(Reduce, AlongEachDimMatchesLoops) {
  for (sl::DType dtype : {sl::DType::f32, sl::DType::f64}) {
    Tensor x = sample(dtype);
    std::vector<double> xv = x.to_vector();
    for (int d = 0; d < 3; ++d) {
      SCOPED_TRACE("dim " + std::to_string(d));
      for (int dim : {d, d - 3}) {  // the same dim, counted from the end
        EXPECT_EQ(sl::sum(x, dim).to_vector(), reference(xv, d, Op::sum));
        std::vector<double> mean = sl::mean(x, dim).to_vector(), want = reference(xv, d, Op::mean);
        for (size_t i = 0; i < mean.size(); ++i) EXPECT_NEAR(mean[i], want[i], 1e-6);
        EXPECT_EQ(sl::max(x, dim).to_vector(), reference(xv, d, Op::max));
        EXPECT_EQ(sl::argmax(x, dim).to_vector(), reference(xv, d, Op::argmax));
      }
    }
    EXPECT_EQ(sl::sum(x).item(), 36.0);  // sum of -10..13
    EXPECT_NEAR(sl::mean(x).item(), 1.5, 1e-7);
    EXPECT_EQ(sl::max(x).item(), 13.0);
  }
}

TEST(Reduce, ShapesAndDtypes) {
  Tensor x = sample();
  EXPECT_EQ(sl::sum(x).shape(), Shape{});
  EXPECT_EQ(sl::mean(x).shape(), Shape{});
  EXPECT_EQ(sl::max(x).shape(), Shape{});
  EXPECT_EQ(sl::sum(x, 1).shape(), (Shape{2, 4}));
  EXPECT_EQ(sl::sum(x, 1, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(sl::mean(x, -1, true).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(sl::max(x, 0, true).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(sl::argmax(x, -1, true).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(sl::argmax(x, -1).dtype(), sl::DType::i64);
  EXPECT_EQ(sl::max(x, 2).dtype(), sl::DType::f32);
  EXPECT_EQ(x.sum(0).shape(), (Shape{3, 4}));  // the Tensor method spellings
  EXPECT_EQ(x.mean().shape(), Shape{});
  // Scalars reduce along dim 0 / -1 to themselves, as in PyTorch.
  EXPECT_EQ(sl::sum(sl::scalar_tensor(2.5), 0).item(), 2.5);
  EXPECT_EQ(sl::max(sl::scalar_tensor(2.5), -1, true).shape(), Shape{});
}

TEST(Reduce, IntegersSumToI64AndMaxKeepsDtype) {
  Tensor x = sl::from_vector({3, -1, 7, 2, 7, 0}, {2, 3}, sl::TensorOptions{sl::DType::i32});
  Tensor s = sl::sum(x, 1);
  EXPECT_EQ(s.dtype(), sl::DType::i64);
  EXPECT_EQ(s.to_vector(), (std::vector<double>{9, 9}));
  EXPECT_EQ(sl::sum(x).item(), 18.0);
  EXPECT_EQ(sl::max(x, 1).dtype(), sl::DType::i32);
  EXPECT_EQ(sl::max(x, 0).to_vector(), (std::vector<double>{3, 7, 7}));
  EXPECT_EQ(sl::argmax(x, 1).to_vector(), (std::vector<double>{2, 1}));
}

TEST(Reduce, ArgmaxAndMaxTakeTheFirstOfTies) {
  Tensor x = sl::from_vector({1, 5, 5, 2, 2, 2}, {2, 3});
  EXPECT_EQ(sl::argmax(x, 1).to_vector(), (std::vector<double>{1, 0}));
  Tensor w = sl::from_vector({1, 5, 5, 2, 2, 2}, {2, 3}, sl::TensorOptions{}.with_requires_grad());
  sl::max(w, 1).backward(sl::ones({2}));  // the gradient goes to the first maximum only
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{0, 1, 0, 1, 0, 0}));
}

TEST(Reduce, MaxPropagatesNaN) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = sl::from_vector({1, nan, 3, 4}, {2, 2});
  EXPECT_TRUE(std::isnan(sl::max(x).item()));
  std::vector<double> rows = sl::max(x, 1).to_vector();
  EXPECT_TRUE(std::isnan(rows[0]));
  EXPECT_EQ(rows[1], 4.0);
}

// A million f32 values: the sum (accumulated in double) is within 1e-6 of the exact one.
TEST(Reduce, LargeF32SumIsAccurate) {
  Tensor x = sl::rand({1000, 1000});
  double exact = 0;
  for (double v : x.to_vector()) exact += v;
  EXPECT_NEAR(sl::sum(x).item(), exact, 1e-6 * exact);
  EXPECT_NEAR(sl::mean(x).item(), exact / 1e6, 1e-6 * exact / 1e6);
  Tensor ones = sl::ones({4, 1000000 / 4});
  std::vector<double> columns = sl::sum(ones, 1).to_vector();  // 250000 per row, exactly
  EXPECT_EQ(columns, std::vector<double>(4, 250000.0));
  Tensor tall = sl::full({1000000, 2}, 0.1);
  for (double v : sl::sum(tall, 0).to_vector()) EXPECT_NEAR(v, 1e6 * static_cast<double>(0.1f), 1e-6 * 1e5);
}

TEST(Reduce, HalfPrecisionMatchesF32) {
  for (sl::DType dtype : {sl::DType::bf16, sl::DType::f16}) {
    Tensor x = sl::randn({3, 50, 4}, sl::TensorOptions{dtype});
    Tensor x32 = x.to(sl::DType::f32);
    auto close = [](const Tensor& got, const Tensor& want) {
      std::vector<double> g = got.to_vector(), w = want.to_vector();
      ASSERT_EQ(g.size(), w.size());
      for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-2 * (1 + std::abs(w[i])));
    };
    EXPECT_EQ(sl::sum(x, 1).dtype(), dtype);
    close(sl::sum(x), sl::sum(x32));
    close(sl::mean(x), sl::mean(x32));
    close(sl::max(x), sl::max(x32));
    close(sl::sum(x, 1), sl::sum(x32, 1));
    close(sl::mean(x, -1, true), sl::mean(x32, -1, true));
    close(sl::max(x, 0), sl::max(x32, 0));
    EXPECT_EQ(sl::argmax(x, 1).to_vector(), sl::argmax(x32, 1).to_vector());
  }
}

TEST(Reduce, EmptyTensors) {
  EXPECT_EQ(sl::sum(sl::zeros({0, 3})).item(), 0.0);
  EXPECT_EQ(sl::sum(sl::zeros({2, 0}), 1).to_vector(), (std::vector<double>{0, 0}));
  EXPECT_EQ(sl::max(sl::zeros({0, 3}), 1).shape(), (Shape{0}));  // nothing to reduce, nothing out
  expect_error([] { sl::mean(sl::zeros({0, 3})); }, "mean: cannot take the mean of an empty tensor (shape [0, 3])");
  expect_error([] { sl::max(sl::zeros({0})); }, "max: cannot take the max of an empty tensor (shape [0])");
  expect_error([] { sl::max(sl::zeros({2, 0}), 1); }, "max: dim 1 of shape [2, 0] has size 0");
  expect_error([] { sl::mean(sl::zeros({2, 0}), -1); }, "mean: dim -1 of shape [2, 0] has size 0");
  expect_error([] { sl::argmax(sl::zeros({0, 2}), 0); }, "argmax: dim 0 of shape [0, 2] has size 0");
}

TEST(Reduce, Errors) {
  Tensor x = sample();
  expect_error([&] { sl::sum(x, 3); }, "sum: dim 3 is out of range for a tensor of shape [2, 3, 4]");
  expect_error([&] { sl::mean(x, -4); }, "mean: dim -4 is out of range for a tensor of shape [2, 3, 4]");
  expect_error([&] { sl::max(x, 5, true); }, "max: dim 5 is out of range");
  expect_error([&] { sl::argmax(x, -7); }, "argmax: dim -7 is out of range");
  expect_error([] { sl::sum(sl::scalar_tensor(1.0), 1); }, "sum: dim 1 is out of range for a scalar");
  Tensor ids = sl::zeros({2, 3}, sl::TensorOptions{sl::DType::i64});
  expect_error([&] { sl::mean(ids); }, "mean: expected a floating tensor (f32, f64, bf16, f16) but got i64");
  expect_error([&] { sl::mean(ids, 0); }, "mean: expected a floating tensor");
}

// ---- backward ------------------------------------------------------------------------------------------

TEST(Reduce, BackwardMatchesFormulas) {
  auto opts = sl::TensorOptions{sl::DType::f64}.with_requires_grad();
  Tensor x = sl::from_vector({1, 4, 2, 3, 0, 5}, {2, 3}, opts);
  Tensor g = sl::from_vector({10, 20}, {2}, sl::TensorOptions{sl::DType::f64});
  sl::sum(x, 1).backward(g);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{10, 10, 10, 20, 20, 20}));
  x.set_grad(Tensor());
  sl::mean(x, 1).backward(g);
  std::vector<double> want_mean{10 / 3.0, 10 / 3.0, 10 / 3.0, 20 / 3.0, 20 / 3.0, 20 / 3.0};
  std::vector<double> got = x.grad().to_vector();
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[i], want_mean[i], 1e-12);
  x.set_grad(Tensor());
  sl::max(x, 1, true).backward(sl::from_vector({10, 20}, {2, 1}, sl::TensorOptions{sl::DType::f64}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 10, 0, 0, 0, 20}));
  x.set_grad(Tensor());
  sl::max(x, 0).backward(sl::from_vector({1, 2, 3}, {3}, sl::TensorOptions{sl::DType::f64}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 2, 0, 1, 0, 3}));
  x.set_grad(Tensor());
  sl::mean(x).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(6, 1 / 6.0));
  x.set_grad(Tensor());
  sl::max(x).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 0, 0, 0, 1}));
}

TEST(Reduce, ArgmaxHasNoGradient) {
  Tensor x = sl::randn({2, 3}, sl::TensorOptions{sl::DType::f64}.with_requires_grad());
  EXPECT_FALSE(sl::argmax(x, 1).requires_grad());
  EXPECT_TRUE(sl::max(x, 1).requires_grad());
}

struct ReduceCase {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
};

class ReduceGradcheck : public testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceGradcheck, MatchesFiniteDifferences) {
  Tensor x = sl::randn({3, 4, 5}, sl::TensorOptions{sl::DType::f64}.with_requires_grad());
  const auto& fn = GetParam().fn;
  expect_gradcheck([&](const sl::TensorList& in) { return fn(in[0]); }, {x}, 60);
}

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> cases = {
      {"sum_all", [](const Tensor& x) { return sl::sum(x); }},
      {"mean_all", [](const Tensor& x) { return sl::mean(x); }},
      {"max_all", [](const Tensor& x) { return sl::max(x); }},
  };
  for (int dim : {0, 1, 2, -1})
    for (bool keepdim : {false, true}) {
      std::string tag =
          (dim < 0 ? "dim_minus" + std::to_string(-dim) : "dim" + std::to_string(dim)) + (keepdim ? "_keepdim" : "");
      cases.push_back({"sum_" + tag, [=](const Tensor& x) { return sl::sum(x, dim, keepdim); }});
      cases.push_back({"mean_" + tag, [=](const Tensor& x) { return sl::mean(x, dim, keepdim); }});
      cases.push_back({"max_" + tag, [=](const Tensor& x) { return sl::max(x, dim, keepdim); }});
    }
  // x used twice, along two different paths: both gradients accumulate into x.
  cases.push_back({"sum_plus_max_same_input", [](const Tensor& x) { return sl::add(sl::sum(x, 1), sl::max(x, 1)); }});
  cases.push_back({"mean_of_mean", [](const Tensor& x) { return sl::mean(sl::mean(x, 0, true), -1); }});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ops, ReduceGradcheck, testing::ValuesIn(reduce_cases()),
                         [](const testing::TestParamInfo<ReduceCase>& info) { return info.param.name; });

}  // namespace
