// Layout ops: reshape, transpose, permute, narrow, cat, split, chunk — values against an index loop,
// every dtype, errors, and finite-difference gradchecks (suite LayoutGradcheck).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

// 0, 1, 2, ... in `shape`, so every element says where it came from.
Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  std::vector<double> values(shape.numel());
  std::iota(values.begin(), values.end(), 0.0);
  return from_vector(values, shape, TensorOptions{dtype});
}

#define EXPECT_MESSAGE_HAS(statement, ...)                                                        \
  do {                                                                                            \
    std::string message = message_of([&] { statement; });                                         \
    for (const char* part : {__VA_ARGS__})                                                        \
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message; \
  } while (0)

// The reference permute: out[i_0..i_n] = x[i at perm positions], one multi-index at a time.
std::vector<double> permute_by_index(const Tensor& x, const std::vector<int>& perm) {
  std::vector<double> in = x.to_vector(), out(in.size());
  std::vector<int64_t> in_strides = contiguous_strides(x.shape());
  Shape out_shape;
  for (int d : perm) out_shape.push_back(x.shape()[d]);
  std::vector<int64_t> out_strides = contiguous_strides(out_shape);
  for (int64_t flat = 0; flat < static_cast<int64_t>(out.size()); ++flat) {
    int64_t source = 0;
    for (size_t k = 0; k < perm.size(); ++k) source += (flat / out_strides[k] % out_shape[k]) * in_strides[perm[k]];
    out[flat] = in[source];
  }
  return out;
}

std::string dims_str(const std::vector<int>& dims) { return Shape(dims.begin(), dims.end()).str(); }

TensorOptions f64_grad() { return TensorOptions{DType::f64}.with_requires_grad(); }

// ---- reshape ---------------------------------------------------------------------------------------

TEST(Layout, ReshapeSharesStorageAndInfersMinusOne) {
  Tensor x = iota({2, 3, 4});
  Tensor y = reshape(x, {4, -1});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  EXPECT_EQ(y.raw_data(), x.raw_data());
  EXPECT_EQ(y.to_vector(), x.to_vector());
  EXPECT_EQ(x.reshape({-1}).shape(), (Shape{24}));
  EXPECT_EQ(reshape(iota({1}), {}).shape(), Shape{});
  EXPECT_EQ(reshape(iota({0, 3}), {3, 0, 5}).shape(), (Shape{3, 0, 5}));
}

TEST(Layout, ReshapeOfAFlatViewKeepsItsOffset) {
  Tensor flat = iota({10}, DType::i64);
  Tensor view = flat.flat_view(4, {6});
  EXPECT_EQ(reshape(view, {2, 3}).to_vector(), (std::vector<double>{4, 5, 6, 7, 8, 9}));
}

TEST(Layout, ReshapeErrorsNameShapesAndCounts) {
  Tensor x = iota({2, 3});
  EXPECT_MESSAGE_HAS(reshape(x, {4, 2}), "reshape", "[2, 3]", "6 elements", "[4, 2]", "8 elements");
  EXPECT_MESSAGE_HAS(reshape(x, {-1, -1}), "only one size may be -1");
  EXPECT_MESSAGE_HAS(reshape(x, {4, -1}), "[2, 3]", "[4, -1]");
  EXPECT_MESSAGE_HAS(reshape(x, {-2, 3}), "invalid size -2");
  EXPECT_MESSAGE_HAS(reshape(iota({0}), {0, -1}), "[0, -1]");
}

// ---- transpose and permute -------------------------------------------------------------------------

TEST(Layout, TransposeTwoByThree) {
  Tensor y = transpose(iota({2, 3}), 0, 1);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(iota({2, 3}).transpose(-1, -2).to_vector(), y.to_vector());
  Tensor same = transpose(iota({2, 3}), 1, -1);  // a swap of a dim with itself copies
  EXPECT_EQ(same.to_vector(), iota({2, 3}).to_vector());
}

TEST(Layout, TransposeAttentionHeads) {
  // [B, T, NH, HS] -> [B, NH, T, HS] and back, as attention does.
  Tensor x = randn({2, 5, 3, 4});
  Tensor heads = transpose(x, 1, 2);
  EXPECT_EQ(heads.shape(), (Shape{2, 3, 5, 4}));
  EXPECT_EQ(heads.to_vector(), permute_by_index(x, {0, 2, 1, 3}));
  EXPECT_EQ(transpose(heads, 1, 2).to_vector(), x.to_vector());
}

