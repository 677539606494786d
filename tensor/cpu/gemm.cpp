// gemm.cpp — one matrix multiply on the CPU: C [M, N] (+)= op(A) @ op(B), row-major.
//
// OpenBLAS's sgemm/dgemm when SL_USE_OPENBLAS (make BLAS=openblas, the default), otherwise Eigen's
// kernel (make BLAS=eigen). Both read transposed operands in place through the flags.
#include "tensor/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops.h"

#ifdef SL_USE_OPENBLAS
#include <cblas.h>
#endif
// GCC 12 reports Eigen's AVX-512 intrinsics (_mm512_undefined_*) as uninitialized: a known false
// positive inside the system headers, so it is silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>

namespace sl {

namespace {

// ---- intra-op threads ----------------------------------------------------------------------------

std::atomic<int> gemm_threads{1};
std::once_flag default_threads_applied;

void apply_threads(int threads) {
#ifdef SL_USE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);  // only takes effect in an OpenMP build; see eigen_gemm for ours
}

// OpenBLAS starts with one thread per core; shardlab's default is 1 (one rank, one core).
void apply_default_threads() {
  std::call_once(default_threads_applied, [] { apply_threads(gemm_threads.load()); });
}

// ---- one GEMM: C [M, N] (+)= op(A) @ op(B), row-major with leading dims ---------------------------

#ifdef SL_USE_OPENBLAS

void check_blas_size(int64_t value) {
  SL_CHECK(value <= INT_MAX, "matmul: a GEMM dimension of ", value, " is too large for BLAS (max ", INT_MAX, ")");
}

template <typename T>
void gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                 T* C, int64_t ldc, bool accumulate) {
  for (int64_t v : {M, N, K, lda, ldb, ldc}) check_blas_size(v);
  auto op_a = ta ? CblasTrans : CblasNoTrans;
  auto op_b = tb ? CblasTrans : CblasNoTrans;
  auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  auto la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb), lc = static_cast<blasint>(ldc);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, k, 1.0f, A, la, B, lb, accumulate ? 1.0f : 0.0f, C, lc);
  else
    cblas_dgemm(CblasRowMajor, op_a, op_b, m, n, k, 1.0, A, la, B, lb, accumulate ? 1.0 : 0.0, C, lc);
}

#else

template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<> >;
template <typename T>
using MatrixMap = Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<> >;

template <typename T>
void eigen_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                T* C, int64_t ldc, bool accumulate) {
  ConstMatrixMap<T> a(A, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  ConstMatrixMap<T> b(B, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(ldb));
  MatrixMap<T> c(C, M, N, Eigen::OuterStride<>(ldc));
  // Each transpose combination is its own expression type; Eigen's kernel reads them in place.
  auto run = [&](const auto& x, const auto& y) {
    if (accumulate)
      c.noalias() += x * y;
    else
      c.noalias() = x * y;
  };
  if (ta && tb)
    run(a.transpose(), b.transpose());
  else if (ta)
    run(a.transpose(), b);
  else if (tb)
    run(a, b.transpose());
  else
    run(a, b);
}

// Eigen parallelises only under OpenMP, which this build does not use: with more than one thread
// we split C into row (or column) blocks ourselves, one std::thread each, when the GEMM is big
// enough to pay for starting them (~30 us each).
template <typename T>
void gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                 T* C, int64_t ldc, bool accumulate) {
  int threads = gemm_threads.load();
  constexpr double kMinFlopsPerThread = 16e6;
  if (threads <= 1 || 2.0 * M * N * K < kMinFlopsPerThread * threads || std::max(M, N) < 2 * threads) {
    eigen_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  bool split_rows = M >= N;
  int64_t extent = split_rows ? M : N;
  auto block = [&](int part) {
    int64_t begin = extent * part / threads, end = extent * (part + 1) / threads;
    if (split_rows)  // rows [begin, end) of op(A) and C
      eigen_gemm(ta, tb, end - begin, N, K, ta ? A + begin : A + begin * lda, lda, B, ldb, C + begin * ldc, ldc,
                 accumulate);
    else  // columns [begin, end) of op(B) and C
      eigen_gemm(ta, tb, M, end - begin, K, A, lda, tb ? B + begin * ldb : B + begin, ldb, C + begin, ldc, accumulate);
  };
  std::vector<std::thread> workers;
  for (int part = 1; part < threads; ++part) workers.emplace_back(block, part);
  block(0);
  for (std::thread& worker : workers) worker.join();
}

#endif

}  // namespace

namespace cpu {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate) {
  apply_default_threads();
  gemm_kernel(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                          int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           double*, int64_t, bool);

}  // namespace cpu

void set_num_threads(int threads) {
  SL_CHECK(threads >= 1, "set_num_threads: threads must be at least 1 (got ", threads, ")");
  apply_default_threads();
  gemm_threads.store(threads);
  apply_threads(threads);
}

int num_threads() { return gemm_threads.load(); }

}  // namespace sl
