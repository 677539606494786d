// index_select, index_add, gather and topk (tensor/ops/index.cpp): values, repeats, errors, and
// backward by hand and by finite differences in f64.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// [3, 2]: row r is (10 r, 10 r + 1).
Tensor rows3(const TensorOptions& options = kF64) { return from_vector({0, 1, 10, 11, 20, 21}, {3, 2}, options); }

TEST(IndexSelect, PicksRowsInIndexOrderWithRepeats) {
  for (DType id_dtype : {DType::i32, DType::i64}) {
    Tensor out = index_select(rows3(), from_vector({2, 0, 2}, {3}, id_dtype));
    EXPECT_EQ(out.shape(), (Shape{3, 2}));
    EXPECT_EQ(out.to_vector(), (std::vector<double>{20, 21, 0, 1, 20, 21}));
  }
  // Rows of any shape: x [2, 2, 2] -> [1, 2, 2]; an empty index gives no rows.
  Tensor x = arange(0, 8, 1, kF64).reshape({2, 2, 2});
  EXPECT_EQ(index_select(x, from_vector({1}, {1}, DType::i64)).to_vector(), (std::vector<double>{4, 5, 6, 7}));
  EXPECT_EQ(index_select(x, zeros({0}, DType::i64)).shape(), (Shape{0, 2, 2}));
}

TEST(IndexSelect, BackwardAddsTheGradientRowsBack) {
  Tensor x = rows3(kF64.with_requires_grad());
  index_select(x, from_vector({1, 1, 0}, {3}, DType::i64)).backward(from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, kF64));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5, 6, 4, 6, 0, 0}));  // row 1: (1,2)+(3,4); row 2 unused
}

TEST(IndexSelect, GradcheckF64) {
  Tensor x = randn({4, 3}, kF64.with_requires_grad());
  Tensor index = from_vector({3, 0, 3, 2, 3}, {5}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return index_select(in[0], index); }, {x}, 12);
}

TEST(IndexAdd, AddsRowsIntoBaseAndRepeatsAccumulate) {
  Tensor base = rows3();
  Tensor src = from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, kF64);
  Tensor out = index_add(base, from_vector({2, 0, 2}, {3}, DType::i32), src);
  EXPECT_EQ(out.to_vector(), (std::vector<double>{3, 5, 10, 11, 26, 29}));  // row 2: 20+1+5, 21+2+6
}

TEST(IndexAdd, BackwardIsIndexSelectOfTheGradient) {
  Tensor base = zeros({3, 2}, kF64.with_requires_grad());
  Tensor src = zeros({2, 2}, kF64.with_requires_grad());
  index_add(base, from_vector({2, 2}, {2}, DType::i64), src).backward(rows3());
  EXPECT_EQ(base.grad().to_vector(), rows3().to_vector());
  EXPECT_EQ(src.grad().to_vector(), (std::vector<double>{20, 21, 20, 21}));
}

TEST(IndexAdd, GradcheckF64) {
  Tensor base = randn({3, 2, 2}, kF64.with_requires_grad());
  Tensor src = randn({4, 2, 2}, kF64.with_requires_grad());
  Tensor index = from_vector({1, 0, 1, 1}, {4}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return index_add(in[0], index, in[1]); }, {base, src}, 28);
}

TEST(IndexAdd, Bf16SumsInFloat) {
  // 512 rows of 1 + 2^-7 into one: summed in bf16 the total stalls at 512, in float it is 516.
  Tensor out = index_add(zeros({1, 1}, DType::bf16), zeros({512}, DType::i64), full({512, 1}, 1.0 + 1.0 / 128, DType::bf16));
  EXPECT_EQ(out.to_vector(), (std::vector<double>{516}));
}

TEST(Gather, PicksAlongTheLastDimAndScattersItsGradient) {
  Tensor x = from_vector({0, 1, 2, 10, 11, 12}, {2, 3}, kF64.with_requires_grad());
  Tensor out = gather(x, from_vector({2, 0, 1, 1}, {2, 2}, DType::i64));
  EXPECT_EQ(out.to_vector(), (std::vector<double>{2, 0, 11, 11}));
  out.backward(from_vector({1, 2, 3, 4}, {2, 2}, kF64));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 0, 1, 0, 7, 0}));
}

TEST(Gather, GradcheckF64) {
  Tensor x = randn({2, 2, 4}, kF64.with_requires_grad());
  Tensor index = from_vector({3, 1, 0, 0, 2, 3, 1, 2}, {2, 2, 2}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return gather(in[0], index); }, {x}, 16);
}

TEST(TopK, LargestFirstAndTiesGoToTheLowerIndex) {
  Tensor x = from_vector({0.1, 0.7, 0.2, 0.7, 5, -1, 3, 4}, {2, 4}, kF64);
  TopK top = topk(x, 2);
  EXPECT_EQ(top.indices.dtype(), DType::i64);
  EXPECT_EQ(top.indices.to_vector(), (std::vector<double>{1, 3, 0, 3}));
  EXPECT_EQ(top.values.to_vector(), (std::vector<double>{0.7, 0.7, 5, 4}));
  EXPECT_EQ(topk(x, 4).indices.to_vector(), (std::vector<double>{1, 3, 2, 0, 0, 3, 2, 1}));
}

TEST(TopK, TheChosenValuesCarryGradientTheChoiceDoesNot) {
  Tensor x = from_vector({0.3, -1, 2, 0.5}, {1, 4}, kF64.with_requires_grad());
  sum(topk(x, 2).values).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 1, 1}));
  // Away from ties the choice is locally constant, so finite differences see only the values.
  Tensor y = from_vector({0.3, -1, 2, 0.5, 1.5, 0.1, -0.4, 0.9, 0, 0.2, 0.6, -2}, {3, 4}, kF64.with_requires_grad());
  expect_gradcheck([&](const TensorList& in) { return topk(in[0], 2).values; }, {y}, 12);
}

TEST(IndexOps, BadArgumentsAreErrors) {
  EXPECT_EQ(message_of([&] { index_select(rows3(), from_vector({3}, {1}, DType::i64)); }),
            "index_select: index 3 is out of range for 3 rows (shape [3, 2])");
  EXPECT_EQ(message_of([&] { index_select(rows3(), from_vector({1}, {1})); }),
            "index_select: index must be a 1-D integer tensor (i32 or i64), got f32 of shape [1]");
  EXPECT_EQ(message_of([&] { index_add(rows3(), from_vector({-1}, {1}, DType::i64), zeros({1, 2}, kF64)); }),
            "index_add: index -1 is out of range for 3 rows (shape [3, 2])");
  EXPECT_EQ(message_of([&] { index_add(rows3(), from_vector({0}, {1}, DType::i64), zeros({2, 2}, kF64)); }),
            "index_add: src must be [M, ...] with M = index's 1 rows and base's row shape, got base [3, 2], src [2, 2]");
  EXPECT_EQ(message_of([&] { gather(rows3(), from_vector({2}, {1, 1}, DType::i64)); }),
            "gather: index [1, 1] must match x [3, 2] in every dim but the last");
  EXPECT_EQ(message_of([&] { gather(rows3(), from_vector({2, 0, 0}, {3, 1}, DType::i64)); }),
            "gather: index 2 is out of range for a last dim of 2 (x [3, 2])");
  EXPECT_EQ(message_of([&] { topk(rows3(), 3); }), "topk: k (3) must be in [1, 2] for x [3, 2]");
}

}  // namespace
}  // namespace sl
