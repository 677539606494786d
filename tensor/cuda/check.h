// check.h — every CUDA and cuBLAS call is checked; a failure throws sl::Error naming the call, the
// file, the line and CUDA's own words, e.g.
//
//   tensor/cuda/gemm.cu:88: cublasSgemm(...) failed: CUBLAS_STATUS_INVALID_VALUE (an unsupported value or parameter was
//   passed) tensor/cuda/runtime.cu:41: cudaMemcpy(...) failed: an illegal memory access was encountered
//   (cudaErrorIllegalAddress)
//
// Kernel launches are checked with SL_CUDA_CHECK_LAUNCH() right after the <<<...>>>: a bad launch
// configuration is reported there; a fault inside the kernel surfaces at the next synchronising call.
// Only code built with CUDA includes this header (the .cu files and the NCCL backend).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace sl::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
}  // namespace sl::cuda

#define SL_CUDA_CHECK(call)                                                                                       \
  do {                                                                                                            \
    cudaError_t sl_cuda_status_ = (call);                                                                         \
    if (sl_cuda_status_ != cudaSuccess) ::sl::cuda::throw_cuda_error(sl_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define SL_CUBLAS_CHECK(call)                                                       \
  do {                                                                              \
    cublasStatus_t sl_cublas_status_ = (call);                                      \
    if (sl_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                 \
      ::sl::cuda::throw_cublas_error(sl_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define SL_CUDA_CHECK_LAUNCH() SL_CUDA_CHECK(cudaGetLastError())

// The names llm.c and most CUDA code use.
#ifndef CUDA_CHECK
#define CUDA_CHECK(call) SL_CUDA_CHECK(call)
#endif
#ifndef CUBLAS_CHECK
#define CUBLAS_CHECK(call) SL_CUBLAS_CHECK(call)
#endif