TEST(Layout, TransposeLastTwoDimsAcrossTiles) {
  // [B, NH, T, HS] -> [B, NH, HS, T] (k^T), sizes that are not multiples of the 32-wide tile.
  Tensor x = iota({2, 3, 37, 45}, DType::f64);
  EXPECT_EQ(transpose(x, -1, -2).to_vector(), permute_by_index(x, {0, 1, 3, 2}));
}

TEST(Layout, PermuteMatchesIndexLoopForEveryOrderAndDtype) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    for (Shape shape : {Shape{2, 3, 4, 5}, Shape{2, 1, 3, 4}, Shape{1, 3, 1, 2}}) {
      Tensor x = iota(shape, dtype);
      std::vector<int> perm = {0, 1, 2, 3};
      do {
        Tensor y = permute(x, perm);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_EQ(y.to_vector(), permute_by_index(x, perm)) << dtype_name(dtype) << " " << shape;
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
  EXPECT_EQ(permute(iota({2, 3, 4}), {-1, 0, -2}).to_vector(), permute_by_index(iota({2, 3, 4}), {2, 0, 1}));
  EXPECT_EQ(iota({2, 3}).permute({1, 0}).to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(permute(scalar_tensor(7), {}).item(), 7);
  EXPECT_EQ(permute(iota({0, 3}), {1, 0}).shape(), (Shape{3, 0}));
}

TEST(Layout, PermuteAcrossTileBoundaries) {
  // Sizes past the 32/64-element tiles of the element transpose, in 4- and 8-byte dtypes.
  for (DType dtype : {DType::f32, DType::i64}) {
    Tensor x = iota({2, 70, 3, 67}, dtype);
    std::vector<int> perm = {0, 1, 2, 3};
    do {
      EXPECT_EQ(permute(x, perm).to_vector(), permute_by_index(x, perm)) << dtype_name(dtype) << " " << dims_str(perm);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(Layout, HalfPrecisionLayoutMatchesF32) {
  Tensor x = randn({3, 4, 5});
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor half = permute(x.to(dtype), {2, 0, 1}).to(DType::f32);
    EXPECT_TRUE(allclose(half, permute(x, {2, 0, 1}), 1e-2, 1e-2)) << dtype_name(dtype);
    Tensor pieces = cat(split(x.to(dtype), {1, 3}, 1), 1).to(DType::f32);
    EXPECT_TRUE(allclose(pieces, x, 1e-2, 1e-2)) << dtype_name(dtype);
  }
}

TEST(Layout, PermuteAndTransposeErrors) {
  Tensor x = iota({2, 3, 4});
  EXPECT_MESSAGE_HAS(permute(x, {0, 0, 1}), "permute: dims [0, 0, 1] are not a permutation", "[2, 3, 4]");
  EXPECT_MESSAGE_HAS(permute(x, {0, 1}), "permute: dims [0, 1]", "3 dims");
  EXPECT_MESSAGE_HAS(permute(x, {0, 1, 3}), "[0, 1, 3]");
  EXPECT_MESSAGE_HAS(permute(x, {0, 2, -1}), "[0, 2, -1]");
  EXPECT_MESSAGE_HAS(transpose(x, 0, 3), "transpose", "dim 3", "[2, 3, 4]");
}

// ---- narrow --------------------------------------------------------------------------------------

TEST(Layout, NarrowCopiesASlice) {
  Tensor x = iota({3, 4}, DType::i32);
  Tensor y = narrow(x, 1, 1, 2);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.dtype(), DType::i32);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(x.narrow(0, 2, 1).to_vector(), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(narrow(x, -1, -1, 1).to_vector(), (std::vector<double>{3, 7, 11}));  // negative dim and start
  EXPECT_EQ(narrow(x, 0, 3, 0).shape(), (Shape{0, 4}));
  EXPECT_NE(narrow(x, 0, 0, 3).raw_data(), x.raw_data());
}

TEST(Layout, NarrowErrors) {
  Tensor x = iota({3, 4});
  EXPECT_MESSAGE_HAS(narrow(x, 1, 3, 2), "narrow: start 3 + length 2", "size 4", "[3, 4]");
  EXPECT_MESSAGE_HAS(narrow(x, 1, 5, 0), "narrow: start 5 is out of range");
  EXPECT_MESSAGE_HAS(narrow(x, 0, 0, -1), "length -1");
  EXPECT_MESSAGE_HAS(narrow(x, 2, 0, 1), "narrow: dim 2 is out of range");
}

TEST(Layout, NarrowBackwardWritesIntoZeros) {
  Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, TensorOptions{}.with_requires_grad());
  narrow(x, 1, 1, 2).backward(from_vector({10, 20, 30, 40}, {2, 2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 10, 20, 0, 30, 40}));
}

// ---- cat, split, chunk ---------------------------------------------------------------------------

TEST(Layout, CatAlongEachDim) {
  Tensor a = iota({2, 2}), b = add(iota({2, 3}), 10.0);
  EXPECT_EQ(cat({a, b}, 1).to_vector(), (std::vector<double>{0, 1, 10, 11, 12, 2, 3, 13, 14, 15}));
  EXPECT_EQ(cat({a, b}, -1).shape(), (Shape{2, 5}));
  Tensor c = cat({a, iota({1, 2}), a}, 0);
  EXPECT_EQ(c.shape(), (Shape{5, 2}));
  EXPECT_EQ(c.to_vector(), (std::vector<double>{0, 1, 2, 3, 0, 1, 0, 1, 2, 3}));
  Tensor ids = cat({iota({2}, DType::i64), iota({0}, DType::i64), iota({1}, DType::i64)}, 0);
  EXPECT_EQ(ids.dtype(), DType::i64);
  EXPECT_EQ(ids.to_vector(), (std::vector<double>{0, 1, 0}));
  Tensor single = cat({a}, 0);
  EXPECT_FALSE(single.is_same(a));
  EXPECT_EQ(single.to_vector(), a.to_vector());
}

TEST(Layout, CatErrorsNameTheOffendingTensor) {
  Tensor a = iota({2, 3});
  EXPECT_MESSAGE_HAS(cat({}, 0), "cat: expected a non-empty list");
  EXPECT_MESSAGE_HAS(cat({a, a, iota({2, 4})}, 0), "cat: tensor 2 has shape [2, 4] but tensor 0 has shape [2, 3]",
                     "except in dim 0");
  EXPECT_MESSAGE_HAS(cat({a, iota({2, 3, 1})}, 1), "tensor 1 has shape [2, 3, 1]");
  EXPECT_MESSAGE_HAS(cat({a, iota({2, 3}, DType::f64)}, 0), "cat: tensor 1 has dtype f64 but tensor 0 has dtype f32");
  EXPECT_MESSAGE_HAS(cat({a, Tensor()}, 0), "cat: tensor 1 is undefined");
  EXPECT_MESSAGE_HAS(cat({a, a}, 2), "cat: dim 2 is out of range");
  EXPECT_MESSAGE_HAS(cat({scalar_tensor(1), scalar_tensor(2)}, 0), "cat: dim 0 is out of range", "[]");
}

TEST(Layout, SplitBySizesAndBySize) {
  Tensor x = iota({2, 5}, DType::i32);
  std::vector<Tensor> pieces = split(x, {1, 0, 4}, -1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].to_vector(), (std::vector<double>{0, 5}));
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 0}));
  EXPECT_EQ(pieces[2].to_vector(), (std::vector<double>{1, 2, 3, 4, 6, 7, 8, 9}));
  EXPECT_EQ(pieces[2].dtype(), DType::i32);
  std::vector<Tensor> equal = split(x, 2, 1);  // 2, 2 and a short 1
  ASSERT_EQ(equal.size(), 3u);
  EXPECT_EQ(equal[1].to_vector(), (std::vector<double>{2, 3, 7, 8}));
  EXPECT_EQ(equal[2].shape(), (Shape{2, 1}));
  EXPECT_EQ(split(x, 7, 1).size(), 1u);
  EXPECT_EQ(split(iota({0, 2}), 3, 0).size(), 1u);
}

