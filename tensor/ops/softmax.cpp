// softmax.cpp — softmax and log_softmax over the last dim, forward and backward side by side.
//
//   x [..., C] is read as rows [N, C] (N = numel / C); every row is normalised on its own.
//
//   softmax       y_i = exp(x_i - m) / sum_j exp(x_j - m)          m = max_j x_j (so exp never overflows)
//                 dx_i = y_i (g_i - sum_j g_j y_j)
//   log_softmax   y_i = x_i - m - log sum_j exp(x_j - m)
//                 dx_i = g_i - exp(y_i) sum_j g_j
//
// Both backwards need only the output y, so forward saves y and not x. bf16/f16 rows are computed
// in float (compute_t<T>) and rounded once, at the end. On a GPU: tensor/cuda/softmax.cu, a block per row.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/lanes.h"
#include "tensor/cuda/kernels.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// The row length C (a 0-d tensor is one row of one element) and the number of rows N.
struct Rows {
  int64_t N = 0, C = 1;
  explicit Rows(const Shape& shape) {
    C = shape.empty() ? 1 : shape.back();
    N = C == 0 ? 0 : shape.numel() / C;
  }
};

template <typename Compute, typename T>
Compute row_max(const T* x, int64_t C) {
  return lane_max<Compute>(C, [&](int64_t i) { return static_cast<Compute>(x[i]); });
}

// A row of all -inf (fully masked) has max -inf; shifting by 0 instead keeps exp(-inf) = 0 and
// gives 0/0 = NaN like PyTorch, rather than (-inf) - (-inf) = NaN inside exp.
template <typename Compute>
Compute finite_shift(Compute m) {
  return std::isinf(m) ? Compute(0) : m;
}

template <typename T>
void softmax_forward(const T* x, T* y, Rows rows) {
  using Compute = compute_t<T>;
  const int64_t C = rows.C;
  // f32/f64 write exp(x - m) straight into y and rescale in place; bf16/f16 keep the unnormalised
  // row in a float buffer so it is rounded only once.
  std::vector<Compute> buffer(std::is_same_v<T, Compute> ? 0 : C);
  for (int64_t n = 0; n < rows.N; ++n) {
    const T* x_row = x + n * C;
    T* y_row = y + n * C;
    Compute* e = std::is_same_v<T, Compute> ? reinterpret_cast<Compute*>(y_row) : buffer.data();
    Compute m = finite_shift(row_max<Compute>(x_row, C));
    // The exp loop alone vectorizes (a running sum in it would keep it scalar): exp, then sum.
    for_each_index(C, [&](int64_t i) { e[i] = exp_of(static_cast<Compute>(x_row[i]) - m); });
    Compute total = lane_sum<Compute>(C, [&](int64_t i) { return e[i]; });
    Compute inv_total = Compute(1) / total;
    for_each_index(C, [&](int64_t i) { y_row[i] = static_cast<T>(e[i] * inv_total); });
  }
}

template <typename T>
void log_softmax_forward(const T* x, T* y, Rows rows) {
  using Compute = compute_t<T>;
  const int64_t C = rows.C;
  for (int64_t n = 0; n < rows.N; ++n) {
    const T* x_row = x + n * C;
    T* y_row = y + n * C;
    Compute m = finite_shift(row_max<Compute>(x_row, C));
    Compute total = lane_sum<Compute>(C, [&](int64_t i) { return exp_of(static_cast<Compute>(x_row[i]) - m); });
    Compute log_normaliser = m + std::log(total);
    for (int64_t i = 0; i < C; ++i) y_row[i] = static_cast<T>(static_cast<Compute>(x_row[i]) - log_normaliser);
  }
}

// dx = y * (g - sum(g * y)), one row at a time: the dot product, then the fused update.
template <typename T>
void softmax_backward(const T* y, const T* g, T* dx, Rows rows) {
  using Compute = compute_t<T>;
  const int64_t C = rows.C;
  for (int64_t n = 0; n < rows.N; ++n) {
    const T* y_row = y + n * C;
    const T* g_row = g + n * C;
    T* dx_row = dx + n * C;
    Compute dot = lane_sum<Compute>(
        C, [&](int64_t i) { return static_cast<Compute>(g_row[i]) * static_cast<Compute>(y_row[i]); });
    for_each_index(C, [&](int64_t i) {
      dx_row[i] = static_cast<T>(static_cast<Compute>(y_row[i]) * (static_cast<Compute>(g_row[i]) - dot));
    });
  }
}

// dx = g - exp(y) * sum(g): exp(y) is the softmax, recovered from the saved log-probabilities.
template <typename T>
void log_softmax_backward(const T* y, const T* g, T* dx, Rows rows) {
  using Compute = compute_t<T>;
  const int64_t C = rows.C;
  for (int64_t n = 0; n < rows.N; ++n) {
    const T* y_row = y + n * C;
    const T* g_row = g + n * C;
    T* dx_row = dx + n * C;
    Compute g_total = lane_sum<Compute>(C, [&](int64_t i) { return static_cast<Compute>(g_row[i]); });
    for (int64_t i = 0; i < C; ++i)
      dx_row[i] = static_cast<T>(static_cast<Compute>(g_row[i]) - exp_of(static_cast<Compute>(y_row[i])) * g_total);
  }
}

// Both Functions share these: `log` picks the pair of kernels; backward needs only the output y.
template <bool log>
Tensor forward_rows(FunctionCtx& ctx, const Tensor& x, const char* op) {
  Tensor y = Tensor::empty(x.shape(), x.options());
  ctx.save_for_backward({y});
  if (x.device().is_cuda()) {
    require_floating(x.dtype(), op);
    cuda::softmax_forward(x, y, log);
    return y;
  }
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (log)
      log_softmax_forward(x.data<T>(), y.data<T>(), Rows(x.shape()));
    else
      softmax_forward(x.data<T>(), y.data<T>(), Rows(x.shape()));
  });
  return y;
}

template <bool log>
TensorList backward_rows(FunctionCtx& ctx, const TensorList& grads, const char* op) {
  const Tensor& y = ctx.saved()[0];
  Tensor g = grads[0].to(y.dtype());
  Tensor dx = Tensor::empty(y.shape(), y.options());
  if (y.device().is_cuda()) {
    cuda::softmax_backward(y, g, dx, log);
    return {dx};
  }
  dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (log)
      log_softmax_backward(y.data<T>(), g.data<T>(), dx.data<T>(), Rows(y.shape()));
    else
      softmax_backward(y.data<T>(), g.data<T>(), dx.data<T>(), Rows(y.shape()));
  });
  return {dx};
}

struct SoftmaxFn : Function<SoftmaxFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_rows<false>(ctx, x, "softmax"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return backward_rows<false>(ctx, grads, "softmax");
  }
};

struct LogSoftmaxFn : Function<LogSoftmaxFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) { return forward_rows<true>(ctx, x, "log_softmax"); }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return backward_rows<true>(ctx, grads, "log_softmax");
  }
};

}  // namespace

Tensor softmax(const Tensor& x) { return SoftmaxFn::apply(x); }
Tensor log_softmax(const Tensor& x) { return LogSoftmaxFn::apply(x); }

}  // namespace sl
