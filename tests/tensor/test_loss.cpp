// cross_entropy (tensor/ops/loss.cpp): -log softmax by hand, ignore_index, errors, dtypes, and the
// fused backward (softmax - one_hot) / count by hand and by finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// -log softmax(row)[target], written the obvious way.
double row_loss(const std::vector<double>& logits, int64_t V, int64_t row, int64_t target) {
  double total = 0;
  for (int64_t v = 0; v < V; ++v) total += std::exp(logits[row * V + v]);
  return -std::log(std::exp(logits[row * V + target]) / total);
}

TEST(CrossEntropy, IsTheMeanOfMinusLogSoftmaxAtTheTargets) {
  Generator generator(1);
  Tensor logits = randn({3, 5}, kF64, &generator);
  std::vector<double> x = logits.to_vector();
  for (DType id_dtype : {DType::i32, DType::i64}) {
    Tensor targets = from_vector({0, 4, 2}, {3}, id_dtype);
    double expected = (row_loss(x, 5, 0, 0) + row_loss(x, 5, 1, 4) + row_loss(x, 5, 2, 2)) / 3;
    Tensor loss = cross_entropy(logits, targets);
    EXPECT_EQ(loss.shape(), Shape{});
    EXPECT_NEAR(loss.item(), expected, 1e-12);
  }
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  Tensor logits = zeros({2, 3, 8}, kF64);
  Tensor targets = from_vector({0, 1, 2, 3, 4, 7}, {2, 3}, DType::i64);
  EXPECT_NEAR(cross_entropy(logits, targets).item(), std::log(8.0), 1e-12);
}

TEST(CrossEntropy, HugeLogitsAreStable) {
  Tensor logits = from_vector({1000, 1001, 1002}, {1, 3}, kF64);
  double expected = std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0) + 2.0;  // target 0 is 2 below the max
  EXPECT_NEAR(cross_entropy(logits, from_vector({0}, {1}, DType::i64)).item(), expected, 1e-12);
  EXPECT_NEAR(cross_entropy(logits.to(DType::f32), from_vector({0}, {1}, DType::i64)).item(), expected, 1e-5);
}

TEST(CrossEntropy, IgnoredRowsDoNotCount) {
  Generator generator(2);
  Tensor logits = randn({4, 3}, kF64, &generator);
  std::vector<double> x = logits.to_vector();
  Tensor targets = from_vector({2, -100, 0, -100}, {4}, DType::i64);
  double expected = (row_loss(x, 3, 0, 2) + row_loss(x, 3, 2, 0)) / 2;  // mean over the 2 counted rows
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-12);
  // An ignore_index inside [0, V) works too: rows whose target is 0 drop out.
  Tensor targets_b = from_vector({2, 1, 0, 0}, {4}, DType::i32);
  EXPECT_NEAR(cross_entropy(logits, targets_b, 0).item(), (row_loss(x, 3, 0, 2) + row_loss(x, 3, 1, 1)) / 2, 1e-12);
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndZeroGradient) {
  // PyTorch gives 0/0 = NaN; shardlab gives 0, so an all-padding micro-batch adds nothing.
  Tensor logits = randn({2, 3}, kF64.with_requires_grad());
  Tensor loss = cross_entropy(logits, full({2}, -100, DType::i64));
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  EXPECT_EQ(logits.grad().to_vector(), std::vector<double>(6, 0.0));
}

TEST(CrossEntropy, BackwardIsSoftmaxMinusOneHotOverCount) {
  Tensor logits = from_vector({0.5, -1, 2, 0, 0, 0, 1, 2, 3}, {3, 3}, kF64.with_requires_grad());
  Tensor targets = from_vector({2, -100, 0}, {3}, DType::i64);
  cross_entropy(logits, targets).backward(scalar_tensor(3.0, kF64));  // g = 3, count = 2: scale 1.5
  std::vector<double> x = logits.detach().to_vector();
  std::vector<double> expected(9, 0.0);
  for (int64_t row : {0, 2}) {
    double total = 0;
    for (int v = 0; v < 3; ++v) total += std::exp(x[row * 3 + v]);
    for (int v = 0; v < 3; ++v) expected[row * 3 + v] = std::exp(x[row * 3 + v]) / total * 1.5;
  }
  expected[0 * 3 + 2] -= 1.5;
  expected[2 * 3 + 0] -= 1.5;
  std::vector<double> grad = logits.grad().to_vector();
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(grad[i], expected[i], 1e-12) << "element " << i;
}

