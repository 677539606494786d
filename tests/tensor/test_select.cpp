// masked_fill, causal_mask, where and dropout (tensor/ops/select.cpp): values, broadcasting, errors,
// the Philox dropout mask, and backward by hand and by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// ---- causal_mask and masked_fill ---------------------------------------------------------------------

TEST(CausalMask, OnesStrictlyAboveTheDiagonal) {
  Tensor mask = causal_mask(3);
  EXPECT_EQ(mask.dtype(), DType::i32);
  EXPECT_EQ(mask.shape(), (Shape{3, 3}));
  EXPECT_EQ(mask.to_vector(), (std::vector<double>{0, 1, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(causal_mask(0).shape(), (Shape{0, 0}));
  EXPECT_EQ(causal_mask(2, Device::cpu(1)).device(), Device::cpu(1));
  EXPECT_EQ(message_of([] { causal_mask(-1); }), "causal_mask: T must be >= 0 but got -1");
}

TEST(MaskedFill, CausalMaskBroadcastOverBatchAndHeads) {
  // scores [B=2, NH=1, T=3, T=3] masked by [T, T]: the future becomes -inf, then softmax gives it 0.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = arange(0, 18, 1, kF64).reshape({2, 1, 3, 3});
  Tensor masked = masked_fill(scores, causal_mask(3), -inf);
  std::vector<double> expected = {0, -inf, -inf, 3, 4, -inf, 6, 7, 8, 9, -inf, -inf, 12, 13, -inf, 15, 16, 17};
  EXPECT_EQ(masked.to_vector(), expected);
  std::vector<double> attention = softmax(masked).to_vector();
  EXPECT_EQ(attention[0], 1.0);
  EXPECT_EQ(attention[5], 0.0);
}

TEST(MaskedFill, AnyMaskDtypeAndBroadcastShapes) {
  Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, kF64);
  for (DType mask_dtype : {DType::i32, DType::i64, DType::f32, DType::bf16}) {
    Tensor column_mask = from_vector({0, 2.5, 0}, {3}, mask_dtype);  // any non-zero value fills
    EXPECT_EQ(masked_fill(x, column_mask, -1).to_vector(), (std::vector<double>{1, -1, 3, 4, -1, 6}));
  }
  Tensor row_mask = from_vector({1, 0}, {2, 1}, DType::i32);
  EXPECT_EQ(masked_fill(x, row_mask, 0).to_vector(), (std::vector<double>{0, 0, 0, 4, 5, 6}));
  EXPECT_EQ(masked_fill(x, scalar_tensor(1, DType::i32), 9).to_vector(), std::vector<double>(6, 9.0));
  // Integer tensors can be filled too.
  EXPECT_EQ(masked_fill(arange(3), from_vector({0, 1, 0}, {3}, DType::i32), 7).to_vector(),
            (std::vector<double>{0, 7, 2}));
}

TEST(MaskedFill, MaskThatDoesNotBroadcastToXIsAnError) {
  Tensor x = zeros({2, 3});
  EXPECT_EQ(message_of([&] { masked_fill(x, zeros({4}, DType::i32), 0); }),
            "masked_fill: shapes [2, 3] and [4] cannot be broadcast (dim 1 of the result: 3 vs 4)");
  // Broadcastable together, but the result would be bigger than x.
  EXPECT_EQ(message_of([&] {
              masked_fill(x, zeros({5, 2, 3}, DType::i32), 0);
            }),
            "masked_fill: a mask of shape [5, 2, 3] cannot be broadcast to x's shape [2, 3]");
}

TEST(MaskedFill, BackwardPassesGradientWhereTheMaskIsZero) {
  Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, kF64.with_requires_grad());
  masked_fill(x, from_vector({0, 1}, {2}, DType::i32), 5).backward(from_vector({10, 20, 30, 40}, {2, 2}, kF64));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{10, 0, 30, 0}));
}

// ---- where -------------------------------------------------------------------------------------------

