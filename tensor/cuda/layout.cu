// layout.cu — permute (and so transpose) on the GPU: one thread per output element, which finds its
// input element through permute_index (indexing.h). Elements are moved as raw 2, 4 or 8 bytes, so
// one kernel per size serves every dtype. narrow, cat and split need no kernel: they are strided
// 2-D copies (cuda::copy_rows, runtime.cu).
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename Bits>
__global__ void permute_kernel(const Bits* x, Bits* out, int64_t n, StridedIndex<1> index) {
  SL_FOR_EACH_INDEX(k, n) {
    int64_t at[1];
    index.offsets(k, at);
    out[k] = x[at[0]];
  }
}

template <typename Bits>
void launch_permute(const Tensor& x, const Tensor& out, const StridedIndex<1>& index) {
  permute_kernel<Bits><<<blocks_for(out.numel()), kThreads>>>(static_cast<const Bits*>(x.data_ptr()),
                                                              static_cast<Bits*>(out.data_ptr()), out.numel(), index);
}

}  // namespace

void permute(const Tensor& x, const std::vector<int>& perm, const Tensor& out) {
  use_device_of(x);
  if (out.numel() == 0) return;
  const StridedIndex<1> index = permute_index(x.shape(), perm);
  // clang-format off
  switch (dtype_size(x.dtype())) {
    case 2: launch_permute<uint16_t>(x, out, index); break;
    case 4: launch_permute<uint32_t>(x, out, index); break;
    case 8: launch_permute<uint64_t>(x, out, index); break;
    default: throw InternalError("cuda::permute: unexpected element size");
  }
  // clang-format on
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
