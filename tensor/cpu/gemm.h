// gemm.h — the CPU's one matrix multiply, shared by matmul and linear.
#pragma once
#include <cstdint>

namespace sl::cpu {

// C [M, N] = op(A) @ op(B), or C += op(A) @ op(B) with accumulate. Row-major; lda, ldb, ldc are the
// row strides of A, B and C as stored (op(A) = A^T when ta: A is stored [K, M]). float and double.
template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate);

}  // namespace sl::cpu
