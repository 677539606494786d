// test_matmul.cpp — matmul against a naive triple loop, for every transpose combination and batch
// broadcast; its backward against the formulas and against finite differences; errors; threads.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace {

using sl::Shape;
using sl::Tensor;

// What a test multiplies: logical op(A) [..a_batch, M, K] @ op(B) [..b_batch, K, N].
struct MatmulCase {
  std::string name;
  Shape a_batch, b_batch;
  int64_t M, K, N;
  bool ta = false, tb = false;

  Shape a_shape() const { return concat(a_batch, ta ? Shape{K, M} : Shape{M, K}); }
  Shape b_shape() const { return concat(b_batch, tb ? Shape{N, K} : Shape{K, N}); }
  static Shape concat(Shape batch, const Shape& matrix) {
    batch.insert(batch.end(), matrix.begin(), matrix.end());
    return batch;
  }
};

std::string flags_name(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }

// The naive reference, in double: out[batch, m, n] = sum_k op(A)[m, k] op(B)[k, n].
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, Shape* out_shape) {
  const Shape &sa = a.shape(), &sb = b.shape();
  int64_t M = ta ? sa[sa.dim() - 1] : sa[sa.dim() - 2], K = ta ? sa[sa.dim() - 2] : sa[sa.dim() - 1];
  int64_t N = tb ? sb[sb.dim() - 2] : sb[sb.dim() - 1];
  Shape a_batch(sa.begin(), sa.end() - 2), b_batch(sb.begin(), sb.end() - 2);
  int nd = std::max(a_batch.dim(), b_batch.dim());
  while (a_batch.dim() < nd) a_batch.insert(a_batch.begin(), 1);
  while (b_batch.dim() < nd) b_batch.insert(b_batch.begin(), 1);
  Shape batch(nd);
  for (int d = 0; d < nd; ++d) batch[d] = std::max(a_batch[d], b_batch[d]);
  std::vector<double> av = a.to_vector(), bv = b.to_vector();
  std::vector<double> out(batch.numel() * M * N, 0.0);
  for (int64_t e = 0; e < batch.numel(); ++e) {
    int64_t rest = e, a_entry = 0, b_entry = 0, a_stride = 1, b_stride = 1;
    for (int d = nd - 1; d >= 0; --d) {  // the batch index, digit by digit from the last dim
      int64_t i = rest % batch[d];
      rest /= batch[d];
      a_entry += (a_batch[d] == 1 ? 0 : i) * a_stride;
      b_entry += (b_batch[d] == 1 ? 0 : i) * b_stride;
      a_stride *= a_batch[d];
      b_stride *= b_batch[d];
    }
    const double* A = av.data() + a_entry * M * K;
    const double* B = bv.data() + b_entry * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double total = 0;
        for (int64_t k = 0; k < K; ++k)
          total += (ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
        out[(e * M + m) * N + n] = total;
      }
  }
  *out_shape = batch;
  out_shape->push_back(M);
  out_shape->push_back(N);
  return out;
}

// Every element within t·(1 + |want|) (tests/support/compare.h).
using sl::test_support::expect_close;
using sl::test_support::within;

using sl::expect_error;
using sl::expect_gradcheck;

// ---- values ------------------------------------------------------------------------------------------

std::vector<MatmulCase> shape_cases() {
  return {
      {"matrix", {}, {}, 3, 4, 5},
      {"batch_at_matrix", {2, 3}, {}, 3, 4, 5},  // A's batch folds into M
      {"matrix_at_batch", {}, {2}, 3, 4, 5},
      {"batched", {2}, {2}, 3, 4, 2},
      {"broadcast", {2, 1}, {5}, 3, 4, 2},  // [2,1,3,4] @ [5,4,2] -> [2,5,3,2]
      {"broadcast_both", {1, 3}, {2, 1}, 2, 3, 4},
      {"unit_batch", {1}, {3}, 2, 5, 3},
      {"odd_sizes", {}, {}, 37, 65, 19},
  };
}

std::vector<MatmulCase> with_all_flags(const std::vector<MatmulCase>& cases) {
  std::vector<MatmulCase> out;
  for (const MatmulCase& c : cases)
    for (int flags = 0; flags < 4; ++flags) {
      MatmulCase x = c;
      x.ta = flags & 1;
      x.tb = flags & 2;
      x.name += "_" + flags_name(x.ta, x.tb);
      out.push_back(x);
    }
  return out;
}

std::string case_name(const testing::TestParamInfo<MatmulCase>& info) { return info.param.name; }

class MatmulValues : public testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulValues, MatchesNaiveLoopF32AndF64) {
  const MatmulCase& c = GetParam();
  for (sl::DType dtype : {sl::DType::f32, sl::DType::f64}) {
    Tensor a = sl::randn(c.a_shape(), sl::TensorOptions{dtype});
    Tensor b = sl::randn(c.b_shape(), sl::TensorOptions{dtype});
    Tensor out = sl::matmul(a, b, c.ta, c.tb);
    Shape want_shape;
    std::vector<double> want = naive_matmul(a, b, c.ta, c.tb, &want_shape);
    EXPECT_EQ(out.shape(), want_shape);
    EXPECT_EQ(out.dtype(), dtype);
    const double tol = dtype == sl::DType::f32 ? 1e-5 : 1e-12;
    expect_close(out.to_vector(), want, within(tol), "matmul against the naive loops");
  }
}

