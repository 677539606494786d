// cuda_info.h — is there a GPU? Whether this build has the CUDA backend, and what cudaGetDeviceCount says.
//
// The CUDA backend is built when `make` finds nvcc (CUDA=auto) or with CUDA=1; CUDA=0 leaves it out.
// A build with CUDA on a machine without a GPU works: it reports no device and the GPU tests skip.
#pragma once
#include <string>
#include <vector>

namespace sl {

struct CudaInfo {
  bool built = false;              // compiled with the CUDA backend
  int device_count = 0;            // GPUs found at run time
  std::string error;               // why none were found (the CUDA error string), if so
  std::vector<std::string> names;  // e.g. "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"
};

CudaInfo cuda_info();

}  // namespace sl
