// linear: the fused x W^T + b against matmul + add (16-bit: the f32 op rounded once), and its gradients
// against finite differences.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

TEST(Linear, MatchesMatmulPlusBias) {
  Generator gen(3);
  Tensor x = randn({2, 5, 7}, {}, &gen), w = randn({4, 7}, {}, &gen), b = randn({4}, {}, &gen);
  Tensor expected = add(matmul(x.reshape({10, 7}), w, false, true), b).reshape({2, 5, 4});
  EXPECT_TRUE(allclose(linear(x, w, b), expected, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(linear(x, w), matmul(x.reshape({10, 7}), w, false, true).reshape({2, 5, 4}), 1e-5, 1e-6));
}

// bf16/f16 run the f32 kernel on widened copies and round each result once: bitwise the f32 op on
// the 16-bit values, rounded; forward and all three gradients.
TEST(Linear, HalfPrecisionIsTheF32OpRoundedOnce) {
  Generator gen(4);
  Tensor x = randn({3, 8}, {}, &gen), w = randn({2, 8}, {}, &gen), b = randn({2}, {}, &gen);
  Tensor dy = randn({3, 2}, {}, &gen);
  Tensor reference = linear(x, w, b);
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor xh = x.to(dtype).set_requires_grad(), wh = w.to(dtype).set_requires_grad(), bh = b.to(dtype).set_requires_grad();
    Tensor y = linear(xh, wh, bh);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_TRUE(allclose(y.to(DType::f32), reference, 2e-2, 5e-2)) << dtype_name(dtype);
    y.backward(dy.to(dtype));
    Tensor xf = xh.detach().to(DType::f32).set_requires_grad(), wf = wh.detach().to(DType::f32).set_requires_grad();
    Tensor bf = bh.detach().to(DType::f32).set_requires_grad();
    Tensor yf = linear(xf, wf, bf);
    yf.backward(dy.to(dtype).to(DType::f32));
    EXPECT_EQ(y.to(DType::f64).to_vector(), yf.to(dtype).to(DType::f64).to_vector()) << dtype_name(dtype);
    EXPECT_EQ(xh.grad().dtype(), dtype);
    EXPECT_EQ(xh.grad().to(DType::f64).to_vector(), xf.grad().to(dtype).to(DType::f64).to_vector());
    EXPECT_EQ(wh.grad().to(DType::f64).to_vector(), wf.grad().to(dtype).to(DType::f64).to_vector());
    EXPECT_EQ(bh.grad().to(DType::f64).to_vector(), bf.grad().to(dtype).to(DType::f64).to_vector());
  }
}

// No input features: every output is the bias (an empty sum), the bias gets dy's column sums, and
// the empty weight and input get empty gradients; nothing divides by in = 0 or hands BLAS lda = 0.
TEST(Linear, ZeroInputFeaturesGiveTheBias) {
  Tensor x = zeros({3, 0}).set_requires_grad(), w = zeros({2, 0}).set_requires_grad();
  Tensor b = from_vector({1.5, -2}, {2}).set_requires_grad();
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), Shape({3, 2}));
  EXPECT_EQ(y.to_vector(), std::vector<double>({1.5, -2, 1.5, -2, 1.5, -2}));
  y.sum().backward();
  EXPECT_EQ(b.grad().to_vector(), std::vector<double>({3, 3}));
  EXPECT_EQ(x.grad().shape(), Shape({3, 0}));
  EXPECT_EQ(w.grad().shape(), Shape({2, 0}));
}

TEST(Linear, ErrorsNameTheShapes) {
  try {
    linear(ones({2, 3}), ones({4, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] does not end in 5 features (weight [4, 5])"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(linear(ones({2, 5}), ones({4, 5}), ones({3})), Error);
  EXPECT_THROW(linear(ones({2, 5}), ones({4, 5}, DType::f64)), Error);
  EXPECT_THROW(linear(ones({2, 5}), ones({5})), Error);
}

struct LinearCase {
  const char* name;
  Shape x;
  bool bias;
};

class LinearGradcheck : public testing::TestWithParam<LinearCase> {};

TEST_P(LinearGradcheck, MatchesFiniteDifferences) {
  const LinearCase& c = GetParam();
  TensorOptions f64 = TensorOptions(DType::f64).with_requires_grad();
  Generator gen(7);
  int64_t in = c.x.back();
  TensorList inputs = {randn(c.x, f64, &gen), randn({3, in}, f64, &gen)};
  if (c.bias) inputs.push_back(randn({3}, f64, &gen));
  expect_gradcheck([&](const TensorList& t) { return linear(t[0], t[1], c.bias ? t[2] : Tensor()); }, inputs,
                   c.x.numel() + 3 * in + (c.bias ? 3 : 0));
}

INSTANTIATE_TEST_SUITE_P(Ops, LinearGradcheck,
                         testing::Values(LinearCase{"x2d_bias", {4, 5}, true}, LinearCase{"x2d_no_bias", {4, 5}, false},
                                         LinearCase{"x3d_bias", {2, 3, 5}, true}),
                         [](const testing::TestParamInfo<LinearCase>& info) { return info.param.name; });

TEST(LinearGradcheckTwice, SameTensorAsInputAndWeight) {
  // y = x x^T + b: x is both the input and the weight.
  Tensor x = randn({3, 3}, TensorOptions(DType::f64).with_requires_grad());
  Tensor b = randn({3}, TensorOptions(DType::f64).with_requires_grad());
  expect_gradcheck([](const TensorList& t) { return linear(t[0], t[0], t[1]); }, {x, b}, 9 + 3);
}

}  // namespace
}  // namespace sl
