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
// (a column-parallel Linear shards W's rows, a row-parallel one its columns).
//
// bf16/f16 on the CPU run the same f32 GEMMs on f32 copies of x, W and b (tensor/cpu/convert.h) and
// round each result once: y = round(x W^T + b), where matmul + add rounded twice. Only the 16-bit x
// and W are kept for backward.
#include <cstring>

#include "autograd/function.h"
#include "tensor/gemm.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// N: the rows of x [..., in], counted from its leading dims (in may be 0).
int64_t rows_of(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1).numel(); }

// y [N, out] = b in every row (when there is one), then y (+)= x @ W^T.
template <typename T>
void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, int64_t N, int64_t in,
                    int64_t out) {
  if (bias.defined()) {
    if (y.device().is_cuda()) {
      cuda::broadcast_to(bias, y);
    } else {
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(y.data<T>() + n * out, bias.data<T>(), static_cast<size_t>(out) * sizeof(T));
    }
  }
  gemm(x.device(), false, true, N, out, in, static_cast<const T*>(x.data_ptr()), in,
       static_cast<const T*>(weight.data_ptr()), in, static_cast<T*>(y.data_ptr()), out,
       /*accumulate=*/bias.defined());
}

// db [out] = the sum of dy's N rows, accumulated in double (N can be large).
template <typename T>
Tensor bias_grad(const Tensor& dy, int64_t N, int64_t out, const TensorOptions& options) {
  Tensor db = Tensor::empty({out}, options);
  if (dy.device().is_cuda()) {
    cuda::reduce_to(dy.reshape({N, out}), db);
    return db;
  }
  std::vector<double> sums(out, 0.0);
  const T* g = dy.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) sums[o] += g[n * out + o];
  for (int64_t o = 0; o < out; ++o) db.data<T>()[o] = static_cast<T>(sums[o]);
  return db;
}

struct LinearFn : Function<LinearFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const int64_t in = weight.size(1), out = weight.size(0), N = rows_of(x);
    ctx.save_for_backward({x, weight});
    Shape out_shape = x.shape();
    out_shape.back() = out;
    if (is_16bit(x.dtype())) {  // in f32, rounded once
      Tensor y = Tensor::empty(out_shape, x.options().with_dtype(DType::f32));
      linear_forward<float>(x.to(DType::f32), weight.to(DType::f32),
                            bias.defined() ? bias.to(DType::f32) : bias, y, N, in, out);
      return y.to(x.dtype());
    }
    Tensor y = Tensor::empty(out_shape, x.options());
    if (x.dtype() == DType::f32)
      linear_forward<float>(x, weight, bias, y, N, in, out);
    else
      linear_forward<double>(x, weight, bias, y, N, in, out);
    return y;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor &x = ctx.saved()[0], &weight = ctx.saved()[1];
    if (!is_16bit(x.dtype())) return backward_in(ctx, grads[0].to(x.dtype()), x, weight);
    TensorList g = backward_in(ctx, grads[0].to(DType::f32), x.to(DType::f32), weight.to(DType::f32));
    for (Tensor& t : g)
      if (t.defined()) t = t.to(x.dtype());  // each gradient rounded once
    return g;
  }

  // dx, dW, db from dy, x and W of one dtype (f32 or f64).
  static TensorList backward_in(FunctionCtx& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight) {
    const int64_t in = weight.size(1), out = weight.size(0), N = rows_of(x);
    Tensor dx, dw, db;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      auto at = [](const Tensor& t) { return static_cast<T*>(t.data_ptr()); };
      if (ctx.needs_input_grad(0)) {  // dx [N, in] = dy [N, out] @ W [out, in]
        dx = Tensor::empty(x.shape(), x.options());
        gemm(x.device(), false, false, N, in, out, at(dy), out, at(weight), in, at(dx), in, false);
      }
      if (ctx.needs_input_grad(1)) {  // dW [out, in] = dy^T [out, N] @ x [N, in]
        dw = Tensor::empty(weight.shape(), weight.options());
        gemm(x.device(), true, false, out, in, N, at(dy), out, at(x), in, at(dw), in, false);
      }
      if (ctx.needs_input_grad(2)) db = bias_grad<T>(dy, N, out, weight.options());
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
  // The fused kernel covers f32, f64, and 16-bit types on the CPU (through f32); on a GPU those take
  // the composed path (cuBLAS reads 16 bits itself).
  const DType dtype = x.dtype();
  if (!(dtype == DType::f32 || dtype == DType::f64 || (is_16bit(dtype) && x.device().is_cpu()))) {
    Tensor y = matmul(x.reshape({-1, weight.size(1)}), weight, false, true);
    if (bias.defined()) y = add(y, bias);
    Shape out_shape = x.shape();
    out_shape.back() = weight.size(0);
    return y.reshape(out_shape);
  }
  return LinearFn::apply(x, weight, bias);
}

}  // namespace sl
