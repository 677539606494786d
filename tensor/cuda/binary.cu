// binary.cu — the elementwise kernels of several inputs: broadcasting binary ops (and their scalar
// forms), masked_fill and where (tensor/cuda/kernels.h).
//
// One thread per output element; broadcast operands are found through StridedIndex (indexing.h),
// with a plain flat loop when all shapes are equal. The math is tensor/functors.h, as on the CPU.
#include "tensor/cuda/elementwise.cuh"
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

// clang-format off
template <typename Visit>
void with_binary_functor(ElementwiseOp op, double p, Visit&& visit) {
  switch (op) {
    case ElementwiseOp::add: return visit(Add{});
    case ElementwiseOp::sub: return visit(Sub{});
    case ElementwiseOp::mul: return visit(Mul{});
    case ElementwiseOp::div: return visit(Div{});
    case ElementwiseOp::maximum: return visit(Maximum{});
    case ElementwiseOp::neg_div_by_square: return visit(NegDivBySquare{});
    case ElementwiseOp::maximum_picks_a: return visit(MaximumPicksA{});
    case ElementwiseOp::mask_grad: return visit(MaskGrad{p != 0});
    case ElementwiseOp::maximum_scalar_grad: return visit(MaximumScalarGrad{p});
    default: break;
  }
  throw InternalError("cuda: not a binary elementwise op");
}
// clang-format on

template <typename T, typename F>
__global__ void binary_same_shape_kernel(const T* a, const T* b, T* out, int64_t n, F f) {
  SL_FOR_EACH_INDEX(i, n) { out[i] = static_cast<T>(f(load(a, i), load(b, i))); }
}

template <typename T, typename F>
__global__ void binary_broadcast_kernel(const T* a, const T* b, T* out, int64_t n, StridedIndex<2> index, F f) {
  SL_FOR_EACH_INDEX(i, n) {
    int64_t at[2];
    index.offsets(i, at);
    out[i] = static_cast<T>(f(load(a, at[0]), load(b, at[1])));
  }
}

template <typename T, typename F>
__global__ void binary_scalar_kernel(const T* x, compute_t<T> scalar, T* out, int64_t n, F f) {
  SL_FOR_EACH_INDEX(i, n) { out[i] = static_cast<T>(f(load(x, i), scalar)); }
}

template <typename M>
__device__ bool is_set(const M* mask, int64_t i) {
  return static_cast<compute_t<M>>(mask[i]) != compute_t<M>(0);
}

template <typename T, typename M>
__global__ void masked_fill_kernel(const T* x, const M* mask, T fill, T* out, int64_t n, StridedIndex<2> index) {
  SL_FOR_EACH_INDEX(i, n) {
    int64_t at[2];
    index.offsets(i, at);
    out[i] = is_set(mask, at[1]) ? fill : x[at[0]];
  }
}

template <typename T, typename M>
__global__ void where_kernel(const M* condition, const T* a, const T* b, T* out, int64_t n, StridedIndex<3> index) {
  SL_FOR_EACH_INDEX(i, n) {
    int64_t at[3];
    index.offsets(i, at);
    out[i] = is_set(condition, at[0]) ? a[at[1]] : b[at[2]];
  }
}

}  // namespace

void binary(ElementwiseOp op, double param, const Tensor& a, const Tensor& b, const Tensor& out) {
  use_device_of(out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool same_shape = a.shape() == out.shape() && b.shape() == out.shape();
  const StridedIndex<2> index =
      same_shape ? StridedIndex<2>{} : broadcast_index<2>(out.shape(), {a.shape(), b.shape()}, "binary");
  with_binary_functor(op, param, [&](auto f) {
    dispatch_for(f, out.dtype(), "binary", [&](auto tag) {
      using T = decltype(tag);
      if (same_shape)
        binary_same_shape_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(a), ptr<const T>(b), ptr<T>(out), n, f);
      else
        binary_broadcast_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(a), ptr<const T>(b), ptr<T>(out), n, index,
                                                             f);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void binary_scalar(ElementwiseOp op, double param, const Tensor& x, double scalar, const Tensor& out) {
  use_device_of(x);
  const int64_t n = x.numel();
  if (n == 0) return;
  with_binary_functor(op, param, [&](auto f) {
    dispatch_for(f, x.dtype(), "binary_scalar", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      // The scalar rounded through T, as the CPU path stores it in a one-element T buffer.
      const C s = static_cast<C>(static_cast<T>(static_cast<C>(scalar)));
      binary_scalar_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(x), s, ptr<T>(out), n, f);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void masked_fill(const Tensor& x, const Tensor& mask, bool has_value, double value, const Tensor& out) {
  use_device_of(x);
  const int64_t n = out.numel();
  if (n == 0) return;
  const StridedIndex<2> index = broadcast_index<2>(out.shape(), {x.shape(), mask.shape()}, "masked_fill");
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T fill_value = static_cast<T>(static_cast<compute_t<T>>(has_value ? value : 0.0));
    dispatch_all(mask.dtype(), [&](auto mask_tag) {
      using M = decltype(mask_tag);
      masked_fill_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(x), ptr<const M>(mask), fill_value, ptr<T>(out), n,
                                                      index);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void where(const Tensor& condition, const Tensor& a, const Tensor& b, const Tensor& out) {
  use_device_of(out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const StridedIndex<3> index = broadcast_index<3>(out.shape(), {condition.shape(), a.shape(), b.shape()}, "where");
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_all(condition.dtype(), [&](auto condition_tag) {
      using M = decltype(condition_tag);
      where_kernel<<<blocks_for(n), kThreads>>>(ptr<const M>(condition), ptr<const T>(a), ptr<const T>(b), ptr<T>(out),
                                                n, index);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
