// elementwise.cu — the elementwise kernels of one input: unary maps and their gradients, fills,
// in-place updates, casts and dropout (tensor/cuda/kernels.h); binary.cu has those of several inputs.
//
// One thread per output element. The math is tensor/functors.h, the very structs the CPU loops
// call: an ElementwiseOp picks one (with_functor below), and a kernel is instantiated per functor
// and dtype. bf16/f16 elements are read into float, computed, and rounded back (compute_t), as on
// the CPU.
#include "tensor/cuda/elementwise.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/philox.h"

namespace sl::cuda {

namespace {

// ---- from an ElementwiseOp back to its functor ----------------------------------------------------------

// Forward maps y = f(x) (unary.cpp's ops) and derivatives dy/dx = f'(saved) (their backwards) apart,
// so each kernel is instantiated only for the functors it runs.
// clang-format off
template <typename Visit>
void with_map_functor(ElementwiseOp op, double p, Visit&& visit) {
  switch (op) {
    case ElementwiseOp::neg: return visit(Neg{});
    case ElementwiseOp::exp: return visit(Exp{});
    case ElementwiseOp::log: return visit(Log{});
    case ElementwiseOp::sqrt: return visit(Sqrt{});
    case ElementwiseOp::rsqrt: return visit(Rsqrt{});
    case ElementwiseOp::tanh: return visit(Tanh{});
    case ElementwiseOp::sigmoid: return visit(Sigmoid{});
    case ElementwiseOp::relu: return visit(Relu{});
    case ElementwiseOp::gelu: return visit(GeluForward{});
    case ElementwiseOp::pow: return visit(Pow{p});
    default: break;
  }
  throw InternalError("cuda::map: not a unary forward op");
}
// clang-format on

// clang-format off
template <typename Visit>
void with_derivative_functor(ElementwiseOp op, double p, Visit&& visit) {
  switch (op) {
    case ElementwiseOp::exp_backward: return visit(ExpBackward{});
    case ElementwiseOp::log_backward: return visit(LogBackward{});
    case ElementwiseOp::sqrt_backward: return visit(SqrtBackward{});
    case ElementwiseOp::rsqrt_backward: return visit(RsqrtBackward{});
    case ElementwiseOp::tanh_backward: return visit(TanhBackward{});
    case ElementwiseOp::sigmoid_backward: return visit(SigmoidBackward{});
    case ElementwiseOp::relu_backward: return visit(ReluBackward{});
    case ElementwiseOp::gelu_backward: return visit(GeluBackward{});
    case ElementwiseOp::pow_backward: return visit(PowBackward{p});
    default: break;
  }
  throw InternalError("cuda::map_grad: not a derivative op");
}
// clang-format on

template <typename T, typename F>
__global__ void map_kernel(const T* x, T* y, int64_t n, F f) {
  SL_FOR_EACH_INDEX(i, n) { y[i] = static_cast<T>(f(load(x, i))); }
}

template <typename T, typename F>
__global__ void map_grad_kernel(const T* dy, const T* saved, T* dx, int64_t n, F derivative) {
  SL_FOR_EACH_INDEX(i, n) { dx[i] = static_cast<T>(load(dy, i) * derivative(load(saved, i))); }
}

template <typename T>
__global__ void fill_kernel(T* t, T value, int64_t n) {
  SL_FOR_EACH_INDEX(i, n) { t[i] = value; }
}

template <typename T>
__global__ void add_scaled_kernel(T* y, const T* x, compute_t<T> alpha, int64_t n) {
  SL_FOR_EACH_INDEX(i, n) { y[i] = static_cast<T>(load(y, i) + alpha * load(x, i)); }
}

template <typename T>
__global__ void scale_kernel(T* y, compute_t<T> factor, int64_t n) {
  SL_FOR_EACH_INDEX(i, n) { y[i] = static_cast<T>(load(y, i) * factor); }
}

template <typename S, typename D>
__global__ void convert_kernel(const S* x, D* out, int64_t n) {
  SL_FOR_EACH_INDEX(i, n) { out[i] = static_cast<D>(static_cast<compute_t<S>>(x[i])); }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* out, T* mask, int64_t n, uint64_t first, uint64_t key, uint64_t threshold,
                               compute_t<T> scale) {
  using C = compute_t<T>;
  SL_FOR_EACH_INDEX(i, n) {
    const bool keep = static_cast<uint64_t>(philox4x32(first + static_cast<uint64_t>(i), key)[0]) >= threshold;
    mask[i] = static_cast<T>(keep ? C(1) : C(0));
    out[i] = static_cast<T>(keep ? load(x, i) * scale : C(0));
  }
}

}  // namespace

// ---- what the ops call ------------------------------------------------------------------------------------

void map(ElementwiseOp op, double param, const Tensor& x, const Tensor& y) {
  use_device_of(x);
  const int64_t n = x.numel();
  if (n == 0) return;
  with_map_functor(op, param, [&](auto f) {
    dispatch_for(f, x.dtype(), "map", [&](auto tag) {
      using T = decltype(tag);
      map_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(x), ptr<T>(y), n, f);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void map_grad(ElementwiseOp derivative, double param, const Tensor& dy, const Tensor& saved, const Tensor& dx) {
  use_device_of(saved);
  const int64_t n = saved.numel();
  if (n == 0) return;
  with_derivative_functor(derivative, param, [&](auto f) {
    dispatch_floating(saved.dtype(), "map_grad", [&](auto tag) {
      using T = decltype(tag);
      map_grad_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(dy), ptr<const T>(saved), ptr<T>(dx), n, f);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void fill(const Tensor& t, double value) {
  use_device_of(t);
  const int64_t n = t.numel();
  if (n == 0) return;
  dispatch_all(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(t), static_cast<T>(static_cast<compute_t<T>>(value)), n);
  });
  SL_CUDA_CHECK_LAUNCH();
}

void add_scaled(const Tensor& y, const Tensor& x, double alpha) {
  use_device_of(y);
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating(y.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    add_scaled_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(y), ptr<const T>(x), static_cast<compute_t<T>>(alpha), n);
  });
  SL_CUDA_CHECK_LAUNCH();
}

// Not binary_scalar's mul: that rounds the scalar through T, as x * s does on the CPU, while mul_
// (and so SGD's momentum, dropout's backward) scales by the factor in the compute type.
void scale(const Tensor& y, double factor) {
  use_device_of(y);
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating(y.dtype(), "mul_", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(y), static_cast<compute_t<T>>(factor), n);
  });
  SL_CUDA_CHECK_LAUNCH();
}

void convert(const Tensor& x, const Tensor& out) {
  use_device_of(x);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_all(x.dtype(), [&](auto source_tag) {
    using S = decltype(source_tag);
    dispatch_all(out.dtype(), [&](auto target_tag) {
      using D = decltype(target_tag);
      convert_kernel<<<blocks_for(n), kThreads>>>(ptr<const S>(x), ptr<D>(out), n);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void dropout(const Tensor& x, uint64_t first, uint64_t key, uint64_t threshold, double scale, const Tensor& out,
             const Tensor& mask) {
  use_device_of(x);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<<<blocks_for(n), kThreads>>>(ptr<const T>(x), ptr<T>(out), ptr<T>(mask), n, first, key, threshold,
                                                static_cast<compute_t<T>>(scale));
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
