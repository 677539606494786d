// embedding.cu — table lookup and its scatter-add backward (tensor/ops/embedding.cpp's formulas).
//
//   forward    out[n, c] = weight[ids[n], c]          one thread per output element
//   backward   dweight[ids[n], c] += dout[n, c]       one thread per column c, adding rows n = 0, 1, ...
//
// The backward gives each thread a column of its own, so no two threads ever add into the same
// element: no atomics, and the sums are made in the CPU's order (the same bits on every run). It
// has only C threads; that is plenty for an embedding's share of a training step.
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename T, typename Id>
__global__ void embedding_forward_kernel(const T* weight, const Id* ids, T* out, int64_t count, int64_t C_len) {
  SL_FOR_EACH_INDEX(k, count * C_len) {
    const int64_t n = k / C_len, c = k % C_len;
    out[k] = weight[static_cast<int64_t>(ids[n]) * C_len + c];
  }
}

template <typename T, typename Id>
__global__ void embedding_backward_kernel(const T* dout, const Id* ids, compute_t<T>* dweight, int64_t count,
                                          int64_t C_len) {
  SL_FOR_EACH_INDEX(c, C_len) {
    for (int64_t n = 0; n < count; ++n)
      dweight[static_cast<int64_t>(ids[n]) * C_len + c] += static_cast<compute_t<T>>(dout[n * C_len + c]);
  }
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  use_device_of(weight);
  const int64_t C_len = weight.size(1), count = ids.numel();
  if (count * C_len == 0) return;
  dispatch_floating(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
      using Id = decltype(id_tag);
      embedding_forward_kernel<T, Id><<<blocks_for(count * C_len), kThreads>>>(ptr<const T>(weight),
                                                                                ptr<const Id>(ids), ptr<T>(out),
                                                                                count, C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  use_device_of(dout);
  const int64_t C_len = dweight.size(1), count = ids.numel();
  if (count * C_len == 0) return;
  dispatch_floating(dout.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
      using Id = decltype(id_tag);
      embedding_backward_kernel<T, Id><<<blocks_for(C_len), kThreads>>>(
          ptr<const T>(dout), ptr<const Id>(ids), ptr<compute_t<T>>(dweight), count, C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