TEST(Layout, ChunkLikePyTorch) {
  auto sizes_of = [](const std::vector<Tensor>& pieces) {
    std::vector<int64_t> sizes;
    for (const Tensor& p : pieces) sizes.push_back(p.size(0));
    return sizes;
  };
  EXPECT_EQ(sizes_of(chunk(iota({6}), 3, 0)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes_of(chunk(iota({5}), 4, 0)), (std::vector<int64_t>{2, 2, 1}));  // ceil(5/4) = 2: only 3 pieces
  EXPECT_EQ(sizes_of(chunk(iota({5}), 2, -1)), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(sizes_of(chunk(iota({2}), 5, 0)), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(sizes_of(chunk(iota({0}), 3, 0)), (std::vector<int64_t>{0, 0, 0}));
  // qkv [B, T, 3C] -> q, k, v
  std::vector<Tensor> qkv = chunk(iota({1, 2, 6}), 3, 2);
  EXPECT_EQ(qkv[1].to_vector(), (std::vector<double>{2, 3, 8, 9}));
}

TEST(Layout, SplitErrors) {
  Tensor x = iota({3, 5});
  EXPECT_MESSAGE_HAS(split(x, {2, 2}, 1), "split: sizes [2, 2] sum to 4 but dim 1 of shape [3, 5] has size 5");
  EXPECT_MESSAGE_HAS(split(x, {-1, 6}, 1), "split: negative size in [-1, 6]");
  EXPECT_MESSAGE_HAS(split(x, 0, 1), "split size must be positive (got 0)");
  EXPECT_MESSAGE_HAS(chunk(x, 0, 1), "chunk: number of chunks must be positive (got 0)", "[3, 5]");
  EXPECT_MESSAGE_HAS(chunk(x, 2, -3), "chunk: dim -3 is out of range");
}

TEST(Layout, SplitBackwardFillsMissingGradientsWithZeros) {
  Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {6}, TensorOptions{}.with_requires_grad());
  std::vector<Tensor> pieces = chunk(x, 3, 0);
  EXPECT_TRUE(pieces[1].grad_fn() == pieces[0].grad_fn());  // one node, three outputs
  pieces[1].backward(from_vector({7, 8}, {2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 7, 8, 0, 0}));
}

TEST(Layout, IntegerResultsCarryNoGradient) {
  Tensor ids = iota({2, 3}, DType::i64);
  EXPECT_FALSE(transpose(ids, 0, 1).requires_grad());
  EXPECT_FALSE(cat({ids, ids}, 0).requires_grad());
  EXPECT_FALSE(split(ids, 1, 0)[0].requires_grad());
  Tensor x = iota({2, 3}).set_requires_grad();
  EXPECT_TRUE(reshape(x, {3, 2}).requires_grad());
  EXPECT_FALSE(reshape(x, {3, 2}).is_leaf());
}

// ---- gradchecks (f64, finite differences) ---------------------------------------------------------

TEST(LayoutGradcheck, Reshape) {
  expect_gradcheck([](const TensorList& in) { return reshape(in[0], {4, -1}); }, {randn({2, 3, 4}, f64_grad())}, 24);
}

TEST(LayoutGradcheck, Transpose) {
  expect_gradcheck([](const TensorList& in) { return transpose(in[0], 1, 2); }, {randn({2, 3, 4, 2}, f64_grad())}, 48);
  expect_gradcheck([](const TensorList& in) { return transpose(in[0], -1, -2); }, {randn({2, 3, 5}, f64_grad())}, 30);
}

TEST(LayoutGradcheck, Permute) {
  expect_gradcheck(
      [](const TensorList& in) {
        return permute(in[0], {2, 0, 3, 1});
      },
      {randn({2, 3, 4, 2}, f64_grad())}, 48);
}

TEST(LayoutGradcheck, Narrow) {
  expect_gradcheck([](const TensorList& in) { return narrow(in[0], -2, 1, 2); }, {randn({2, 4, 3}, f64_grad())}, 24);
}

TEST(LayoutGradcheck, Cat) {
  expect_gradcheck(
      [](const TensorList& in) {
        return cat({in[0], in[1]}, -1);
      },
      {randn({2, 3}, f64_grad()), randn({2, 2}, f64_grad())}, 6 + 4);
  // Only the second input needs a gradient.
  expect_gradcheck(
      [](const TensorList& in) {
        return cat({in[0], in[1]}, 0);
      },
      {randn({1, 3}, TensorOptions{DType::f64}), randn({2, 3}, f64_grad())}, 6);
}

TEST(LayoutGradcheck, CatOfTheSameTensorTwice) {
  expect_gradcheck([](const TensorList& in) { return cat({in[0], in[0]}, 0); }, {randn({2, 3}, f64_grad())}, 6);
}

TEST(LayoutGradcheck, Split) {
  // Pieces 0 and 2 used (in the other order), piece 1 dropped: its gradient is zero.
  expect_gradcheck(
      [](const TensorList& in) {
        std::vector<Tensor> pieces = split(in[0], {1, 2, 2}, 1);
        return cat({pieces[2], pieces[0]}, 1);
      },
      {randn({3, 5}, f64_grad())}, 15);
  expect_gradcheck([](const TensorList& in) { return split(in[0], 2, 0)[2]; }, {randn({5, 2}, f64_grad())}, 10);
}

TEST(LayoutGradcheck, ChunkWithOnlyTheFirstChunkUsed) {
  expect_gradcheck([](const TensorList& in) { return sum(chunk(in[0], 3, -1)[0]); }, {randn({2, 6}, f64_grad())}, 12);
  expect_gradcheck(
      [](const TensorList& in) {
        std::vector<Tensor> qkv = chunk(in[0], 3, 2);
        return add(qkv[0], qkv[2]);
      },
      {randn({1, 2, 6}, f64_grad())}, 12);
}

}  // namespace
}  // namespace sl
