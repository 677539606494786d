// unary.cpp — elementwise unary ops: neg, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu, pow.
//
//   forward    y[i] = f(x[i])                    one loop over contiguous memory
//   backward   dx[i] = dy[i] * f'(saved[i])      one fused loop, no temporary for f'
//
// The math of f and f' lives in tensor/functors.h, shared with the CUDA kernels (tensor/cuda/
// elementwise.cu), which run instead of these loops for tensors on a GPU; this file only loops. Each op saves what its
// derivative needs: the output when f' is cheapest written in y (exp, sqrt, rsqrt, tanh, sigmoid, relu), otherwise the
// input (log, gelu, pow).
//
// Every op takes f32, f64, bf16, f16 (bf16/f16 compute in float); neg also negates i32/i64.
#include "autograd/function.h"
#include "tensor/cpu/convert.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// The loops stay out of line (noinline): inlined into the dispatch lambdas, GCC drops the __restrict
// promises and no longer vectorizes them.
template <typename T, typename Op>
[[gnu::noinline]] void map_loop(const T* __restrict x, T* __restrict y, int64_t n, Op op) {
  using C = compute_t<T>;
  for_each_index(n, [&](int64_t i) { y[i] = static_cast<T>(op(static_cast<C>(x[i]))); });
}

template <typename T, typename Derivative>
[[gnu::noinline]] void grad_loop(const T* __restrict dy, const T* __restrict saved, T* __restrict dx, int64_t n,
                                 Derivative derivative) {
  using C = compute_t<T>;
  for_each_index(
      n, [&](int64_t i) { dx[i] = static_cast<T>(static_cast<C>(dy[i]) * derivative(static_cast<C>(saved[i]))); });
}

// f16: the same loops on f32 chunks, so they vectorise (tensor/cpu/convert.h).
template <typename Op>
[[gnu::noinline]] void map_loop(const f16* x, f16* y, int64_t n, Op op) {
  cpu::in_f32_chunks(x, nullptr, y, n, [&](const float* x32, const float*, float* y32, int64_t count) {
    map_loop(x32, y32, count, op);
  });
}
template <typename Derivative>
[[gnu::noinline]] void grad_loop(const f16* dy, const f16* saved, f16* dx, int64_t n, Derivative derivative) {
  cpu::in_f32_chunks(dy, saved, dx, n, [&](const float* dy32, const float* saved32, float* dx32, int64_t count) {
    grad_loop(dy32, saved32, dx32, count, derivative);
  });
}

// y = op(x) elementwise, floating dtypes only.
template <typename Op>
Tensor map_unary(const Tensor& x, Op op, const char* name) {
  Tensor y = Tensor::empty(x.shape(), x.options());
  if (x.device().is_cuda()) {
    require_floating(x.dtype(), name);
    cuda::map(Op::kind, parameter_of(op), x, y);
    return y;
  }
  dispatch_floating(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    map_loop(x.data<T>(), y.data<T>(), x.numel(), op);
  });
  return y;
}

// dx = dy * derivative(saved), fused. saved is x or y (same shape as dy).
template <typename Derivative>
Tensor grad_times(const Tensor& dy, const Tensor& saved, Derivative derivative, const char* name) {
  SL_ASSERT(dy.shape() == saved.shape());
  Tensor grad = dy.to(saved.dtype());  // a gradient handed in by the user may be in another dtype
  Tensor dx = Tensor::empty(saved.shape(), saved.options());
  if (saved.device().is_cuda()) {
    cuda::map_grad(Derivative::kind, parameter_of(derivative), grad, saved, dx);
    return dx;
  }
  dispatch_floating(saved.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    grad_loop(grad.data<T>(), saved.data<T>(), dx.data<T>(), saved.numel(), derivative);
  });
  return dx;
}

// The two shapes of a unary Function: derivative from the output y, or from the input x.
template <typename Forward>
Tensor forward_saving_output(FunctionCtx& ctx, const Tensor& x, Forward f, const char* name) {
  Tensor y = map_unary(x, f, name);
  ctx.save_for_backward({y});  // stored detached, so y and its node do not keep each other alive
  return y;
}
template <typename Forward>
Tensor forward_saving_input(FunctionCtx& ctx, const Tensor& x, Forward f, const char* name) {
  ctx.save_for_backward({x});
  return map_unary(x, f, name);
}

// ---- the ops ---------------------------------------------------------------------------------------

// y = -x, dx = -dy. Needs nothing saved; integers are negated too (they carry no gradient).
struct NegFn : Function<NegFn> {
  static Tensor forward(FunctionCtx&, const Tensor& x) {
    Tensor y = Tensor::empty(x.shape(), x.options());
    if (x.device().is_cuda()) {
      cuda::map(ElementwiseOp::neg, 0.0, x, y);
      return y;
    }
    dispatch_all(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      map_loop(x.data<T>(), y.data<T>(), x.numel(), Neg{});
    });
    return y;
  }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {map_unary(grads[0], Neg{}, "neg")}; }
};

struct ExpFn : Function<ExpFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_output(ctx, x, Exp{}, "exp"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], ExpBackward{}, "exp")};
  }
};

struct LogFn : Function<LogFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_input(ctx, x, Log{}, "log"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], LogBackward{}, "log")};
  }
};

struct SqrtFn : Function<SqrtFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_output(ctx, x, Sqrt{}, "sqrt"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], SqrtBackward{}, "sqrt")};
  }
};

struct RsqrtFn : Function<RsqrtFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_output(ctx, x, Rsqrt{}, "rsqrt"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], RsqrtBackward{}, "rsqrt")};
  }
};

struct TanhFn : Function<TanhFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_output(ctx, x, Tanh{}, "tanh"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], TanhBackward{}, "tanh")};
  }
};

struct SigmoidFn : Function<SigmoidFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) {
    return forward_saving_output(ctx, x, Sigmoid{}, "sigmoid");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], SigmoidBackward{}, "sigmoid")};
  }
};

struct ReluFn : Function<ReluFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_saving_output(ctx, x, Relu{}, "relu"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], ReluBackward{}, "relu")};
  }
};

// GPT-2's MLP activation: x [B, T, 4C] -> [B, T, 4C]. Saves x: f' needs tanh(u(x)), not y.
struct GeluFn : Function<GeluFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) {
    return forward_saving_input(ctx, x, GeluForward{}, "gelu");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], GeluBackward{}, "gelu")};
  }
};

struct PowFn : Function<PowFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double exponent) {
    ctx.set("exponent", exponent);
    return forward_saving_input(ctx, x, Pow{exponent}, "pow");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {grad_times(grads[0], ctx.saved()[0], PowBackward{ctx.get<double>("exponent")}, "pow")};
  }
};

}  // namespace

Tensor neg(const Tensor& x) { return NegFn::apply(x); }
Tensor exp(const Tensor& x) { return ExpFn::apply(x); }
Tensor log(const Tensor& x) { return LogFn::apply(x); }
Tensor sqrt(const Tensor& x) { return SqrtFn::apply(x); }
Tensor rsqrt(const Tensor& x) { return RsqrtFn::apply(x); }
Tensor tanh(const Tensor& x) { return TanhFn::apply(x); }
Tensor sigmoid(const Tensor& x) { return SigmoidFn::apply(x); }
Tensor relu(const Tensor& x) { return ReluFn::apply(x); }
Tensor gelu(const Tensor& x) { return GeluFn::apply(x); }
Tensor pow(const Tensor& x, double exponent) { return PowFn::apply(x, exponent); }

}  // namespace sl
