// cuda_info.cu — asks the CUDA runtime which GPUs there are.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "tensor/cuda_info.h"

namespace sl {

CudaInfo cuda_info() {
  CudaInfo info;
  info.built = true;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return info;
  }
  info.device_count = count;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1 << 30));
    info.names.push_back(std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                         ", " + memory + ")");
  }
  return info;
}

}  // namespace sl
