// The index math of the CUDA kernels (tensor/cuda/indexing.h), checked on the CPU: for every output
// element, the operand elements the GPU kernels would read must give what the CPU ops compute. This
// runs on every machine, GPU or not.
#include <gtest/gtest.h>

#include "tensor/cuda/indexing.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

struct BroadcastCase {
  Shape a, b;
};

class CudaIndexingBroadcast : public ::testing::TestWithParam<BroadcastCase> {};

// out[i] = a[at[0]] + 1000 b[at[1]] must equal the CPU's broadcasting add of a and 1000 b. The values
// are whole numbers (element indices), so every sum is exact and names the two elements it came from.
TEST_P(CudaIndexingBroadcast, ReadsTheElementsTheCpuBroadcastReads) {
  const auto& [a_shape, b_shape] = GetParam();
  const Tensor a = arange(0.0, static_cast<double>(a_shape.numel()), 1.0, DType::f64).reshape(a_shape);
  const Tensor b = arange(0.0, static_cast<double>(b_shape.numel()), 1.0, DType::f64).reshape(b_shape);
  const Tensor expected = add(a, mul(b, 1000.0));
  const auto index = cuda::broadcast_index<2>(expected.shape(), {a_shape, b_shape}, "test");
  const std::vector<double> av = a.to_vector(), bv = b.to_vector(), want = expected.to_vector();
  for (int64_t i = 0; i < expected.numel(); ++i) {
    int64_t at[2];
    index.offsets(i, at);
    ASSERT_EQ(av[at[0]] + 1000.0 * bv[at[1]], want[i]) << "output element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaIndexingBroadcast,
                         ::testing::Values(BroadcastCase{{2, 3, 4}, {4}}, BroadcastCase{{2, 3, 4}, {3, 1}},
                                           BroadcastCase{{2, 1, 4}, {3, 1}}, BroadcastCase{{5}, {}},
                                           BroadcastCase{{1, 6}, {6, 1}}, BroadcastCase{{2, 1, 3, 1, 2}, {4, 3, 1, 1}}),
                         [](const auto& info) {
                           return "a" + std::to_string(info.index) + "_rank" + std::to_string(info.param.a.dim()) +
                                  "_" + std::to_string(info.param.b.dim());
                         });

TEST(CudaIndexing, PermuteReadsTheElementsOfTheCpuPermute) {
  manual_seed(3);
  const Tensor x = randn({2, 3, 4, 5}, DType::f64);
  const std::vector<double> xv = x.to_vector();
  for (const std::vector<int>& perm : {std::vector<int>{0, 2, 1, 3}, {3, 1, 0, 2}, {0, 1, 3, 2}, {1, 0, 2, 3}}) {
    const std::vector<double> want = permute(x, perm).to_vector();
    const auto index = cuda::permute_index(x.shape(), perm);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t at[1];
      index.offsets(i, at);
      ASSERT_EQ(xv[at[0]], want[i]) << "element " << i << " of the permutation " << perm[0] << perm[1] << perm[2]
                                    << perm[3];
    }
  }
}

// out[o] = sum over r of x[kept(o) + summed(r)] must equal sum_to(x, out_shape).
TEST(CudaIndexing, ReduceToSumsTheElementsSumToSums) {
  manual_seed(5);
  const Tensor x = randn({2, 3, 4}, DType::f64);
  const std::vector<double> xv = x.to_vector();
  for (const Shape& out_shape : {Shape{3, 1}, Shape{4}, Shape{}, Shape{2, 1, 4}, Shape{2, 3, 4}, Shape{1, 3, 1}}) {
    const std::vector<double> want = sum_to(x, out_shape).to_vector();
    const auto index = cuda::reduce_to_index(x.shape(), out_shape);
    ASSERT_EQ(index.count * static_cast<int64_t>(want.size()), x.numel()) << out_shape;
    for (size_t o = 0; o < want.size(); ++o) {
      int64_t base[1], step[1];
      index.kept.offsets(static_cast<int64_t>(o), base);
      double total = 0;
      for (int64_t r = 0; r < index.count; ++r) {
        index.summed.offsets(r, step);
        total += xv[base[0] + step[0]];
      }
      EXPECT_NEAR(total, want[o], 1e-12) << "output element " << o << " of " << out_shape;
    }
  }
}

TEST(CudaIndexing, MoreThanEightDimsOfSizeAboveOneAreAClearError) {
  const Shape nine(9, 2);
  expect_error([&] { cuda::broadcast_index<1>(nine, {nine}, "add"); }, "add: the CUDA kernels index at most 8 dims");
  // Dims of size 1 cost nothing: twelve dims of which eight are larger than one fit.
  const Shape twelve{2, 1, 2, 1, 2, 1, 2, 2, 1, 2, 2, 2};
  EXPECT_EQ(cuda::broadcast_index<1>(twelve, {twelve}, "add").dims, 8);
}

}  // namespace
}  // namespace sl
