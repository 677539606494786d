// embedding (tensor/ops/embedding.cpp): row lookup, id checks, the scatter-add backward.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const TensorOptions kF64{DType::f64};

// weight [4, 2]: row v is (10 v, 10 v + 1).
Tensor small_table(const TensorOptions& options = kF64) {
  return from_vector({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, options);
}

TEST(Embedding, LooksUpRowsForAnyIdShape) {
  for (DType id_dtype : {DType::i32, DType::i64}) {
    Tensor ids = from_vector({3, 0, 1, 1, 2, 3}, {2, 3}, id_dtype);
    Tensor out = embedding(small_table(), ids);
    EXPECT_EQ(out.shape(), (Shape{2, 3, 2}));
    EXPECT_EQ(out.to_vector(), (std::vector<double>{30, 31, 0, 1, 10, 11, 10, 11, 20, 21, 30, 31}));
  }
  // A 0-d id gives one row; an empty id tensor gives [0, C].
  EXPECT_EQ(embedding(small_table(), scalar_tensor(2, DType::i64)).to_vector(), (std::vector<double>{20, 21}));
  EXPECT_EQ(embedding(small_table(), zeros({0}, DType::i64)).shape(), (Shape{0, 2}));
}

TEST(Embedding, EveryFloatingDtypeCopiesRowsExactly) {
  Tensor ids = from_vector({2, 0}, {2}, DType::i32);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    Tensor out = embedding(small_table(dtype), ids);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_EQ(out.to_vector(), (std::vector<double>{20, 21, 0, 1}));  // small integers are exact in 16 bits
  }
}

TEST(Embedding, OutOfRangeIdsAreErrors) {
  Tensor weight = zeros({256, 64});
  EXPECT_EQ(message_of([&] {
              embedding(weight, from_vector({5, 300}, {2}, DType::i64));
            }),
            "embedding: index 300 is out of range for a table of 256 rows (weight [256, 64])");
  EXPECT_EQ(message_of([&] { embedding(weight, from_vector({-1}, {1}, DType::i32)); }),
            "embedding: index -1 is out of range for a table of 256 rows (weight [256, 64])");
  EXPECT_EQ(message_of([&] { embedding(weight, from_vector({256}, {1}, DType::i32)); }),
            "embedding: index 256 is out of range for a table of 256 rows (weight [256, 64])");
}

TEST(Embedding, BadArgumentsAreErrors) {
  Tensor weight = zeros({8, 4});
  EXPECT_EQ(message_of([&] {
              embedding(weight, from_vector({1, 2}, {2}));
            }),
            "embedding: ids must be an integer tensor (i32 or i64) but are f32 (shape [2])");
  EXPECT_EQ(message_of([&] { embedding(zeros({8}), from_vector({1}, {1}, DType::i64)); }),
            "embedding: weight must be [V, C] but has shape [8]");
  EXPECT_EQ(message_of([&] {
              embedding(zeros({8, 4}, DType::i64), from_vector({1}, {1}, DType::i64));
            }),
            "embedding: weight must be floating (f32, f64, bf16, f16) but is i64");
}

TEST(Embedding, BackwardScatterAddsRowsAndRepeatsAccumulate) {
  Tensor weight = small_table(kF64.with_requires_grad());
  Tensor ids = from_vector({1, 3, 1}, {3}, DType::i64);
  Tensor out = embedding(weight, ids);
  out.backward(from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, kF64));
  // Row 1 is looked up twice: (1, 2) + (5, 6). Rows 0 and 2 were never used.
  EXPECT_EQ(weight.grad().to_vector(), (std::vector<double>{0, 0, 6, 8, 0, 0, 3, 4}));
}

TEST(Embedding, Bf16BackwardAccumulatesInFloat) {
  // 512 lookups of one row, each adding 1 + 2^-7: summed in bf16 the total stalls at 512 (where
  // bf16's spacing is 4), summed in float it is 516, which bf16 holds exactly.
  Tensor weight = zeros({2, 1}, DType::bf16).set_requires_grad();
  Tensor ids = zeros({512}, DType::i32);
  embedding(weight, ids).backward(full({512, 1}, 1.0 + 1.0 / 128, DType::bf16));
  EXPECT_EQ(weight.grad().dtype(), DType::bf16);
  EXPECT_EQ(weight.grad().to_vector()[0], 516.0);
}

// ---- finite differences --------------------------------------------------------------------------

TEST(EmbeddingGradcheck, IdUsedTwice) {
  Generator generator(1);
  Tensor weight = randn({5, 3}, kF64.with_requires_grad(), &generator);
  Tensor ids = from_vector({4, 0, 4, 2, 2, 2}, {2, 3}, DType::i64);
  expect_gradcheck([&](const TensorList& in) { return embedding(in[0], ids); }, {weight}, 15);
}

TEST(EmbeddingGradcheck, I32IdsFeedingASecondLookup) {
  // Two lookups into the same table, combined: the table gets both scatter-adds.
  Generator generator(2);
  Tensor weight = randn({4, 2}, kF64.with_requires_grad(), &generator);
  Tensor ids_a = from_vector({0, 3, 3}, {3}, DType::i32);
  Tensor ids_b = from_vector({3, 1, 0}, {3}, DType::i32);
  expect_gradcheck([&](const TensorList& in) { return mul(embedding(in[0], ids_a), embedding(in[0], ids_b)); },
                   {weight}, 8);
}

}  // namespace
}  // namespace sl
