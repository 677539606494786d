// loss.cpp — cross-entropy, fused: log-softmax and negative log-likelihood in one pass per row.
//
//   logits [..., V] read as rows [N, V]; targets [...] (i32/i64) read as [N].
//   Per row n with target t != ignore_index:
//     lse_n  = m + log sum_v exp(x_v - m)         (m = max_v x_v, so exp never overflows)
//     loss_n = lse_n - x_t                       = -log softmax(x)_t
//   loss = sum_n loss_n / count                   count = rows whose target is not ignored
//
//   Backward: dx_v = (softmax(x)_v - [v == t]) * g / count = (exp(x_v - lse_n) - [v == t]) * g / count,
//   and 0 for ignored rows. Forward saves the logits, the targets and lse [N] (f32, or f64 for f64
//   logits), so backward rebuilds the softmax from the logits in the same pass that writes dx: no
//   [N, V] probability tensor is ever kept.
//
//   The loss is f32 for f32, bf16 and f16 logits (f64 for f64): a mean over many rows is a reduction,
//   and a 16-bit loss would keep 3 significant digits (mixed precision computes it in f32, as autocast
//   and Megatron do). The gradient dx has the logits' dtype.
//
//   All targets ignored (count 0): the loss is 0 and the gradient is 0. PyTorch returns 0/0 = NaN
//   here. A micro-batch (or a data-parallel shard, or a pipeline stage's slice) made only of padding
//   is a normal event in training; 0 lets it add nothing to a sum of losses and to the gradients,
//   where NaN would poison the all-reduce and every parameter after the step.
#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/lanes.h"
#include "tensor/cuda/kernels.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {

namespace {

DType stats_dtype(DType logits_dtype) { return logits_dtype == DType::f64 ? DType::f64 : DType::f32; }

// Checks every target before any row is computed; returns how many rows count.
template <typename Id>
int64_t check_targets(const Id* targets, int64_t N, int64_t ignore_index, const Tensor& logits) {
  const int64_t V = logits.size(-1);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const auto t = static_cast<int64_t>(targets[n]);
    if (t == ignore_index) continue;
    SL_CHECK(t >= 0 && t < V, "cross_entropy: target ", t, " is out of range for ", V, " classes (logits ",
             logits.shape(), ", ignore_index ", ignore_index, ")");
    count++;
  }
  return count;
}

// x [N, V]; targets [N]; writes lse [N] (0 for ignored rows) and returns sum_n loss_n in double.
template <typename T, typename Id>
double cross_entropy_forward(const T* x, const Id* targets, compute_t<T>* lse, int64_t N, int64_t V,
                             int64_t ignore_index) {
  using Compute = compute_t<T>;
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const auto t = static_cast<int64_t>(targets[n]);
    if (t == ignore_index) {
      lse[n] = 0;
      continue;
    }
    const T* x_row = x + n * V;
    Compute m = lane_max<Compute>(V, [&](int64_t v) { return static_cast<Compute>(x_row[v]); });
    if (std::isinf(m)) m = 0;  // all -inf: shift by 0, not -inf (exp(-inf - -inf) would be NaN)
    const Compute sum_exp = lane_sum<Compute>(V, [&](int64_t v) { return exp_of(static_cast<Compute>(x_row[v]) - m); });
    const Compute log_sum = std::log(sum_exp);
    lse[n] = m + log_sum;
    // (m - x_t) + log_sum rather than lse - x_t: no cancellation between two large numbers.
    total += static_cast<double>(m - static_cast<Compute>(x_row[t])) + static_cast<double>(log_sum);
  }
  return total;
}

// dx [N, V] = (exp(x - lse) - one_hot(t)) * scale for counted rows, 0 for ignored rows.
template <typename T, typename Id>
void cross_entropy_backward(const T* x, const Id* targets, const compute_t<T>* lse, T* dx, int64_t N, int64_t V,
                            int64_t ignore_index, compute_t<T> scale) {
  using Compute = compute_t<T>;
  for (int64_t n = 0; n < N; ++n) {
    const auto t = static_cast<int64_t>(targets[n]);
    T* dx_row = dx + n * V;
    if (t == ignore_index) {
      for (int64_t v = 0; v < V; ++v) dx_row[v] = static_cast<T>(Compute(0));
      continue;
    }
    const T* x_row = x + n * V;
    const Compute row_lse = lse[n];
    // softmax * scale everywhere (a loop that vectorizes), then subtract scale at the target.
    for_each_index(
        V, [&](int64_t v) { dx_row[v] = static_cast<T>(exp_of(static_cast<Compute>(x_row[v]) - row_lse) * scale); });
    dx_row[t] = static_cast<T>(static_cast<Compute>(dx_row[t]) - scale);
  }
}

