// optim.cu — AdamW's fused update on the GPU: one thread per element, each running
// nn::AdamWStep::apply (tensor/adamw_math.h), the very function the CPU loop runs.
#include "tensor/adamw_math.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t n, nn::AdamWStep step) {
  SL_FOR_EACH_INDEX(i, n) { step.apply(w[i], g[i], m[i], v[i]); }
}

}  // namespace

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const nn::AdamWStep& step, int device) {
  if (n == 0) return;
  SL_CUDA_CHECK(cudaSetDevice(device));
  adamw_kernel<<<blocks_for(n), kThreads>>>(w, g, m, v, n, step);
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
