// cuda_info.cpp — the answer of a build without the CUDA backend (tensor/cuda/cuda_info.cu otherwise).
#include "tensor/cuda_info.h"

#ifndef SL_WITH_CUDA
namespace sl {
CudaInfo cuda_info() {
  CudaInfo info;
  info.error = "shardlab was built without CUDA (CUDA=0, or nvcc was not found)";
  return info;
}
}  // namespace sl
#endif