TEST(CrossEntropy, TargetOutOfRangeIsAnError) {
  Tensor logits = zeros({2, 4});
  EXPECT_EQ(message_of([&] {
              cross_entropy(logits, from_vector({1, 7}, {2}, DType::i64));
            }),
            "cross_entropy: target 7 is out of range for 4 classes (logits [2, 4], ignore_index -100)");
  EXPECT_EQ(message_of([&] {
              cross_entropy(logits, from_vector({-1, 0}, {2}, DType::i32));
            }),
            "cross_entropy: target -1 is out of range for 4 classes (logits [2, 4], ignore_index -100)");
  // -100 is out of range too once it is not the ignore_index.
  EXPECT_EQ(message_of([&] {
              cross_entropy(logits, from_vector({-100, 0}, {2}, DType::i32), 3);
            }),
            "cross_entropy: target -100 is out of range for 4 classes (logits [2, 4], ignore_index 3)");
}

TEST(CrossEntropy, ShapeAndDtypeErrors) {
  Tensor logits = zeros({2, 3, 4});
  EXPECT_EQ(message_of([&] {
              cross_entropy(logits, zeros({3, 2}, DType::i64));
            }),
            "cross_entropy: logits [2, 3, 4] need targets of shape [2, 3] but targets have shape [3, 2]");
  EXPECT_EQ(message_of([&] { cross_entropy(logits, zeros({6}, DType::i64)); }),
            "cross_entropy: logits [2, 3, 4] need targets of shape [2, 3] but targets have shape [6]");
  EXPECT_EQ(message_of([&] {
              cross_entropy(logits, zeros({2, 3}));
            }),
            "cross_entropy: targets must be class indices (i32 or i64) but are f32 (shape [2, 3])");
  EXPECT_EQ(message_of([&] {
              cross_entropy(zeros({2, 4}, DType::i64), zeros({2}, DType::i64));
            }),
            "cross_entropy: expected a floating tensor (f32, f64, bf16, f16) but got i64");
}

TEST(CrossEntropy, LowPrecisionLogitsGiveAnF32LossAndGradientsInTheirDtype) {
  Generator generator(3);
  Tensor logits = randn({16, 50}, TensorOptions{DType::f32}, &generator);
  Tensor targets = from_vector({0, 49, 3, 7, -100, 12, 13, 44, 5, 5, 5, 1, 2, 30, 31, 32}, {16}, DType::i64);
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor low = logits.to(dtype);
    Tensor loss = cross_entropy(low, targets);
    EXPECT_EQ(loss.dtype(), DType::f32);  // a reduction: computed and returned in f32
    double reference = cross_entropy(low.to(DType::f32), targets).item();
    EXPECT_NEAR(loss.item(), reference, 1e-6 * std::abs(reference));  // the same rows, summed in f32
    Tensor leaf = low.detach().set_requires_grad();
    cross_entropy(leaf, targets).backward();
    EXPECT_EQ(leaf.grad().dtype(), dtype);  // dlogits keeps the logits' dtype
  }
}

// ---- finite differences --------------------------------------------------------------------------

TEST(CrossEntropyGradcheck, Basic) {
  Generator generator(4);
  Tensor logits = randn({4, 5}, kF64.with_requires_grad(), &generator);
  Tensor targets = from_vector({1, 0, 4, 4}, {4}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return cross_entropy(in[0], targets); }, {logits}, 20);
}

TEST(CrossEntropyGradcheck, WithIgnoreIndexBTV) {
  Generator generator(5);
  Tensor logits = randn({2, 3, 4}, kF64.with_requires_grad(), &generator);
  Tensor targets = from_vector({3, -100, 0, -100, 2, 1}, {2, 3}, DType::i32);
  expect_gradcheck([&](const TensorList& in) { return cross_entropy(in[0], targets); }, {logits}, 24);
}

TEST(CrossEntropyGradcheck, AllIgnoredIsFlat) {
  Tensor logits = randn({2, 3}, kF64.with_requires_grad());
  Tensor targets = from_vector({1, 1}, {2}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return cross_entropy(in[0], targets, 1); }, {logits}, 6);
}

TEST(CrossEntropyGradcheck, SameLogitsUsedTwice) {
  // The logits feed two losses (directly, and squared): their gradients add.
  Generator generator(6);
  Tensor logits = randn({3, 4}, kF64.with_requires_grad(), &generator);
  Tensor targets = from_vector({0, 3, 2}, {3}, DType::i64);
  expect_gradcheck(
      [&](const TensorList& in) {
        return add(cross_entropy(in[0], targets), cross_entropy(mul(in[0], in[0]), targets));
      },
      {logits}, 12);
}

}  // namespace
}  // namespace sl
