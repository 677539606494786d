// layout.cu — kernels that only move elements: permute (and so transpose) and broadcast_to. Each is
// a gather: one thread per output element, which finds its input element through a StridedIndex
// (indexing.h: permute_index, broadcast_index). Elements move as raw 2, 4 or 8 bytes, so one kernel
// per size serves every dtype. narrow, cat and split need no kernel: they are strided 2-D copies
// (cuda::copy_rows, runtime.cu).
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename Bits>
__global__ void gather_kernel(const Bits* x, Bits* out, int64_t n, StridedIndex<1> index) {
  SL_FOR_EACH_INDEX(k, n) {
    int64_t at[1];
    index.offsets(k, at);
    out[k] = x[at[0]];
  }
}

template <typename Bits>
void launch_gather(const Tensor& x, const Tensor& out, const StridedIndex<1>& index) {
  gather_kernel<Bits><<<blocks_for(out.numel()), kThreads>>>(static_cast<const Bits*>(x.data_ptr()),
                                                             static_cast<Bits*>(out.data_ptr()), out.numel(), index);
}

// out[k] = x[index(k)] for every element of out.
void gather(const Tensor& x, const StridedIndex<1>& index, const Tensor& out) {
  use_device_of(x);
  if (out.numel() == 0) return;
  // clang-format off
  switch (dtype_size(x.dtype())) {
    case 2: launch_gather<uint16_t>(x, out, index); break;
    case 4: launch_gather<uint32_t>(x, out, index); break;
    case 8: launch_gather<uint64_t>(x, out, index); break;
    default: throw InternalError("cuda::gather: unexpected element size");
  }
  // clang-format on
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void permute(const Tensor& x, const std::vector<int>& perm, const Tensor& out) {
  gather(x, permute_index(x.shape(), perm), out);
}

void broadcast_to(const Tensor& x, const Tensor& out) {
  gather(x, broadcast_index<1>(out.shape(), {x.shape()}, "broadcast_to"), out);
}

}  // namespace sl::cuda
