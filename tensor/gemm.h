// gemm.h — one matrix multiply for whichever device the operands live on: matmul and linear call
// this, and it hands the work to OpenBLAS/Eigen (tensor/cpu/gemm.h) or cuBLAS (tensor/cuda/gemm.cu).
//
//   C [M, N] (+)= op(A) [M, K] @ op(B) [K, N]     row-major; lda, ldb, ldc are the stored row lengths
//
// `batch` runs `count` such products with A, B and C advanced by fixed element strides (a stride of
// 0 reuses one operand for every entry): one cuBLAS call on a GPU, a loop on the CPU.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/cpu/gemm.h"
#include "tensor/cuda/kernels.h"
#include "tensor/device.h"

namespace sl {

template <typename T>
void gemm(Device device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T* C, int64_t ldc, bool accumulate, cuda::GemmBatch batch = {}) {
  if (M == 0 || N == 0 || batch.count == 0) return;
  if (device.is_cuda()) {
    cuda::gemm(dtype_of<T>::value, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate, device.index, batch);
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (K == 0) {  // an empty sum: C = 0, or C unchanged (BLAS rejects lda = 0, so no call)
      for (int64_t entry = 0; entry < batch.count && !accumulate; ++entry)
        for (int64_t m = 0; m < M; ++m) std::fill_n(C + entry * batch.stride_c + m * ldc, N, T(0));
      return;
    }
    for (int64_t entry = 0; entry < batch.count; ++entry)
      cpu::gemm(ta, tb, M, N, K, A + entry * batch.stride_a, lda, B + entry * batch.stride_b, ldb,
                C + entry * batch.stride_c, ldc, accumulate);
  } else {
    throw InternalError("gemm: the CPU multiplies f32 and f64 (bf16/f16 are widened first)");
  }
}

}  // namespace sl