TEST(Where, SelectsElementwiseWithBroadcasting) {
  Tensor condition = from_vector({1, 0, 0, 1}, {2, 2}, DType::i64);
  Tensor a = from_vector({10, 20}, {2}, kF64);     // broadcast over rows
  Tensor b = from_vector({-1, -2}, {2, 1}, kF64);  // broadcast over columns
  Tensor out = where(condition, a, b);
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  EXPECT_EQ(out.to_vector(), (std::vector<double>{10, -1, -2, 20}));
  // All three broadcast to a bigger shape than any one of them.
  Tensor wide = where(from_vector({1, 0, 1}, {3, 1, 1}, DType::i32), ones({1, 2}, kF64), zeros({4, 1}, kF64));
  EXPECT_EQ(wide.shape(), (Shape{3, 4, 2}));
  std::vector<double> values = wide.to_vector();
  EXPECT_EQ(values[0], 1.0);
  EXPECT_EQ(values[8], 0.0);
  EXPECT_EQ(values[23], 1.0);
}

TEST(Where, Errors) {
  EXPECT_EQ(message_of([] { where(ones({2}, DType::i32), ones({2}), ones({2}, kF64)); }),
            "where: a and b must share a dtype (got f32 and f64)");
  EXPECT_EQ(message_of([] { where(ones({3}, DType::i32), ones({2}), ones({2})); }),
            "where: shapes [3] and [2] cannot be broadcast (dim 0 of the result: 3 vs 2)");
}

TEST(Where, BackwardSumsGradientsBackToEachOperandsShape) {
  Tensor condition = from_vector({1, 0, 0, 1, 1, 1}, {2, 3}, DType::i32);
  Tensor a = from_vector({0, 0, 0}, {3}, kF64.with_requires_grad());  // [3], broadcast over 2 rows
  Tensor b = from_vector({0, 0}, {2, 1}, kF64.with_requires_grad());  // [2, 1], broadcast over 3 columns
  where(condition, a, b).backward(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, kF64));
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{1 + 4, 5, 6}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{2 + 3, 0}));
}

// ---- dropout -----------------------------------------------------------------------------------------

TEST(Dropout, KeepsAboutOneMinusPAndScalesByOneOverOneMinusP) {
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.9}) {
    Generator generator(42);
    std::vector<double> y = dropout(ones({n}), p, true, &generator).to_vector();
    int64_t kept = 0;
    for (double value : y) {
      if (value != 0) {
        kept++;
        EXPECT_FLOAT_EQ(value, 1 / (1 - p));
      }
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 0.01) << "p = " << p;
    EXPECT_EQ(generator.offset(), static_cast<uint64_t>(n));  // one counter per element
  }
}

TEST(Dropout, MaskIsThePhiloxRule) {
  // Element i is kept iff philox4x32(first + i, seed)[0] >= p * 2^32: what a CUDA kernel recomputes.
  Generator generator(7);
  generator.set_offset(1000);
  const double p = 0.3;
  std::vector<double> y = dropout(ones({64}, kF64), p, true, &generator).to_vector();
  for (int64_t i = 0; i < 64; ++i) {
    bool keep = philox4x32(1000 + i, 7)[0] >= p * 4294967296.0;
    EXPECT_EQ(y[i] != 0, keep) << "element " << i;
  }
}

TEST(Dropout, SameGeneratorStateGivesTheSameMask) {
  Tensor x = randn({4, 256});
  Generator first(5), second(5);
  EXPECT_EQ(dropout(x, 0.5, true, &first).to_vector(), dropout(x, 0.5, true, &second).to_vector());
  // The generators moved on together: the next masks agree with each other, but not with the first.
  std::vector<double> next = dropout(x, 0.5, true, &first).to_vector();
  EXPECT_EQ(next, dropout(x, 0.5, true, &second).to_vector());
  Generator fresh(5);
  EXPECT_NE(next, dropout(x, 0.5, true, &fresh).to_vector());
}

