// cast.cpp — changing dtype, device, or just the storage: cast, to_device, clone.
#include <cstring>
#include <type_traits>

#include "autograd/function.h"
#include "tensor/cpu/convert.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace sl {

namespace {

Tensor convert(const Tensor& x, DType dtype) {
  Tensor out = Tensor::empty(x.shape(), x.options().with_dtype(dtype));
  if (x.device().is_cuda()) {
    cuda::convert(x, out);
    return out;
  }
  dispatch_all(x.dtype(), [&](auto source_tag) {
    using S = decltype(source_tag);
    dispatch_all(dtype, [&](auto target_tag) {
      using D = decltype(target_tag);
      const S* in = static_cast<const S*>(x.raw_data());
      D* o = out.data<D>();
      const int64_t n = x.numel();
      constexpr bool widens = std::is_same_v<D, float> && (std::is_same_v<S, bf16> || std::is_same_v<S, f16>);
      constexpr bool narrows = std::is_same_v<S, float> && (std::is_same_v<D, bf16> || std::is_same_v<D, f16>);
      if constexpr (widens)  // the vectorised loops, bitwise the scalar rule's results
        cpu::widen(in, o, n);
      else if constexpr (narrows)
        cpu::narrow(in, o, n);
      else
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<D>(static_cast<compute_t<S>>(in[i]));
    });
  });
  return out;
}

// Forward: round to the new dtype. Backward: the gradient goes back to the input's dtype.
struct CastFn : Function<CastFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, DType dtype) {
    ctx.set("dtype", x.dtype());
    return convert(x, dtype);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {convert(grads[0], ctx.get<DType>("dtype"))};
  }
};

Tensor copy_to(const Tensor& x, Device device) {
  Tensor out = Tensor::empty(x.shape(), x.options().with_device(device));
  if (device.is_cuda() || x.device().is_cuda())  // host <-> GPU, GPU <-> GPU (tensor/cuda/runtime.cu)
    cuda::copy(out.data_ptr(), device, x.data_ptr(), x.device(), static_cast<size_t>(x.nbytes()));
  else
    std::memcpy(out.raw_data(), x.raw_data(), static_cast<size_t>(x.nbytes()));
  if (x.device() != device) MemoryLedger::instance().record_transfer(x.device(), device, x.nbytes());
  return out;
}

// Forward: copy to `device`. Backward: the gradient is copied back.
struct ToDeviceFn : Function<ToDeviceFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, Device device) {
    ctx.set("device", x.device());
    return copy_to(x, device);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {copy_to(grads[0], ctx.get<Device>("device"))};
  }
};

struct CloneFn : Function<CloneFn> {
  static Tensor forward(FunctionCtx&, const Tensor& x) { return copy_to(x, x.device()); }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {grads[0]}; }
};

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  if (x.requires_grad())
    SL_CHECK(is_floating(dtype), "cast: a tensor that requires grad cannot be cast to ", dtype_name(dtype),
             " (integers carry no gradient; detach() first)");
  return CastFn::apply(x, dtype);
}

Tensor to_device(const Tensor& x, Device device) { return ToDeviceFn::apply(x, device); }

Tensor Tensor::clone() const { return CloneFn::apply(*this); }

}  // namespace sl
