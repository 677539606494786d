// gemm.cu — matrix multiply on the GPU through cuBLAS, with the CPU's row-major interface.
//
// cuBLAS is column-major (Fortran's layout). A row-major C [M, N] with row length ldc is, read in
// column-major, the matrix C^T [N, M] with leading dimension ldc, and the same holds for A and B. So
//
//     C = op(A) op(B)   (row-major)   <=>   C^T = op(B)^T op(A)^T   (column-major)
//
// and the call is cuBLAS's GEMM with the operands swapped (B first), m = N, n = M, and each
// operand's transpose flag as given: no data is ever transposed. A batch of matrices at fixed
// strides is one cublasGemmStridedBatchedEx (stride 0 repeats an operand, a broadcast batch dim).
//
// Types: f32 and f64 compute in their own precision (CUBLAS_COMPUTE_32F is plain FP32: cuBLAS uses
// TF32 tensor cores only when asked, which would miss the CPU by ~1e-3); bf16 and f16 are read and
// written in 16 bits with f32 accumulation, the same contract as the CPU path.
#include <mutex>
#include <unordered_map>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

// One cuBLAS handle per thread and device: a handle belongs to the device current when it was made,
// and must not be used by two threads at once (rank threads each have their own).
cublasHandle_t handle_for(int device) {
  struct Handles {
    std::unordered_map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& [device, handle] : by_device) cublasDestroy(handle);  // at thread exit; errors ignored
    }
  };
  thread_local Handles handles;
  auto found = handles.by_device.find(device);
  if (found != handles.by_device.end()) return found->second;
  cublasHandle_t handle = nullptr;
  SL_CUBLAS_CHECK(cublasCreate(&handle));
  SL_CUBLAS_CHECK(cublasSetStream(handle, cudaStreamLegacy));  // the device's one stream (runtime.h)
  handles.by_device[device] = handle;
  return handle;
}

struct CublasTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
};

// clang-format off
CublasTypes cublas_types(DType dtype) {
  switch (dtype) {
    case DType::f32: return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    default: break;
  }
  throw Error(detail::concat("matmul: cuBLAS multiplies f32, f64, bf16 and f16, not ", dtype_name(dtype)));
}
// clang-format on

}  // namespace

void gemm(DType dtype, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
          const void* B, int64_t ldb, void* C, int64_t ldc, bool accumulate, int device, GemmBatch batch) {
  if (M == 0 || N == 0 || batch.count == 0) return;
  SL_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
               ldc <= INT32_MAX && batch.count <= INT32_MAX,
           "matmul: cuBLAS takes sizes below 2^31 (got M ", M, ", N ", N, ", K ", K, ", batch ", batch.count, ")");
  SL_CUDA_CHECK(cudaSetDevice(device));
  if (K == 0) {  // an empty sum: C = 0, or C unchanged (cuBLAS rejects a leading dimension of 0)
    const size_t element = dtype_size(dtype);
    for (int64_t entry = 0; entry < batch.count && !accumulate; ++entry)
      SL_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(C) + entry * batch.stride_c * element, ldc * element, 0,
                                      N * element, M, cudaStreamLegacy));
    return;
  }
  const CublasTypes types = cublas_types(dtype);
  // alpha and beta in the compute type: double for f64, float otherwise.
  const double alpha64 = 1.0, beta64 = accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = accumulate ? 1.0f : 0.0f;
  const void* alpha = dtype == DType::f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = dtype == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_for(device), op_b, op_a, static_cast<int>(N), static_cast<int>(M),
                                             static_cast<int>(K), alpha, B, types.data, static_cast<int>(ldb),
                                             batch.stride_b, A, types.data, static_cast<int>(lda), batch.stride_a, beta,
                                             C, types.data, static_cast<int>(ldc), batch.stride_c,
                                             static_cast<int>(batch.count), types.compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace sl::cuda