TEST(Dropout, EvaluationAndPZeroAreTheIdentity) {
  Tensor x = randn({3, 3});
  Generator generator(1);
  EXPECT_TRUE(dropout(x, 0.5, false, &generator).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, &generator).is_same(x));
  EXPECT_EQ(generator.offset(), 0u);  // no random numbers drawn
}

TEST(Dropout, PMustBeInZeroOne) {
  EXPECT_EQ(message_of([] { dropout(ones({2}), 1.0); }), "dropout: p must be in [0, 1) but got 1");
  EXPECT_EQ(message_of([] { dropout(ones({2}), -0.5); }), "dropout: p must be in [0, 1) but got -0.5");
  EXPECT_EQ(message_of([] { dropout(ones({2}), 1.5, false); }), "dropout: p must be in [0, 1) but got 1.5");
  EXPECT_EQ(message_of([] { dropout(arange(4), 0.5); }),
            "dropout: expected a floating tensor (f32, f64, bf16, f16) but got i64");
}

TEST(Dropout, LowPrecisionMatchesF32) {
  Tensor x = randn({1000});
  for (DType dtype : {DType::bf16, DType::f16}) {
    Generator low_generator(3), f32_generator(3);
    Tensor rounded = x.to(dtype);
    std::vector<double> low = dropout(rounded, 0.2, true, &low_generator).to_vector();
    std::vector<double> reference = dropout(rounded.to(DType::f32), 0.2, true, &f32_generator).to_vector();
    for (size_t i = 0; i < low.size(); ++i) EXPECT_NEAR(low[i], reference[i], 1e-2 * (1 + std::abs(reference[i])));
  }
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  Generator generator(9);
  Tensor x = ones({1000}, kF64.with_requires_grad());
  Tensor y = dropout(x, 0.25, true, &generator);
  y.backward(full({1000}, 3.0, kF64));
  std::vector<double> forward = y.to_vector(), grad = x.grad().to_vector();
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_DOUBLE_EQ(grad[i], 3.0 * forward[i]) << "element " << i;
}

// ---- finite differences --------------------------------------------------------------------------

TEST(SelectGradcheck, MaskedFill) {
  Tensor x = randn({2, 3, 3}, kF64.with_requires_grad());
  Tensor mask = causal_mask(3);
  expect_gradcheck([&](const TensorList& in) { return masked_fill(in[0], mask, -5.0); }, {x}, 18);
}

TEST(SelectGradcheck, MaskedFillThenSoftmax) {
  // The attention pattern: scores, masked with -inf, through softmax.
  Tensor x = randn({2, 4, 4}, kF64.with_requires_grad());
  Tensor mask = causal_mask(4);
  const double inf = std::numeric_limits<double>::infinity();
  expect_gradcheck([&](const TensorList& in) { return softmax(masked_fill(in[0], mask, -inf)); }, {x}, 32);
}

TEST(SelectGradcheck, WhereWithBroadcasting) {
  Tensor condition = from_vector({1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0}, {2, 3, 2}, DType::i32);
  Tensor a = randn({3, 1}, kF64.with_requires_grad());
  Tensor b = randn({2}, kF64.with_requires_grad());
  expect_gradcheck([&](const TensorList& in) { return where(condition, in[0], in[1]); }, {a, b}, 5);
}

TEST(SelectGradcheck, WhereSameTensorBothSides) {
  // where(c, x, x) == x: both halves of the gradient land in the one tensor.
  Tensor condition = from_vector({1, 0, 0, 1, 1, 0}, {2, 3}, DType::i64);
  Tensor x = randn({2, 3}, kF64.with_requires_grad());
  expect_gradcheck([&](const TensorList& in) { return where(condition, in[0], in[0]); }, {x}, 6);
}

TEST(SelectGradcheck, Dropout) {
  // A fresh generator with the same seed on every call: the finite differences see the same mask.
  Tensor x = randn({4, 8}, kF64.with_requires_grad());
  expect_gradcheck(
      [](const TensorList& in) {
        Generator generator(123);
        return dropout(in[0], 0.4, true, &generator);
      },
      {x}, 32);
}

}  // namespace
}  // namespace sl
