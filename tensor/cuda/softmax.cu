// softmax.cu — the row kernels of softmax, log_softmax, attention's causal softmax and the fused
// cross-entropy (tensor/cuda/kernels.h). One block per row of C values; the formulas are those of
// tensor/ops/softmax.cpp, attention.cpp and loss.cpp, with the same max shift and the same float
// exp (exp_of, tensor/functors.h):
//
//   softmax       y = exp(x - m) / sum exp(x - m)            dx = y (g - sum g y)
//   log_softmax   y = x - m - log sum exp(x - m)             dx = g - exp(y) sum g
//   causal        row t of each [T, T] block sees keys 0..t, scaled; the rest is 0
//   cross-entropy lse = m + log sum exp(x - m),  loss = lse - x_t,  dx = (exp(x - lse) - [v == t]) scale
//
// A row of all -inf shifts by 0 instead of -inf, as on the CPU (so exp gives 0 and the result NaN,
// like PyTorch, rather than NaN from inf - inf inside exp).
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename C>
__device__ C finite_shift(C m) {
  return isinf(m) ? C(0) : m;
}

template <typename T>
__device__ compute_t<T> at(const T* p, int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}

// The largest of x[0, n) * scale over the block's threads.
template <typename T>
__device__ compute_t<T> row_max(const T* x, int64_t n, compute_t<T> scale) {
  using C = compute_t<T>;
  C m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const C v = scale * at(x, i);
    m = (v != v || v > m) ? v : m;
  }
  return finite_shift(block_max(m));
}

// sum of exp(x * scale - m) over x[0, n)
template <typename T>
__device__ compute_t<T> row_exp_sum(const T* x, int64_t n, compute_t<T> scale, compute_t<T> m) {
  compute_t<T> total = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) total += exp_of(scale * at(x, i) - m);
  return block_sum(total);
}

template <typename T, bool Log>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t C_len) {
  using C = compute_t<T>;
  const T* x_row = x + static_cast<int64_t>(blockIdx.x) * C_len;
  T* y_row = y + static_cast<int64_t>(blockIdx.x) * C_len;
  const C m = row_max(x_row, C_len, C(1));
  const C total = row_exp_sum(x_row, C_len, C(1), m);
  if (Log) {
    const C log_normaliser = m + log(total);
    for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) y_row[i] = static_cast<T>(at(x_row, i) - log_normaliser);
  } else {
    const C inv_total = C(1) / total;
    for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x)
      y_row[i] = static_cast<T>(exp_of(at(x_row, i) - m) * inv_total);
  }
}

template <typename T, bool Log>
__global__ void softmax_backward_kernel(const T* y, const T* g, T* dx, int64_t C_len) {
  using C = compute_t<T>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * C_len;
  C partial = 0;  // softmax: sum g y;  log_softmax: sum g
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x)
    partial += Log ? at(g, row + i) : at(g, row + i) * at(y, row + i);
  const C total = block_sum(partial);
  for (int64_t i = threadIdx.x; i < C_len; i += blockDim.x) {
    const C gi = at(g, row + i), yi = at(y, row + i);
    dx[row + i] = static_cast<T>(Log ? gi - exp_of(yi) * total : yi * (gi - total));
  }
}

// Row r of scores [rows, T] is query t = r % T: keys 0..t are visible.
template <typename T>
__global__ void causal_softmax_forward_kernel(const T* x, T* y, int64_t T_len, compute_t<T> scale) {
  using C = compute_t<T>;
  const int64_t r = blockIdx.x, visible = r % T_len + 1;
  const T* x_row = x + r * T_len;
  T* y_row = y + r * T_len;
  const C m = row_max(x_row, visible, scale);
  const C inv_total = C(1) / row_exp_sum(x_row, visible, scale, m);
  for (int64_t s = threadIdx.x; s < T_len; s += blockDim.x)
    y_row[s] = static_cast<T>(s < visible ? exp_of(scale * at(x_row, s) - m) * inv_total : C(0));
}

template <typename T>
__global__ void causal_softmax_backward_kernel(const T* y, const T* g, T* dx, int64_t T_len, compute_t<T> scale) {
  using C = compute_t<T>;
  const int64_t r = blockIdx.x, visible = r % T_len + 1, row = r * T_len;
  C partial = 0;
  for (int64_t s = threadIdx.x; s < visible; s += blockDim.x) partial += at(g, row + s) * at(y, row + s);
  const C dot = block_sum(partial);
  for (int64_t s = threadIdx.x; s < T_len; s += blockDim.x)
    dx[row + s] = static_cast<T>(s < visible ? scale * at(y, row + s) * (at(g, row + s) - dot) : C(0));
}

// One row per block: lse and the row's loss (both 0 for an ignored row).
template <typename T, typename Id>
__global__ void cross_entropy_forward_kernel(const T* x, const Id* targets, int64_t V, int64_t ignore_index,
                                             compute_t<T>* lse, compute_t<T>* row_loss) {
  using C = compute_t<T>;
  const int64_t n = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[n]);
  if (t == ignore_index) {  // the whole block takes this branch: t is the row's
    if (threadIdx.x == 0) lse[n] = row_loss[n] = C(0);
    return;
  }
  const T* x_row = x + n * V;
  const C m = row_max(x_row, V, C(1));
  const C log_sum = log(row_exp_sum(x_row, V, C(1), m));
  if (threadIdx.x == 0) {
    lse[n] = m + log_sum;
    row_loss[n] = (m - at(x_row, t)) + log_sum;  // no cancellation between two large numbers
  }
}

