// linear.cpp — the fully connected layer as one op: y = x W^T + b.
//
//   x [N, in] (any leading dims fold into N), W [out, in] (PyTorch's layout), b [out]
//   forward    y [N, out]  = b (broadcast into every row), then y += x @ W^T     one GEMM, beta = 1
//   backward   dx [N, in]  = dy @ W                                              one GEMM
//              dW [out, in] = dy^T @ x                                           one GEMM
//              db [out]    = sum of dy's rows
//
// matmul + add computes the same thing; folding the bias into the GEMM's output saves a pass over
// y forward and a reduction op backward, and this is the layer the parallel chapters split
// (ColumnParallelLinear shards W's rows, RowParallelLinear its columns).
#include <cstring>

#include "autograd/function.h"
#include "tensor/cpu/gemm.h"
#include "tensor/ops.h"

namespace sl {

namespace {

template <typename T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t in, int64_t out) {
  if (b)
    for (int64_t n = 0; n < N; ++n) std::memcpy(y + n * out, b, static_cast<size_t>(out) * sizeof(T));
  cpu::gemm(false, true, N, out, in, x, in, w, in, y, out, /*accumulate=*/b != nullptr);
}

template <typename T>
void bias_grad(const T* dy, T* db, int64_t N, int64_t out) {
  std::vector<double> sums(out, 0.0);  // accumulate in double: N can be large
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) sums[o] += dy[n * out + o];
  for (int64_t o = 0; o < out; ++o) db[o] = static_cast<T>(sums[o]);
}

struct LinearFn : Function<LinearFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const int64_t in = weight.size(1), out = weight.size(0), N = x.numel() / in;
    ctx.save_for_backward({x, weight});
    Shape out_shape = x.shape();
    out_shape.back() = out;
    Tensor y = Tensor::empty(out_shape, x.options());
    if (x.dtype() == DType::f32)
      linear_forward(x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                     y.data<float>(), N, in, out);
    else
      linear_forward(x.data<double>(), weight.data<double>(), bias.defined() ? bias.data<double>() : nullptr,
                     y.data<double>(), N, in, out);
    return y;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor &x = ctx.saved()[0], &weight = ctx.saved()[1];
    const Tensor dy = grads[0].to(x.dtype());
    const int64_t in = weight.size(1), out = weight.size(0), N = x.numel() / in;
    Tensor dx, dw, db;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      if (ctx.needs_input_grad(0)) {
        dx = Tensor::empty(x.shape(), x.options());
        cpu::gemm(false, false, N, in, out, dy.data<T>(), out, weight.data<T>(), in, dx.data<T>(), in, false);
      }
      if (ctx.needs_input_grad(1)) {
        dw = Tensor::empty(weight.shape(), weight.options());
        cpu::gemm(true, false, out, in, N, dy.data<T>(), out, x.data<T>(), in, dw.data<T>(), in, false);
      }
      if (ctx.needs_input_grad(2)) {
        db = Tensor::empty({out}, weight.options());
        bias_grad(dy.data<T>(), db.data<T>(), N, out);
      }
    };
    if (x.dtype() == DType::f32)
      run(float{});
    else
      run(double{});
    return {dx, dw, db};
  }
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  SL_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got shape ", weight.shape());
  SL_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input of shape ", x.shape(), " does not end in ",
           weight.size(1), " features (weight ", weight.shape(), ")");
  SL_CHECK(!bias.defined() || bias.shape() == Shape{weight.size(0)}, "linear: bias must be [", weight.size(0),
           "] for weight ", weight.shape(), ", got ", bias.shape());
  SL_CHECK(x.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == x.dtype()), "linear: dtypes differ (x ",
           dtype_name(x.dtype()), ", weight ", dtype_name(weight.dtype()), ")");
  SL_CHECK(x.device() == weight.device() && (!bias.defined() || bias.device() == x.device()),
           "linear: tensors on different devices (x on ", x.device(), ", weight on ", weight.device(), ")");
  // The fused kernel covers f32 and f64; half types take the composed path (which widens to f32).
  if (x.dtype() != DType::f32 && x.dtype() != DType::f64) {
    Tensor y = matmul(x.reshape({-1, weight.size(1)}), weight, false, true);
    if (bias.defined()) y = add(y, bias);
    Shape out_shape = x.shape();
    out_shape.back() = weight.size(0);
    return y.reshape(out_shape);
  }
  return LinearFn::apply(x, weight, bias);
}

}  // namespace sl