struct CrossEntropyFn : Function<CrossEntropyFn> {
  // The targets are checked on the host, as on the CPU (a copy of N ids; the GPU never sees a bad
  // one), then tensor/cuda/softmax.cu computes each row's loss, and their sum / count stays on the GPU.
  static Tensor forward_on_gpu(FunctionCtx& ctx, const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               const Tensor& lse) {
    require_floating(logits.dtype(), "cross_entropy");
    const Tensor host_targets = targets.to(Device::cpu());
    int64_t count = 0;
    dispatch_index(targets.dtype(), "cross_entropy", [&](auto id_tag) {
      using Id = decltype(id_tag);
      count = check_targets(host_targets.data<Id>(), targets.numel(), ignore_index, logits);
    });
    ctx.set("count", count);
    Tensor row_loss = Tensor::empty(lse.shape(), lse.options());
    cuda::cross_entropy_forward(logits, targets, ignore_index, lse, row_loss);
    Tensor total = Tensor::empty(Shape{}, lse.options());
    cuda::sum(row_loss, total, 1, row_loss.numel(), 1, false);
    cuda::scale(total, count > 0 ? 1.0 / static_cast<double>(count) : 0.0);
    return total;  // f32 for 16-bit logits, as on the CPU
  }

  static Tensor forward(FunctionCtx& ctx, const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    Tensor lse = Tensor::empty(Shape{N}, logits.options().with_dtype(stats_dtype(logits.dtype())));
    ctx.save_for_backward({logits, targets, lse});
    ctx.set("ignore_index", ignore_index);
    if (logits.device().is_cuda()) return forward_on_gpu(ctx, logits, targets, ignore_index, lse);
    double total = 0;
    int64_t count = 0;
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(targets.dtype(), "cross_entropy", [&](auto id_tag) {
        using Id = decltype(id_tag);
        count = check_targets(targets.data<Id>(), N, ignore_index, logits);
        total =
            cross_entropy_forward(logits.data<T>(), targets.data<Id>(), lse.data<compute_t<T>>(), N, V, ignore_index);
      });
    });
    ctx.set("count", count);
    return full(Shape{}, count > 0 ? total / static_cast<double>(count) : 0.0, lse.options());
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& logits = ctx.saved()[0];
    const Tensor& targets = ctx.saved()[1];
    const Tensor& lse = ctx.saved()[2];
    const auto ignore_index = ctx.get<int64_t>("ignore_index");
    const auto count = ctx.get<int64_t>("count");
    const int64_t V = logits.size(-1);
    const int64_t N = targets.numel();
    // The loss is a mean over counted rows, so each gets g / count (and nothing when none count).
    const double scale = count > 0 ? grads[0].item() / static_cast<double>(count) : 0.0;
    Tensor dx = Tensor::empty(logits.shape(), logits.options());
    if (logits.device().is_cuda()) {
      cuda::cross_entropy_backward(logits, targets, lse, ignore_index, scale, dx);
      return {dx, Tensor()};
    }
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      using Compute = compute_t<T>;
      dispatch_index(targets.dtype(), "cross_entropy", [&](auto id_tag) {
        using Id = decltype(id_tag);
        cross_entropy_backward(logits.data<T>(), targets.data<Id>(), lse.data<Compute>(), dx.data<T>(), N, V,
                               ignore_index, static_cast<Compute>(scale));
      });
    });
    return {dx, Tensor()};
  }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  SL_CHECK(logits.dim() >= 1, "cross_entropy: logits must be [..., V] but have shape ", logits.shape());
  Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  SL_CHECK(targets.shape() == leading, "cross_entropy: logits ", logits.shape(), " need targets of shape ", leading,
           " but targets have shape ", targets.shape());
  SL_CHECK(is_integer(targets.dtype()), "cross_entropy: targets must be class indices (i32 or i64) but are ",
           dtype_name(targets.dtype()), " (shape ", targets.shape(), ")");
  SL_CHECK(logits.size(-1) > 0, "cross_entropy: logits have no classes (shape ", logits.shape(), ")");
  SL_CHECK(targets.device() == logits.device(), "cross_entropy: logits are on ", logits.device(),
           " but targets are on ", targets.device());
  return CrossEntropyFn::apply(logits, targets, ignore_index);
}

}  // namespace sl
