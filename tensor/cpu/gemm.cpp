// gemm.cpp — one matrix multiply on the CPU: C [M, N] (+)= op(A) @ op(B), row-major.
//
// OpenBLAS's sgemm/dgemm when SL_USE_OPENBLAS (make BLAS=openblas, the default), otherwise Eigen's
// kernel (make BLAS=eigen). Both read transposed operands in place through the flags. Both run
// single-threaded on fixed blocks of C, so the result is bitwise the same for every thread count.
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
#if !defined(__clang__)  // clang has no such warning (the sanitizer build compiles with it)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

namespace sl {

namespace {

// ---- intra-op threads -----------------------------------------------------------------------------
//
// Results must not depend on the thread count (`train --threads 1` and `--threads 4` save the same
// bytes). A multithreaded BLAS splits its work by the thread count, and a different split can add up
// an element's K products in another order (another kernel for a smaller piece, another K blocking).
// So BLAS always runs on one thread, and the parallelism is ours: a GEMM is cut into blocks of rows
// (or columns) of C whose bounds depend only on (M, N, K); every block is one single-threaded call;
// threads only decide who runs which block. Each element of C comes from the same call every time.

std::atomic<int> gemm_threads{1};
std::once_flag blas_single_threaded;

// OpenBLAS starts with one thread per core: set it to one, once, before the first GEMM.
void make_blas_single_threaded() {
  std::call_once(blas_single_threaded, [] {
#ifdef SL_USE_OPENBLAS
    openblas_set_num_threads(1);
#endif
    Eigen::setNbThreads(1);  // only matters in an OpenMP build
  });
}

// ---- one GEMM: C [M, N] (+)= op(A) @ op(B), row-major with leading dims ---------------------------

#ifdef SL_USE_OPENBLAS

void check_blas_size(int64_t value) {
  SL_CHECK(value <= INT_MAX, "matmul: a GEMM dimension of ", value, " is too large for BLAS (max ", INT_MAX, ")");
}

template <typename T>
void single_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
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
void single_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
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

#endif

// ---- the blocks: a function of the shape only -------------------------------------------------------

// One thread runs every block in turn, so a block must be big enough that cutting costs little: from
// 32 MFLOP and whole multiples of 128 rows (the BLAS kernels' unroll divides 128, so only the last
// block has a ragged edge), 16 at most. Measured at 1 thread (bench/gemm, min of 10): n = 256 as fast
// as one call, n = 512 (4 blocks) about 4% slower.
constexpr double kFlopsPerBlock = 32e6;
constexpr int64_t kBlockAlign = 128, kMaxBlocks = 16;

struct GemmBlocks {
  bool split_rows = true;  // rows of op(A) and C, else columns of op(B) and C
  int64_t extent = 0, size = 0, count = 1;
};

GemmBlocks gemm_blocks(int64_t M, int64_t N, int64_t K) {
  GemmBlocks blocks;
  blocks.split_rows = M >= N;
  blocks.extent = blocks.split_rows ? M : N;
  auto by_flops = static_cast<int64_t>(2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) /
                                       kFlopsPerBlock);
  int64_t wanted = std::clamp<int64_t>(std::min(by_flops, blocks.extent / kBlockAlign), 1, kMaxBlocks);
  int64_t per_block = (blocks.extent + wanted - 1) / wanted;
  blocks.size = (per_block + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  blocks.count = (blocks.extent + blocks.size - 1) / blocks.size;
  return blocks;
}

template <typename T>
void gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                 T* C, int64_t ldc, bool accumulate) {
  const GemmBlocks blocks = gemm_blocks(M, N, K);
  if (blocks.count == 1) {
    single_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  auto run_block = [&](int64_t index) {
    int64_t begin = index * blocks.size, end = std::min(blocks.extent, begin + blocks.size);
    if (blocks.split_rows)  // rows [begin, end) of op(A) and C
      single_gemm(ta, tb, end - begin, N, K, ta ? A + begin : A + begin * lda, lda, B, ldb, C + begin * ldc, ldc,
                  accumulate);
    else  // columns [begin, end) of op(B) and C
      single_gemm(ta, tb, M, end - begin, K, A, lda, tb ? B + begin * ldb : B + begin, ldb, C + begin, ldc, accumulate);
  };
  // Threads take the next block until none is left; with one thread this is a plain loop.
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t index = next++; index < blocks.count; index = next++) run_block(index);
  };
  const int64_t helpers = std::min<int64_t>(gemm_threads.load(), blocks.count) - 1;
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < helpers; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& thread : threads) thread.join();
}

}  // namespace

namespace cpu {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate) {
  make_blas_single_threaded();
  gemm_kernel(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                          int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           double*, int64_t, bool);

}  // namespace cpu

void set_num_threads(int threads) {
  SL_CHECK(threads >= 1, "set_num_threads: threads must be at least 1 (got ", threads, ")");
  make_blas_single_threaded();
  gemm_threads.store(threads);  // our threads over fixed blocks; BLAS itself stays single-threaded
}

int num_threads() { return gemm_threads.load(); }

}  // namespace sl