// bf16/f16 inputs, f32 accumulation: close to the f32 product of the same (rounded) inputs.
TEST_P(MatmulValues, HalfPrecisionMatchesF32) {
  const MatmulCase& c = GetParam();
  for (sl::DType dtype : {sl::DType::bf16, sl::DType::f16}) {
    Tensor a = sl::randn(c.a_shape(), sl::TensorOptions{dtype});
    Tensor b = sl::randn(c.b_shape(), sl::TensorOptions{dtype});
    Tensor out = sl::matmul(a, b, c.ta, c.tb);
    EXPECT_EQ(out.dtype(), dtype);
    std::vector<double> want = sl::matmul(a.to(sl::DType::f32), b.to(sl::DType::f32), c.ta, c.tb).to_vector();
    expect_close(out.to_vector(), want, within(1e-2), "16-bit matmul against f32");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulValues, testing::ValuesIn(with_all_flags(shape_cases())), case_name);

TEST(Matmul, HandComputed) {
  // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
  Tensor a = sl::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor b = sl::from_vector({5, 6, 7, 8}, {2, 2});
  EXPECT_EQ(sl::matmul(a, b).to_vector(), (std::vector<double>{19, 22, 43, 50}));
  EXPECT_EQ(sl::matmul(a, b, true, false).to_vector(), (std::vector<double>{26, 30, 38, 44}));
  EXPECT_EQ(sl::matmul(a, b, false, true).to_vector(), (std::vector<double>{17, 23, 39, 53}));
}

TEST(Matmul, EmptyDims) {
  Tensor zero_k = sl::matmul(sl::ones({2, 0}), sl::ones({0, 3}));  // an empty sum is 0
  EXPECT_EQ(zero_k.shape(), (Shape{2, 3}));
  EXPECT_EQ(zero_k.to_vector(), std::vector<double>(6, 0.0));
  EXPECT_EQ(sl::matmul(sl::ones({0, 4}), sl::ones({4, 3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(sl::matmul(sl::ones({0, 2, 4}), sl::ones({4, 3})).shape(), (Shape{0, 2, 3}));
  EXPECT_EQ(sl::matmul(sl::ones({2, 4}), sl::ones({3, 4, 0})).shape(), (Shape{3, 2, 0}));
}

// Intra-op threads: the threaded GEMM (OpenBLAS, or our row/column split of Eigen) gives the same
// values. Sizes are big enough to cross the split threshold, one wide and one tall.
TEST(Matmul, TwoThreadsMatchNaiveLoop) {
  EXPECT_EQ(sl::num_threads(), 1);
  sl::set_num_threads(2);
  EXPECT_EQ(sl::num_threads(), 2);
  for (MatmulCase c : with_all_flags({{"tall", {}, {}, 300, 256, 220}, {"wide", {}, {}, 64, 512, 520}})) {
    SCOPED_TRACE(c.name);
    Tensor a = sl::randn(c.a_shape());
    Tensor b = sl::randn(c.b_shape());
    Shape want_shape;
    std::vector<double> want = naive_matmul(a, b, c.ta, c.tb, &want_shape);
    expect_close(sl::matmul(a, b, c.ta, c.tb).to_vector(), want, within(1e-4), "matmul");
  }
  sl::set_num_threads(1);
  EXPECT_EQ(sl::num_threads(), 1);
  expect_error([] { sl::set_num_threads(0); }, "set_num_threads: threads must be at least 1 (got 0)");
}

// ---- errors ------------------------------------------------------------------------------------------

TEST(Matmul, ErrorMessages) {
  try {
    sl::matmul(sl::zeros({2, 3}), sl::zeros({4, 5}));
    ADD_FAILURE() << "no error";
  } catch (const sl::Error& e) {
    EXPECT_STREQ(e.what(), "matmul: shapes cannot be multiplied ([2, 3] and [4, 5])");
  }
  expect_error(
      [] {
        sl::matmul(sl::zeros({4, 3}), sl::zeros({4, 5}), false, false);
      },
      "matmul: shapes cannot be multiplied ([4, 3] and [4, 5])");
  expect_error(
      [] {
        sl::matmul(sl::zeros({3, 2}), sl::zeros({4, 5}), true, false);
      },
      "matmul: shapes cannot be multiplied ([3, 2] and [4, 5] with transpose_a)");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 3}), sl::zeros({4, 5}), false, true);
      },
      "matmul: shapes cannot be multiplied ([2, 3] and [4, 5] with transpose_b)");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 3}), sl::zeros({4, 5}), true, true);
      },
      "([2, 3] and [4, 5] with transpose_a and transpose_b)");
  expect_error(
      [] {
        sl::matmul(sl::zeros({3}), sl::zeros({3, 4}));
      },
      "matmul: both operands need at least 2 dims (got [3] and [3, 4])");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 3}), sl::zeros({3, 4}, sl::TensorOptions{sl::DType::f64}));
      },
      "matmul: dtypes differ (f32 for [2, 3] and f64 for [3, 4]): cast one with .to(dtype)");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 3}, sl::TensorOptions{sl::DType::i64}),
                   sl::zeros({3, 4}, sl::TensorOptions{sl::DType::i64}));
      },
      "matmul: expected floating tensors (f32, f64, bf16, f16) but got i64");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 3}), sl::zeros({3, 4}, sl::TensorOptions{}.with_device(sl::Device::cpu(1))));
      },
      "matmul: tensors are on different devices (cpu:0 and cpu:1)");
  expect_error(
      [] {
        sl::matmul(sl::zeros({2, 2, 3}), sl::zeros({3, 3, 4}));
      },
      "matmul: batch dims of [2, 2, 3] and [3, 3, 4] cannot be broadcast (2 vs 3)");
}

