// layer_norm.cu — LayerNorm over the last dim on the GPU, the formulas of tensor/ops/layer_norm.cpp:
//
//   forward    one block per row n:  mean, then rstd = 1 / sqrt(mean((x - mean)^2) + eps) (two passes,
//              as on the CPU: E[x^2] - E[x]^2 cancels badly in float), y = norm * weight + bias
//   backward   dx: one block per row, dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), dnorm = dy w
//              dweight, dbias: column sums over the rows, in row chunks (launch.cuh): no atomics, so
//              the result is the same on every run
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

// The two column sums of the parameter gradients (launch.cuh's column_sums, in row chunks):
//   dbias[c] = sum_n dy[n, c]        dweight[c] = sum_n dy[n, c] norm[n, c]
template <typename T, bool Weight>
struct ParamGradTerm {
  const T* dy;
  const T* x;
  const compute_t<T>* mean;
  const compute_t<T>* rstd;
  int64_t C_len;
  __device__ compute_t<T> operator()(int64_t n, int64_t c) const {
    const compute_t<T> g = at(dy, n * C_len + c);
    return Weight ? g * ((at(x, n * C_len + c) - mean[n]) * rstd[n]) : g;
  }
};
template <typename C>
struct StoreIn {
  C* out;
  __device__ void operator()(int64_t c, C total) const { out[c] = total; }
};

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  use_device_of(x);
  const int64_t C_len = x.size(-1), N = x.numel() / C_len;
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    for_row_chunks(N, [&](int64_t first, unsigned rows) {
      layer_norm_forward_kernel<T><<<rows, kRowThreads>>>(
          ptr<const T>(x) + first * C_len, ptr<const T>(weight), ptr<const T>(bias), ptr<T>(y) + first * C_len,
          ptr<C>(mean) + first, ptr<C>(rstd) + first, C_len, static_cast<C>(eps));
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
        layer_norm_dx_kernel<T><<<rows, kRowThreads>>>(
            ptr<const T>(dy) + first * C_len, ptr<const T>(x) + first * C_len, ptr<const T>(weight),
            ptr<const C>(mean) + first, ptr<const C>(rstd) + first, ptr<T>(dx) + first * C_len, C_len);
      });
    }
    column_sums<C>(
        x, N, C_len,
        ParamGradTerm<T, true>{ptr<const T>(dy), ptr<const T>(x), ptr<const C>(mean), ptr<const C>(rstd), C_len},
        StoreIn<C>{ptr<C>(dweight)});
    column_sums<C>(
        x, N, C_len,
        ParamGradTerm<T, false>{ptr<const T>(dy), ptr<const T>(x), ptr<const C>(mean), ptr<const C>(rstd), C_len},
        StoreIn<C>{ptr<C>(dbias)});
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
