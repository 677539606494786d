// The CPU GEMM (tensor/cpu/gemm.cpp): bitwise the same result for every intra-op thread count, and
// every block of a split GEMM in its place (against a plain f64 triple loop).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/ops.h"

namespace sl {
namespace {

struct GemmCase {
  bool ta, tb, accumulate;
  int64_t M, N, K;
  int64_t pad;  // extra elements per row of A, B and C: leading dims larger than the rows
  std::string name;
};
void PrintTo(const GemmCase& c, std::ostream* out) { *out << c.name; }  // failures name the case

// Restores the process's thread count, whatever the test did.
class ThreadsRestorer {
 public:
  ThreadsRestorer() : saved_(num_threads()) {}
  ~ThreadsRestorer() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Deterministic values in [-1, 1) that are not exactly representable sums: any change of summation
// order shows in the last bits.
template <typename T>
std::vector<T> values(size_t count, uint32_t seed) {
  std::vector<T> out(count);
  uint32_t state = seed * 2654435761u + 1;
  for (T& v : out) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<T>((state >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0) * static_cast<T>(1.0 / 3.0);
  }
  return out;
}

template <typename T>
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<T> A, B, C;
};

template <typename T>
Operands<T> operands(const GemmCase& c) {
  Operands<T> op;
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  op.lda = a_cols + c.pad;
  op.ldb = b_cols + c.pad;
  op.ldc = c.N + c.pad;
  op.A = values<T>(static_cast<size_t>(a_rows * op.lda), 1);
  op.B = values<T>(static_cast<size_t>(b_rows * op.ldb), 2);
  op.C = values<T>(static_cast<size_t>(c.M * op.ldc), 3);  // accumulate adds to these; the padding must survive
  return op;
}

template <typename T>
std::vector<T> run_gemm(const GemmCase& c, int threads) {
  set_num_threads(threads);
  Operands<T> op = operands<T>(c);
  cpu::gemm<T>(c.ta, c.tb, c.M, c.N, c.K, op.A.data(), op.lda, op.B.data(), op.ldb, op.C.data(), op.ldc, c.accumulate);
  return op.C;
}

class GemmThreads : public testing::TestWithParam<GemmCase> {};

// 1, 2, 3 and 5 threads give the same bits (f32 and f64): the blocks depend on the shape only.
TEST_P(GemmThreads, SameBitsForEveryThreadCount) {
  ThreadsRestorer restore;
  const GemmCase& c = GetParam();
  std::vector<float> one_f = run_gemm<float>(c, 1);
  std::vector<double> one_d = run_gemm<double>(c, 1);
  for (int threads : {2, 3, 5}) {
    std::vector<float> many_f = run_gemm<float>(c, threads);
    std::vector<double> many_d = run_gemm<double>(c, threads);
    ASSERT_EQ(many_f.size(), one_f.size());
    EXPECT_EQ(std::memcmp(many_f.data(), one_f.data(), one_f.size() * sizeof(float)), 0) << threads << " threads, f32";
    EXPECT_EQ(std::memcmp(many_d.data(), one_d.data(), one_d.size() * sizeof(double)), 0) << threads << " threads, f64";
  }
}

// Every element of C against a triple loop in f64 (4 threads, so blocks run on several threads), and
// the padding between C's rows untouched: a block written at the wrong offset fails here.
TEST_P(GemmThreads, MatchesATripleLoop) {
  ThreadsRestorer restore;
  const GemmCase& c = GetParam();
  Operands<double> op = operands<double>(c);
  const std::vector<double> before = op.C;
  std::vector<double> got = run_gemm<double>(c, 4);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = c.accumulate ? before[i * op.ldc + j] : 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        double a = c.ta ? op.A[k * op.lda + i] : op.A[i * op.lda + k];
        double b = c.tb ? op.B[j * op.ldb + k] : op.B[k * op.ldb + j];
        sum += a * b;
      }
      ASSERT_NEAR(got[i * op.ldc + j], sum, 1e-12 * (1 + std::abs(sum))) << "C[" << i << ", " << j << "]";
    }
    for (int64_t j = c.N; j < op.ldc; ++j) ASSERT_EQ(got[i * op.ldc + j], before[i * op.ldc + j]) << "padding";
  }
}

// Shapes under the split threshold, split by rows (M >= N), split by columns, ragged last blocks,
// every transpose pair, accumulate, and leading dims larger than the rows.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmThreads,
    testing::Values(GemmCase{false, false, false, 7, 5, 3, 0, "tiny"},
                    GemmCase{false, true, false, 130, 70, 96, 1, "small_tb"},
                    GemmCase{false, false, false, 1000, 200, 300, 0, "rows_nn"},  // 3 blocks of 384 rows
                    GemmCase{true, false, true, 1000, 200, 300, 3, "rows_tn_acc"},
                    GemmCase{false, true, false, 777, 130, 400, 2, "rows_nt_ragged"},  // 512 + 265 rows
                    GemmCase{true, true, true, 100, 1200, 400, 1, "cols_tt_acc"},      // 3 blocks of columns
                    GemmCase{false, false, false, 64, 1300, 512, 0, "cols_nn"}),       // 768 + 532 columns
    [](const testing::TestParamInfo<GemmCase>& info) { return info.param.name; });

}  // namespace
}  // namespace sl