// ---- backward ------------------------------------------------------------------------------------------

// y.backward(G) against the formulas dA = G @ op(B)^T, dB = op(A)^T @ G (then transposed back to
// the stored layout and summed over broadcast batch dims), all by naive loops.
class MatmulBackward : public testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulBackward, MatchesFormulas) {
  const MatmulCase& c = GetParam();
  auto f64 = sl::TensorOptions{sl::DType::f64};
  Tensor a = sl::randn(c.a_shape(), f64.with_requires_grad());
  Tensor b = sl::randn(c.b_shape(), f64.with_requires_grad());
  Tensor y = sl::matmul(a, b, c.ta, c.tb);
  Tensor g = sl::randn(y.shape(), f64);
  y.backward(g);

  // Numerically: d/dA_i sum(G * C) is linear in A, so probe it with one-hot inputs through the naive loop.
  auto probe = [&](const Tensor& x, bool is_a) {
    std::vector<double> grad(x.numel());
    std::vector<double> gv = g.to_vector();
    for (int64_t i = 0; i < x.numel(); ++i) {
      Tensor one_hot = sl::zeros(x.shape(), f64);
      one_hot.data<double>()[i] = 1.0;
      Shape s;
      std::vector<double> out =
          is_a ? naive_matmul(one_hot, b.detach(), c.ta, c.tb, &s) : naive_matmul(a.detach(), one_hot, c.ta, c.tb, &s);
      for (size_t k = 0; k < out.size(); ++k) grad[i] += out[k] * gv[k];
    }
    return grad;
  };
  ASSERT_TRUE(a.grad().defined() && b.grad().defined());
  EXPECT_EQ(a.grad().shape(), a.shape());
  EXPECT_EQ(b.grad().shape(), b.shape());
  expect_close(a.grad().to_vector(), probe(a, true), within(1e-12), "matmul's gradient of a");
  expect_close(b.grad().to_vector(), probe(b, false), within(1e-12), "matmul's gradient of b");
}

std::vector<MatmulCase> gradient_cases() {
  return with_all_flags({
      {"matrix", {}, {}, 3, 4, 2},
      {"batch_at_matrix", {2, 2}, {}, 3, 2, 4},  // dB sums the batch (the weight gradient of Linear)
      {"matrix_at_batch", {}, {3}, 2, 3, 2},     // dA sums the batch
      {"batched", {2}, {2}, 2, 3, 4},
      {"broadcast", {2, 1}, {3}, 3, 4, 2},
      {"broadcast_both", {1, 2}, {2, 1}, 2, 2, 3},
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulBackward, testing::ValuesIn(gradient_cases()), case_name);

class MatmulGradcheck : public testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulGradcheck, Matmul) {
  const MatmulCase& c = GetParam();
  auto f64 = sl::TensorOptions{sl::DType::f64}.with_requires_grad();
  Tensor a = sl::randn(c.a_shape(), f64), b = sl::randn(c.b_shape(), f64);
  expect_gradcheck([&](const sl::TensorList& x) { return sl::matmul(x[0], x[1], c.ta, c.tb); }, {a, b},
                   c.a_shape().numel() + c.b_shape().numel());
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulGradcheck, testing::ValuesIn(gradient_cases()), case_name);

// The same square tensor on both sides: both gradient paths accumulate into x.
TEST(MatmulGradcheck, SameTensorTwice) {
  auto f64 = sl::TensorOptions{sl::DType::f64}.with_requires_grad();
  for (Shape shape : {Shape{3, 3}, Shape{2, 3, 3}})
    for (int flags = 0; flags < 4; ++flags) {
      bool ta = flags & 1, tb = flags & 2;
      SCOPED_TRACE(shape.str() + " " + flags_name(ta, tb));
      Tensor x = sl::randn(shape, f64);
      expect_gradcheck([&](const sl::TensorList& in) { return sl::matmul(in[0], in[0], ta, tb); }, {x}, shape.numel());
    }
}

}  // namespace
