// layer_norm.cu — LayerNorm over the last dim on the GPU, the formulas of tensor/ops/layer_norm.cpp:
//
//   forward    one block per row n:  mean, then rstd = 1 / sqrt(mean((x - mean)^2) + eps) (two passes,
//              as on the CPU: E[x^2] - E[x]^2 cancels badly in float), y = norm * weight + bias
//   backward   dx: one block per row, dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = dy w
//              dweight, dbias: one thread per column c, adding rows n = 0, 1, ... in order (the CPU's
//              order: no atomics, so the result is the same on every run)
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename T>
__device__ compute_t<T> at(const T* p, int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}

template <typename T>
__global__ void layer_norm_forward_kernel(const T* x, const T* weight, const T* bias, T* y, compute_t<T>* mean,
                                          compute_t<T>* rstd, int64_t C_len, compute_t<T> eps) {
  using C = compute_t<T>;
  const int64_t n = blockIdx.x;
  const T* x_row = x + n * C_len;
  T* y_row = y + n * C_len;
  C partial = 0;
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) partial += at(x_row, i);
  const C m = block_sum(partial) / static_cast<C>(C_len);
  partial = 0;
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) {
    const C centred = at(x_row, i) - m;
    partial += centred * centred;
  }
  const C s = C(1) / sqrt(block_sum(partial) / static_cast<C>(C_len) + eps);
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x)
    y_row[i] = static_cast<T>((at(x_row, i) - m) * s * at(weight, i) + at(bias, i));
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* weight, const compute_t<T>* mean,
                                     const compute_t<T>* rstd, T* dx, int64_t C_len) {
  using C = compute_t<T>;
  const int64_t n = blockIdx.x, row = n * C_len;
  const C m = mean[n], s = rstd[n];
  C dnorm_sum = 0, dnorm_norm_sum = 0;
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) {
    const C norm = (at(x, row + i) - m) * s, dnorm = at(weight, i) * at(dy, row + i);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const C dnorm_mean = block_sum(dnorm_sum) / static_cast<C>(C_len);
  const C dnorm_norm_mean = block_sum(dnorm_norm_sum) / static_cast<C>(C_len);
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) {
    const C norm = (at(x, row + i) - m) * s, dnorm = at(weight, i) * at(dy, row + i);
    dx[row + i] = static_cast<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

template <typename T>
__global__ void layer_norm_param_grad_kernel(const T* dy, const T* x, const compute_t<T>* mean,
                                             const compute_t<T>* rstd, compute_t<T>* dweight, compute_t<T>* dbias,
                                             int64_t N, int64_t C_len) {
  using C = compute_t<T>;
  SL_FOR_EACH_INDEX(c, C_len) {
    C weight_sum = 0, bias_sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const C g = at(dy, n * C_len + c);
      bias_sum += g;
      weight_sum += g * ((at(x, n * C_len + c) - mean[n]) * rstd[n]);
    }
    dweight[c] = weight_sum;
    dbias[c] = bias_sum;
  }
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  use_device_of(x);
  const int64_t C_len = x.size(-1), N = x.numel() / C_len;
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    for_row_chunks(N, [&](int64_t first, unsigned rows) {
      layer_norm_forward_kernel<T><<<rows, kRowThreads>>>(ptr<const T>(x) + first * C_len, ptr<const T>(weight),
                                                          ptr<const T>(bias), ptr<T>(y) + first * C_len,
                                                          ptr<C>(mean) + first, ptr<C>(rstd) + first, C_len,
                                                          static_cast<C>(eps));
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  use_device_of(x);
  const int64_t C_len = x.size(-1), N = x.numel() / C_len;
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if (dx.defined()) {
      for_row_chunks(N, [&](int64_t first, unsigned rows) {
        layer_norm_dx_kernel<T><<<rows, kRowThreads>>>(ptr<const T>(dy) + first * C_len,
                                                       ptr<const T>(x) + first * C_len, ptr<const T>(weight),
                                                       ptr<const C>(mean) + first, ptr<const C>(rstd) + first,
                                                       ptr<T>(dx) + first * C_len, C_len);
      });
    }
    layer_norm_param_grad_kernel<T><<<blocks_for(C_len), kThreads>>>(ptr<const T>(dy), ptr<const T>(x),
                                                                     ptr<const C>(mean), ptr<const C>(rstd),
                                                                     ptr<C>(dweight), ptr<C>(dbias), N, C_len);
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