template <typename T, typename Id>
__global__ void cross_entropy_backward_kernel(const T* x, const Id* targets, const compute_t<T>* lse, int64_t V,
                                              int64_t ignore_index, compute_t<T> scale, T* dx) {
  using C = compute_t<T>;
  const int64_t n = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[n]);
  const T* x_row = x + n * V;
  T* dx_row = dx + n * V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    if (t == ignore_index) {
      dx_row[v] = static_cast<T>(C(0));
      continue;
    }
    // softmax * scale, rounded, then scale off at the target: the CPU loop's two steps.
    const T p = static_cast<T>(exp_of(at(x_row, v) - lse[n]) * scale);
    dx_row[v] = v == t ? static_cast<T>(static_cast<C>(p) - scale) : p;
  }
}

int64_t rows_of(const Tensor& t) {
  const int64_t C_len = t.dim() == 0 ? 1 : t.size(-1);
  return C_len == 0 ? 0 : t.numel() / C_len;
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& y, bool log) {
  use_device_of(x);
  const int64_t C_len = x.dim() == 0 ? 1 : x.size(-1);
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    for_row_chunks(rows_of(x), [&](int64_t first, unsigned rows) {
      const T* in = ptr<const T>(x) + first * C_len;
      T* out = ptr<T>(y) + first * C_len;
      if (log)
        softmax_forward_kernel<T, true><<<rows, kRowThreads>>>(in, out, C_len);
      else
        softmax_forward_kernel<T, false><<<rows, kRowThreads>>>(in, out, C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, bool log) {
  use_device_of(y);
  const int64_t C_len = y.dim() == 0 ? 1 : y.size(-1);
  dispatch_floating(y.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    for_row_chunks(rows_of(y), [&](int64_t first, unsigned rows) {
      const int64_t offset = first * C_len;
      if (log)
        softmax_backward_kernel<T, true>
            <<<rows, kRowThreads>>>(ptr<const T>(y) + offset, ptr<const T>(g) + offset, ptr<T>(dx) + offset, C_len);
      else
        softmax_backward_kernel<T, false>
            <<<rows, kRowThreads>>>(ptr<const T>(y) + offset, ptr<const T>(g) + offset, ptr<T>(dx) + offset, C_len);
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

// Chunks of whole [T, T] blocks, so that row r % T is still the query's position in each launch.
void causal_softmax_forward(const Tensor& scores, const Tensor& y, double scale) {
  use_device_of(scores);
  const int64_t T_len = scores.size(-1);
  dispatch_floating(scores.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    for_row_chunks(
        rows_of(scores),
        [&](int64_t first, unsigned rows) {
          SL_ASSERT(first % T_len == 0);
          causal_softmax_forward_kernel<T><<<rows, kRowThreads>>>(
              ptr<const T>(scores) + first * T_len, ptr<T>(y) + first * T_len, T_len, static_cast<compute_t<T>>(scale));
        },
        T_len);
  });
  SL_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, double scale) {
  use_device_of(y);
  const int64_t T_len = y.size(-1);
  dispatch_floating(y.dtype(), "causal_softmax", [&](auto tag) {
    using T = decltype(tag);
    for_row_chunks(
        rows_of(y),
        [&](int64_t first, unsigned rows) {
          SL_ASSERT(first % T_len == 0);
          const int64_t offset = first * T_len;
          causal_softmax_backward_kernel<T><<<rows, kRowThreads>>>(ptr<const T>(y) + offset, ptr<const T>(g) + offset,
                                                                   ptr<T>(dx) + offset, T_len,
                                                                   static_cast<compute_t<T>>(scale));
        },
        T_len);
  });
  SL_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                           const Tensor& row_loss) {
  use_device_of(logits);
  const int64_t V = logits.size(-1);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    dispatch_index(targets.dtype(), "cross_entropy", [&](auto id_tag) {
      using Id = decltype(id_tag);
      for_row_chunks(targets.numel(), [&](int64_t first, unsigned rows) {
        cross_entropy_forward_kernel<T, Id><<<rows, kRowThreads>>>(ptr<const T>(logits) + first * V,
                                                                   ptr<const Id>(targets) + first, V, ignore_index,
                                                                   ptr<C>(lse) + first, ptr<C>(row_loss) + first);
      });
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                            double scale, const Tensor& dx) {
  use_device_of(logits);
  const int64_t V = logits.size(-1);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    dispatch_index(targets.dtype(), "cross_entropy", [&](auto id_tag) {
      using Id = decltype(id_tag);
      for_row_chunks(targets.numel(), [&](int64_t first, unsigned rows) {
        cross_entropy_backward_kernel<T, Id><<<rows, kRowThreads>>>(
            ptr<const T>(logits) + first * V, ptr<const Id>(targets) + first, ptr<const C>(lse) + first, V,
            ignore_index, static_cast<C>(scale), ptr<T>(dx) + first * V);
      });
    });
  });
  SL_CUDA_CHECK_LAUNCH();
}

}  // namespace sl::cuda
