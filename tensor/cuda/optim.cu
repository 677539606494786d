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

// Mixed precision: G the gradient's storage type, P the parameter's (bf16 or f16).
template <typename G, typename P>
__global__ void adamw_mixed_kernel(float* w, const G* g, float* m, float* v, P* param, int64_t n, nn::AdamWStep step) {
  SL_FOR_EACH_INDEX(i, n) {
    step.apply(w[i], static_cast<float>(g[i]), m[i], v[i]);
    param[i] = P(w[i]);
  }
}

template <typename P>
void launch_mixed(float* w, const void* g, DType grad_dtype, float* m, float* v, P* param, int64_t n,
                  const nn::AdamWStep& step) {
  switch (grad_dtype) {
    case DType::f32:
      return adamw_mixed_kernel<<<blocks_for(n), kThreads>>>(w, static_cast<const float*>(g), m, v, param, n, step);
    case DType::bf16:
      return adamw_mixed_kernel<<<blocks_for(n), kThreads>>>(w, static_cast<const bf16*>(g), m, v, param, n, step);
    case DType::f16:
      return adamw_mixed_kernel<<<blocks_for(n), kThreads>>>(w, static_cast<const f16*>(g), m, v, param, n, step);
    default:
      throw Error(detail::concat("cuda::adamw_update_mixed: a ", dtype_name(grad_dtype), " gradient"));
  }
}

}  // namespace

void adamw_update_mixed(float* w, const void* g, DType grad_dtype, float* m, float* v, void* param, DType param_dtype,
                        int64_t n, const nn::AdamWStep& step, int device) {
  if (n == 0) return;
  SL_CUDA_CHECK(cudaSetDevice(device));
  if (param_dtype == DType::bf16)
    launch_mixed(w, g, grad_dtype, m, v, static_cast<bf16*>(param), n, step);
  else if (param_dtype == DType::f16)
    launch_mixed(w, g, grad_dtype, m, v, static_cast<f16*>(param), n, step);
  else
    throw Error(detail::concat("cuda::adamw_update_mixed: a ", dtype_name(param_dtype), " parameter"));
  SL_CUDA_CHECK_LAUNCH();
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const nn::AdamWStep& step, int device) {
  if (n == 0) return;
  SL_CUDA_CHECK(cudaSetDevice(device));
  adamw_kernel<<<blocks_for(n), kThreads>>>(w, g, m, v, n, step);
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
