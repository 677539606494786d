// attention.cpp — causal_softmax: the scale, the causal mask and the softmax of attention in one op.
//
//   scores [..., T, T] (query t, key s)        y[t, s] = softmax over s <= t of scale * scores[t, s]
//                                              y[t, s] = 0 for s > t (the future is never seen)
//   backward   dx[t, s] = scale * y[t, s] * (g[t, s] - sum_{s' <= t} g[t, s'] y[t, s'])
//
// It computes exactly softmax(masked_fill(scores * scale, causal_mask(T), -inf)), which is how
// lesson code can spell it, but in one pass instead of three, touching only the lower triangle
// (half the work) and saving one tensor instead of three for backward. That difference is most of
// what separates an eager attention from llm.c's fused kernels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/lanes.h"
#include "tensor/cuda/kernels.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {

namespace {

template <typename T>
void causal_softmax_forward(const T* x, T* y, int64_t rows, int64_t T_len, double scale_d) {
  using C = compute_t<T>;
  const C scale = static_cast<C>(scale_d);
  std::vector<C> e(T_len);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T_len, visible = t + 1;  // row t sees keys 0..t
    const T* x_row = x + r * T_len;
    T* y_row = y + r * T_len;
    C m = lane_max<C>(visible, [&](int64_t s) { return scale * static_cast<C>(x_row[s]); });
    if (std::isinf(m)) m = 0;
    for_each_index(visible, [&](int64_t s) { e[s] = exp_of(scale * static_cast<C>(x_row[s]) - m); });
    const C total = lane_sum<C>(visible, [&](int64_t s) { return e[s]; });
    const C inv_total = C(1) / total;
    for_each_index(visible, [&](int64_t s) { y_row[s] = static_cast<T>(e[s] * inv_total); });
    for (int64_t s = visible; s < T_len; ++s) y_row[s] = static_cast<T>(C(0));
  }
}

template <typename T>
void causal_softmax_backward(const T* y, const T* g, T* dx, int64_t rows, int64_t T_len, double scale_d) {
  using C = compute_t<T>;
  const C scale = static_cast<C>(scale_d);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t visible = r % T_len + 1;
    const T* y_row = y + r * T_len;
    const T* g_row = g + r * T_len;
    T* dx_row = dx + r * T_len;
    const C dot = lane_sum<C>(visible, [&](int64_t s) { return static_cast<C>(g_row[s]) * static_cast<C>(y_row[s]); });
    for_each_index(visible, [&](int64_t s) {
      dx_row[s] = static_cast<T>(scale * static_cast<C>(y_row[s]) * (static_cast<C>(g_row[s]) - dot));
    });
    for (int64_t s = visible; s < T_len; ++s) dx_row[s] = static_cast<T>(C(0));
  }
}

struct CausalSoftmaxFn : Function<CausalSoftmaxFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& scores, double scale) {
    const int64_t T_len = scores.size(-1), rows = scores.numel() / std::max<int64_t>(T_len, 1);
    Tensor y = Tensor::empty(scores.shape(), scores.options());
    if (scores.device().is_cuda()) {
      require_floating(scores.dtype(), "causal_softmax");
      cuda::causal_softmax_forward(scores, y, scale);
    } else {
      dispatch_floating(scores.dtype(), "causal_softmax", [&](auto tag) {
        using T = decltype(tag);
        causal_softmax_forward(scores.data<T>(), y.data<T>(), rows, T_len, scale);
      });
    }
    ctx.save_for_backward({y});
    ctx.set("scale", scale);
    return y;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& y = ctx.saved()[0];
    Tensor g = grads[0].to(y.dtype());
    const int64_t T_len = y.size(-1), rows = y.numel() / std::max<int64_t>(T_len, 1);
    Tensor dx = Tensor::empty(y.shape(), y.options());
    if (y.device().is_cuda()) {
      cuda::causal_softmax_backward(y, g, dx, ctx.get<double>("scale"));
      return {dx};
    }
    dispatch_floating(y.dtype(), "causal_softmax", [&](auto tag) {
      using T = decltype(tag);
      causal_softmax_backward(y.data<T>(), g.data<T>(), dx.data<T>(), rows, T_len, ctx.get<double>("scale"));
    });
    return {dx};
  }
};

}  // namespace

Tensor causal_softmax(const Tensor& scores, double scale) {
  SL_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2),
           "causal_softmax: scores must be [..., T, T] "
           "(queries x keys), got shape ",
           scores.shape());
  SL_CHECK(std::isfinite(scale), "causal_softmax: scale must be finite (got ", scale, ")");
  return CausalSoftmaxFn::apply(scores, scale);
}

}  // namespace sl
