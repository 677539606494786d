// layer_norm (tensor/ops/layer_norm.cpp): values against a plain loop, shape errors, dtypes,
// backward by finite differences (x, weight and bias, alone and together).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// LayerNorm of each row of [N, C], the textbook way.
std::vector<double> reference_layer_norm(const std::vector<double>& x, const std::vector<double>& weight,
                                         const std::vector<double>& bias, double eps) {
  const size_t C = weight.size();
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / C; ++row) {
    double mean = 0, variance = 0;
    for (size_t i = 0; i < C; ++i) mean += x[row * C + i] / C;
    for (size_t i = 0; i < C; ++i) variance += (x[row * C + i] - mean) * (x[row * C + i] - mean) / C;
    for (size_t i = 0; i < C; ++i)
      y[row * C + i] = (x[row * C + i] - mean) / std::sqrt(variance + eps) * weight[i] + bias[i];
  }
  return y;
}

// Within t·(1 + |expected|) everywhere (tests/support/compare.h).
using test_support::expect_close;
using test_support::within;

TEST(LayerNorm, MatchesAPlainLoop) {
  Generator generator(1);
  Tensor x = randn({2, 3, 8}, kF64, &generator);
  Tensor weight = randn({8}, kF64, &generator);
  Tensor bias = randn({8}, kF64, &generator);
  Tensor y = layer_norm(x, weight, bias, 1e-5);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
  expect_close(y.to_vector(), reference_layer_norm(x.to_vector(), weight.to_vector(), bias.to_vector(), 1e-5),
               within(1e-12), "layer_norm");
}

TEST(LayerNorm, UnitWeightZeroBiasGivesMeanZeroVarianceOne) {
  Tensor x = from_vector({1, 2, 3, 4, 10, 10, 10, 14}, {2, 4}, kF64);
  std::vector<double> y = layer_norm(x, ones({4}, kF64), zeros({4}, kF64), 0.0).to_vector();
  // Row 0: mean 2.5, variance 1.25. Row 1: mean 11, variance 3.
  expect_close(y,
               {-1.5 / std::sqrt(1.25), -0.5 / std::sqrt(1.25), 0.5 / std::sqrt(1.25), 1.5 / std::sqrt(1.25),
                -1 / std::sqrt(3.0), -1 / std::sqrt(3.0), -1 / std::sqrt(3.0), 3 / std::sqrt(3.0)},
               within(1e-12), "layer_norm");
}

TEST(LayerNorm, ConstantRowIsFiniteThanksToEps) {
  // Variance 0: rstd = 1/sqrt(eps), and x - mean = 0, so y = bias.
  Tensor x = full({1, 4}, 7.0, kF64);
  expect_close(layer_norm(x, ones({4}, kF64), full({4}, 0.5, kF64)).to_vector(), {0.5, 0.5, 0.5, 0.5}, within(1e-12),
               "layer_norm of a constant row");
}

TEST(LayerNorm, ShapeAndDtypeErrorsNameTheShapes) {
  Tensor x = zeros({2, 4});
  EXPECT_EQ(message_of([&] { layer_norm(x, ones({5}), zeros({4})); }),
            "layer_norm: weight has shape [5] but x [2, 4] needs [4]");
  EXPECT_EQ(message_of([&] {
              layer_norm(x, ones({4}), zeros({1, 4}));
            }),
            "layer_norm: bias has shape [1, 4] but x [2, 4] needs [4]");
  EXPECT_EQ(message_of([&] { layer_norm(x, ones({4}, kF64), zeros({4})); }),
            "layer_norm: x, weight and bias must share a dtype (got f32, f64, f32)");
  EXPECT_EQ(message_of([&] { layer_norm(scalar_tensor(1.0), ones({1}), zeros({1})); }),
            "layer_norm: x must have at least one dim (the C to normalise over) but has shape []");
  EXPECT_EQ(message_of([&] { layer_norm(x, ones({4}), zeros({4}), -1.0); }), "layer_norm: eps must be >= 0 but got -1");
  Tensor ids = zeros({2, 4}, DType::i32);
  EXPECT_EQ(message_of([&] { layer_norm(ids, ones({4}, DType::i32), zeros({4}, DType::i32)); }),
            "layer_norm: expected a floating tensor (f32, f64, bf16, f16) but got i32");
}

