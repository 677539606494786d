// no_cuda.cpp — the CUDA backend's functions in a build without CUDA (CUDA=0, or no nvcc found).
//
// No tensor can be made on a GPU in such a build (Storage asks require_device first, which throws
// here), so the ops never reach the kernels; they still link, and anything that does call one
// gets the same clear error instead of a crash.
#ifndef SL_WITH_CUDA
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace sl::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::concat(what,
                             ": shardlab was built without CUDA (CUDA=0, or nvcc was not found); "
                             "rebuild with CUDA=1 on a machine with the CUDA toolkit"));
}
}  // namespace

int device_count() { return 0; }
void require_device(Device device, const char* what) {
  if (device.is_cuda()) no_cuda(detail::concat(what, " on ", device).c_str());
}
void* allocate(int64_t, int) { no_cuda("cuda::allocate"); }
void release(void*, int) { no_cuda("cuda::release"); }
int64_t cached_bytes(int) { return 0; }
void empty_cache(int) {}
void copy(void*, Device, const void*, Device, size_t) { no_cuda("cuda::copy"); }
void copy_rows(void*, int64_t, const void*, int64_t, int64_t, int64_t, int) { no_cuda("cuda::copy_rows"); }
void synchronize(int) { no_cuda("cuda::synchronize"); }

// clang-format off
void map(ElementwiseOp, double, const Tensor&, const Tensor&) { no_cuda("cuda::map"); }
void map_grad(ElementwiseOp, double, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::map_grad"); }
void binary(ElementwiseOp, double, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::binary"); }
void binary_scalar(ElementwiseOp, double, const Tensor&, double, const Tensor&) { no_cuda("cuda::binary_scalar"); }
void fill(const Tensor&, double) { no_cuda("cuda::fill"); }
void add_scaled(const Tensor&, const Tensor&, double) { no_cuda("cuda::add_scaled"); }
void scale(const Tensor&, double) { no_cuda("cuda::scale"); }
void convert(const Tensor&, const Tensor&) { no_cuda("cuda::convert"); }
void masked_fill(const Tensor&, const Tensor&, bool, double, const Tensor&) { no_cuda("cuda::masked_fill"); }
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::where"); }
void dropout(const Tensor&, uint64_t, uint64_t, uint64_t, double, const Tensor&, const Tensor&) { no_cuda("cuda::dropout"); }
void sum(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, bool) { no_cuda("cuda::sum"); }
void max(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) { no_cuda("cuda::max"); }
void broadcast_back(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, double) { no_cuda("cuda::broadcast_back"); }
void scatter_max_grad(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) { no_cuda("cuda::scatter_max_grad"); }
void reduce_to(const Tensor&, const Tensor&) { no_cuda("cuda::reduce_to"); }
void broadcast_to(const Tensor&, const Tensor&) { no_cuda("cuda::broadcast_to"); }
double sum_of_squares(const Tensor&) { no_cuda("cuda::sum_of_squares"); }
void softmax_forward(const Tensor&, const Tensor&, bool) { no_cuda("cuda::softmax_forward"); }
void softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool) { no_cuda("cuda::softmax_backward"); }
void causal_softmax_forward(const Tensor&, const Tensor&, double) { no_cuda("cuda::causal_softmax_forward"); }
void causal_softmax_backward(const Tensor&, const Tensor&, const Tensor&, double) { no_cuda("cuda::causal_softmax_backward"); }
void cross_entropy_forward(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) { no_cuda("cuda::cross_entropy_forward"); }
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, double, const Tensor&) { no_cuda("cuda::cross_entropy_backward"); }
void layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::layer_norm_forward"); }
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::layer_norm_backward"); }
void embedding_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::embedding_forward"); }
void embedding_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::embedding_backward"); }
void permute(const Tensor&, const std::vector<int>&, const Tensor&) { no_cuda("cuda::permute"); }
void gemm(DType, bool, bool, int64_t, int64_t, int64_t, const void*, int64_t, const void*, int64_t, void*, int64_t, bool, int, GemmBatch) { no_cuda("cuda::gemm"); }
void adamw_update(float*, const float*, float*, float*, int64_t, const nn::AdamWStep&, int) { no_cuda("cuda::adamw_update"); }
void adamw_update_mixed(float*, const void*, DType, float*, float*, void*, DType, int64_t, const nn::AdamWStep&, int) { no_cuda("cuda::adamw_update_mixed"); }
// clang-format on

}  // namespace sl::cuda
#endif
