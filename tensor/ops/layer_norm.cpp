// layer_norm.cpp — LayerNorm over the last dim (Ba et al., 2016), fused forward and backward.
//
//   x [..., C] is read as rows [N, C]; weight [C], bias [C]; per row:
//     mean = sum(x) / C      rstd = 1 / sqrt(sum((x - mean)^2) / C + eps)
//     norm = (x - mean) * rstd      y = norm * weight + bias
//
//   Forward saves x, weight and the per-row mean and rstd [N] (f32, or f64 for f64 inputs), so
//   backward recomputes norm instead of keeping a second [N, C] tensor alive.
//   Backward (as llm.c's layernorm_backward), with dnorm = dy * weight, per row:
//     dbias   += dy                 dweight += dy * norm
//     dx       = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
//   one pass for the two row means, one pass that writes dx and accumulates dweight and dbias.
//   On a GPU (tensor/cuda/layer_norm.cu): a block per row, and column sums in row chunks for dweight, dbias.
#include <cmath>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/lanes.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// The dtype mean and rstd are kept in: the compute type of T.
DType stats_dtype(DType x_dtype) { return x_dtype == DType::f64 ? DType::f64 : DType::f32; }

// x, y [N, C]; weight, bias [C]; mean, rstd [N].
template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, T* y, compute_t<T>* mean, compute_t<T>* rstd,
                        int64_t N, int64_t C, double eps) {
  using Compute = compute_t<T>;
  const Compute inv_C = Compute(1) / static_cast<Compute>(C);
  for (int64_t n = 0; n < N; ++n) {
    const T* x_row = x + n * C;
    T* y_row = y + n * C;
    const Compute m = lane_sum<Compute>(C, [&](int64_t i) { return static_cast<Compute>(x_row[i]); }) * inv_C;
    // Two passes (mean first, then the centred squares): E[x^2] - E[x]^2 cancels badly in float.
    auto centred_square = [&](int64_t i) {
      const Compute centred = static_cast<Compute>(x_row[i]) - m;
      return centred * centred;
    };
    const Compute variance = lane_sum<Compute>(C, centred_square) * inv_C;
    Compute s = Compute(1) / std::sqrt(variance + static_cast<Compute>(eps));
    for (int64_t i = 0; i < C; ++i) {
      Compute norm = (static_cast<Compute>(x_row[i]) - m) * s;
      y_row[i] = static_cast<T>(norm * static_cast<Compute>(weight[i]) + static_cast<Compute>(bias[i]));
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

// dy, x, dx [N, C]; weight [C]; mean, rstd [N]; dweight, dbias [C] accumulated in compute type.
// dx is skipped when null (x needs no gradient); dweight and dbias are always cheap to sum.
template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* weight, const compute_t<T>* mean, const compute_t<T>* rstd,
                         T* dx, compute_t<T>* dweight, compute_t<T>* dbias, int64_t N, int64_t C) {
  using Compute = compute_t<T>;
  const Compute inv_C = Compute(1) / static_cast<Compute>(C);
  for (int64_t n = 0; n < N; ++n) {
    const T* dy_row = dy + n * C;
    const T* x_row = x + n * C;
    const Compute m = mean[n], s = rstd[n];
    // The two row means the dx formula needs.
    // (Two vectorized sums read the row twice; it is in L1, and one scalar loop is slower.)
    auto dnorm = [&](int64_t i) { return static_cast<Compute>(weight[i]) * static_cast<Compute>(dy_row[i]); };
    const Compute dnorm_mean = lane_sum<Compute>(C, dnorm) * inv_C;
    const Compute dnorm_norm_mean =
        lane_sum<Compute>(C, [&](int64_t i) { return dnorm(i) * ((static_cast<Compute>(x_row[i]) - m) * s); }) * inv_C;
    // The fused pass: parameter gradients and dx together (the test on dx outside the loop, so
    // each loop is straight-line code that vectorizes).
    for_each_index(C, [&](int64_t i) {
      const Compute g = static_cast<Compute>(dy_row[i]);
      dbias[i] += g;
      dweight[i] += g * ((static_cast<Compute>(x_row[i]) - m) * s);
    });
    if (!dx) continue;
    T* dx_row = dx + n * C;
    for_each_index(C, [&](int64_t i) {
      const Compute norm = (static_cast<Compute>(x_row[i]) - m) * s;
      dx_row[i] = static_cast<T>((dnorm(i) - dnorm_mean - norm * dnorm_norm_mean) * s);
    });
  }
}

struct LayerNormFn : Function<LayerNormFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
    const int64_t C = x.size(-1);
    const int64_t N = x.numel() / C;
    Tensor y = Tensor::empty(x.shape(), x.options());
    TensorOptions stats_options = x.options().with_dtype(stats_dtype(x.dtype()));
    Tensor mean = Tensor::empty(Shape{N}, stats_options);
    Tensor rstd = Tensor::empty(Shape{N}, stats_options);
    if (x.device().is_cuda()) {
      require_floating(x.dtype(), "layer_norm");
      cuda::layer_norm_forward(x, weight, bias, eps, y, mean, rstd);
    } else {
      dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
        using T = decltype(tag);
        using Compute = compute_t<T>;
        layer_norm_forward(x.data<T>(), weight.data<T>(), bias.data<T>(), y.data<T>(), mean.data<Compute>(),
                           rstd.data<Compute>(), N, C, eps);
      });
    }
    ctx.save_for_backward({x, weight, mean, rstd});
    return y;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& x = ctx.saved()[0];
    const Tensor& weight = ctx.saved()[1];
    const Tensor& mean = ctx.saved()[2];
    const Tensor& rstd = ctx.saved()[3];
    const int64_t C = x.size(-1);
    const int64_t N = x.numel() / C;
    Tensor dy = grads[0].to(x.dtype());
    Tensor dx = ctx.needs_input_grad(0) ? Tensor::empty(x.shape(), x.options()) : Tensor();
    // dweight and dbias sum over all N rows: accumulate in compute type, round to weight's dtype once.
    TensorOptions stats_options = x.options().with_dtype(stats_dtype(x.dtype()));
    Tensor dweight = zeros(Shape{C}, stats_options);
    Tensor dbias = zeros(Shape{C}, stats_options);
    if (x.device().is_cuda()) {
      cuda::layer_norm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
    } else {
      dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
        using T = decltype(tag);
        using Compute = compute_t<T>;
        layer_norm_backward(dy.data<T>(), x.data<T>(), weight.data<T>(), mean.data<Compute>(), rstd.data<Compute>(),
                            dx.defined() ? dx.data<T>() : nullptr, dweight.data<Compute>(), dbias.data<Compute>(), N,
                            C);
      });
    }
    return {dx, ctx.needs_input_grad(1) ? dweight.to(weight.dtype()) : Tensor(),
            ctx.needs_input_grad(2) ? dbias.to(weight.dtype()) : Tensor()};
  }
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  SL_CHECK(x.dim() >= 1, "layer_norm: x must have at least one dim (the C to normalise over) but has shape ",
           x.shape());
  const int64_t C = x.size(-1);
  SL_CHECK(weight.shape() == Shape{C}, "layer_norm: weight has shape ", weight.shape(), " but x ", x.shape(),
           " needs [", C, "]");
  SL_CHECK(bias.shape() == Shape{C}, "layer_norm: bias has shape ", bias.shape(), " but x ", x.shape(), " needs [", C,
           "]");
  SL_CHECK(weight.dtype() == x.dtype() && bias.dtype() == x.dtype(),
           "layer_norm: x, weight and bias must share a dtype (got ", dtype_name(x.dtype()), ", ",
           dtype_name(weight.dtype()), ", ", dtype_name(bias.dtype()), ")");
  SL_CHECK(weight.device() == x.device() && bias.device() == x.device(),
           "layer_norm: x, weight and bias must be on "
           "one device (got ",
           x.device(), ", ", weight.device(), ", ", bias.device(), ")");
  SL_CHECK(C > 0, "layer_norm: cannot normalise over an empty last dim (x ", x.shape(), ")");
  SL_CHECK(eps >= 0, "layer_norm: eps must be >= 0 but got ", eps);
  return LayerNormFn::apply(x, weight, bias, eps);
}

}  // namespace sl
