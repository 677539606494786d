// embedding.cu — table lookup and its scatter-add backward (tensor/ops/embedding.cpp's formulas).
//
//   forward    out[n, c] = weight[ids[n], c]          one thread per output element
//   backward   dweight[ids[n], c] += dout[n, c]       one block per distinct id, adding its rows
//
// Rows with the same id must add into the same row of dweight. Rather than atomics (whose order,
// and so whose rounding, changes from run to run), the host groups the rows by id (embedding.cpp
// has the ids on the host anyway, from checking them): each block owns one id's row of dweight and
// adds that id's rows of dout in ascending order, the CPU loop's order, so the bits are the CPU's.
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

// Block s: the rows order[starts[s] .. starts[s+1]) all have id segment_ids[s].
template <typename T>
__global__ void embedding_backward_kernel(const T* dout, const int64_t* order, const int64_t* segment_ids,
                                          const int64_t* starts, compute_t<T>* dweight, int64_t C_len) {
  const int64_t s = blockIdx.x, first = starts[s], last = starts[s + 1];
  compute_t<T>* dw_row = dweight + segment_ids[s] * C_len;
  for (int64_t c = threadIdx.x; c < C_len; c += blockDim.x) {
    compute_t<T> total = 0;
    for (int64_t k = first; k < last; ++k) total += static_cast<compute_t<T>>(dout[order[k] * C_len + c]);
    dw_row[c] = total;
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
      embedding_forward_kernel<T, Id><<<blocks_for(count * C_len), kThreads>>>(ptr<const T>(weight), ptr<const Id>(ids),
                                                                               ptr<T>(out), count, C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& dout, const Tensor& order, const Tensor& segment_ids,
                        const Tensor& segment_starts, const Tensor& dweight) {
  use_device_of(dout);
  const int64_t C_len = dweight.size(1);
  if (C_len == 0) return;
  dispatch_floating(dout.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    for_row_chunks(segment_ids.numel(), [&](int64_t first, unsigned segments) {
      embedding_backward_kernel<T><<<segments, kRowThreads>>>(
          ptr<const T>(dout), ptr<const int64_t>(order), ptr<const int64_t>(segment_ids) + first,
          ptr<const int64_t>(segment_starts) + first, ptr<compute_t<T>>(dweight), C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