TEST(LayerNorm, LowPrecisionMatchesF32) {
  Generator generator(2);
  TensorOptions f32{DType::f32};
  Tensor x = randn({4, 6, 64}, f32, &generator);
  Tensor weight = randn({64}, f32, &generator);
  Tensor bias = randn({64}, f32, &generator);
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor x_low = x.to(dtype), weight_low = weight.to(dtype), bias_low = bias.to(dtype);
    Tensor y = layer_norm(x_low, weight_low, bias_low);
    EXPECT_EQ(y.dtype(), dtype);
    Tensor reference = layer_norm(x_low.to(DType::f32), weight_low.to(DType::f32), bias_low.to(DType::f32));
    expect_close(y.to_vector(), reference.to_vector(), within(1e-2), "layer_norm in 16 bits");
  }
}

TEST(LayerNorm, LowPrecisionBackwardMatchesF32) {
  // dweight and dbias sum over every row: they are accumulated in f32 and rounded once.
  Generator generator(3);
  Tensor x = randn({64, 16}, TensorOptions{DType::f32}, &generator);
  Tensor dy = randn({64, 16}, TensorOptions{DType::f32}, &generator);
  auto grads_for = [&](DType dtype) {
    Tensor xl = x.to(dtype).detach().set_requires_grad(), w = ones({16}, dtype).set_requires_grad(),
           b = zeros({16}, dtype).set_requires_grad();
    layer_norm(xl, w, b).backward(dy.to(dtype));
    return std::vector<Tensor>{xl.grad(), w.grad(), b.grad()};
  };
  std::vector<Tensor> reference = grads_for(DType::f32);
  std::vector<Tensor> low = grads_for(DType::bf16);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(low[k].dtype(), DType::bf16);
    std::vector<double> a = low[k].to_vector(), b = reference[k].to_vector();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 3e-2 * (1 + std::abs(b[i]))) << k << " " << i;
  }
}

// ---- finite differences --------------------------------------------------------------------------

TEST(LayerNormGradcheck, XWeightAndBias) {
  Generator generator(5);
  Tensor x = randn({3, 5}, kF64.with_requires_grad(), &generator);
  Tensor weight = randn({5}, kF64.with_requires_grad(), &generator);
  Tensor bias = randn({5}, kF64.with_requires_grad(), &generator);
  auto fn = [](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); };
  expect_gradcheck(fn, {x, weight, bias}, 15 + 5 + 5);
}

TEST(LayerNormGradcheck, ThreeDimsBTC) {
  Generator generator(6);
  Tensor x = randn({2, 3, 4}, kF64.with_requires_grad(), &generator);
  Tensor weight = randn({4}, kF64.with_requires_grad(), &generator);
  Tensor bias = randn({4}, kF64.with_requires_grad(), &generator);
  expect_gradcheck([](const TensorList& in) { return layer_norm(in[0], in[1], in[2], 1e-3); }, {x, weight, bias},
                   24 + 4 + 4);
}

TEST(LayerNormGradcheck, OnlyX) {
  // Weight and bias are constants here: backward still gives dx alone.
  Generator generator(7);
  Tensor x = randn({4, 6}, kF64.with_requires_grad(), &generator);
  Tensor weight = randn({6}, kF64, &generator);
  Tensor bias = randn({6}, kF64, &generator);
  expect_gradcheck([&](const TensorList& in) { return layer_norm(in[0], weight, bias); }, {x}, 24);
}

TEST(LayerNormGradcheck, OnlyWeightAndBias) {
  Generator generator(8);
  Tensor x = randn({4, 6}, kF64, &generator);
  Tensor weight = randn({6}, kF64.with_requires_grad(), &generator);
  Tensor bias = randn({6}, kF64.with_requires_grad(), &generator);
  expect_gradcheck([&](const TensorList& in) { return layer_norm(x, in[0], in[1]); }, {weight, bias}, 6 + 6);
}

TEST(LayerNormGradcheck, SameTensorAsWeightAndBias) {
  // One parameter used twice: its gradient is dweight + dbias.
  Generator generator(9);
  Tensor x = randn({3, 4}, kF64.with_requires_grad(), &generator);
  Tensor scale = randn({4}, kF64.with_requires_grad(), &generator);
  expect_gradcheck([](const TensorList& in) { return layer_norm(in[0], in[1], in[1]); }, {x, scale}, 12 + 4);
}

}  // namespace
}  // namespace sl
