// reduce.cu — sums, means and maxima along a dim or over everything, their backwards, and the sum
// over broadcast dims that every broadcasting op's backward needs (tensor/cuda/kernels.h).
//
// A reduction along one dim sees x as [outer, n, inner] and writes [outer, inner]:
//
//   everything      (outer = inner = 1)  two passes: blocks write partial sums, one block adds them
//   the last dim    (inner = 1)          one block per row, block_sum over its n values
//   a leading dim   (outer = 1)          column sums in row chunks (launch.cuh), like a bias gradient
//   a middle dim                         one thread per output, walking n with stride inner
//
// Accumulators as on the CPU: sum and mean (reduce.cpp) in double for f32/f64, float for bf16/f16;
// sum_to (binary.cpp) and the sum of squares (clip_grad_norm) in double; integers in int64 (their sum
// is i64). The order of the additions differs from the CPU's: results agree to rounding.
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/indexing.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace sl::cuda {

namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_integral_v<T>, int64_t,
                                 std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, double>>;
template <typename T>
using wide_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
template <typename T>
using sum_out_t = std::conditional_t<std::is_integral_v<T>, int64_t, T>;

template <typename Acc, typename T>
__device__ Acc widen(T v) {
  return static_cast<Acc>(static_cast<compute_t<T>>(v));
}

// The sum (or mean) in the op's output type.
template <typename T, typename Acc>
__device__ sum_out_t<T> finish(Acc total, int64_t n, bool mean) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<sum_out_t<T>>(total);
  else
    return static_cast<T>(static_cast<compute_t<T>>(mean ? total / static_cast<Acc>(n) : total));
}

// Pass 1 of a whole-tensor sum: block b adds up its share of x (of x^2 when Square).
template <typename T, typename Acc, bool Square>
__global__ void partial_sums_kernel(const T* x, int64_t n, Acc* partial) {
  Acc total = 0;
  SL_FOR_EACH_INDEX(i, n) {
    const Acc v = widen<Acc>(x[i]);
    total += Square ? v * v : v;
  }
  total = block_sum(total);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Pass 2: one block adds the partial sums; Finish turns the total into the stored value.
template <typename Acc, typename Out, typename Finish>
__global__ void finish_sums_kernel(const Acc* partial, int64_t count, Out* out, Finish finish_total) {
  Acc total = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) total += partial[i];
  total = block_sum(total);
  if (threadIdx.x == 0) *out = finish_total(total);
}

template <typename T, typename Acc>
struct FinishSum {
  int64_t n;
  bool mean;
  __device__ sum_out_t<T> operator()(Acc total) const { return finish<T>(total, n, mean); }
};
template <typename Acc>
struct KeepTotal {
  __device__ Acc operator()(Acc total) const { return total; }
};

template <typename T>
__global__ void row_sums_kernel(const T* x, int64_t n, bool mean, sum_out_t<T>* out) {
  const T* row = x + static_cast<int64_t>(blockIdx.x) * n;
  acc_t<T> total = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) total += widen<acc_t<T>>(row[j]);
  total = block_sum(total);
  if (threadIdx.x == 0) out[blockIdx.x] = finish<T>(total, n, mean);
}

template <typename T>
__global__ void middle_sums_kernel(const T* x, int64_t outer, int64_t n, int64_t inner, bool mean, sum_out_t<T>* out) {
  SL_FOR_EACH_INDEX(k, outer * inner) {
    const int64_t o = k / inner, i = k % inner;
    const T* column = x + o * n * inner + i;
    acc_t<T> total = 0;
    for (int64_t j = 0; j < n; ++j) total += widen<acc_t<T>>(column[j * inner]);
    out[k] = finish<T>(total, n, mean);
  }
}

// value(n, c) = x[n, c] widened, for the column sums of launch.cuh
template <typename T, typename Acc>
struct ColumnOf {
  const T* x;
  int64_t C;
  __device__ Acc operator()(int64_t n, int64_t c) const { return widen<Acc>(x[n * C + c]); }
};
template <typename Out, typename Acc, typename Finish>
struct StoreColumn {
  Out* out;
  Finish finish_total;
  __device__ void operator()(int64_t c, Acc total) const { out[c] = finish_total(total); }
};
template <typename T, typename Acc>
struct RoundTo {
  __device__ T operator()(Acc total) const { return static_cast<T>(static_cast<compute_t<T>>(total)); }
};

// The first maximum along n of every [outer, inner] position; NaN beats everything (CPU's rule).
template <typename T>
__global__ void max_kernel(const T* x, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* index) {
  using C = compute_t<T>;
  SL_FOR_EACH_INDEX(k, outer * inner) {
    const int64_t o = k / inner, i = k % inner;
    const T* column = x + o * n * inner + i;
    C best = static_cast<C>(column[0]);
    int64_t best_j = 0;
    for (int64_t j = 1; j < n; ++j) {
      const C candidate = static_cast<C>(column[j * inner]);
      if (candidate > best || (candidate != candidate && best == best)) {
        best = candidate;
        best_j = j;
      }
    }
    if (values != nullptr) values[k] = static_cast<T>(best);
    index[k] = best_j;
  }
}

template <typename T>
__global__ void broadcast_back_kernel(const T* g, T* dx, int64_t n, int64_t inner, int64_t total, compute_t<T> scale) {
  SL_FOR_EACH_INDEX(k, total) {
    const int64_t o = k / (n * inner), i = k % inner;
    dx[k] = static_cast<T>(static_cast<compute_t<T>>(g[o * inner + i]) * scale);
  }
}

template <typename T>
__global__ void scatter_max_grad_kernel(const T* g, const int64_t* index, T* dx, int64_t outer, int64_t n,
                                        int64_t inner) {
  SL_FOR_EACH_INDEX(k, outer * inner) {
    const int64_t o = k / inner, i = k % inner;
    dx[(o * n + index[k]) * inner + i] = g[k];
  }
}

template <typename T>
__global__ void reduce_to_kernel(const T* x, T* out, int64_t n_out, ReduceToIndex index) {
  SL_FOR_EACH_INDEX(o, n_out) {
    int64_t base[1], step[1];
    index.kept.offsets(o, base);
    wide_t<T> total = 0;
    for (int64_t r = 0; r < index.count; ++r) {
      index.summed.offsets(r, step);
      total += widen<wide_t<T>>(x[base[0] + step[0]]);
    }
    out[o] = static_cast<T>(static_cast<compute_t<T>>(total));
  }
}

// A whole-tensor sum of x (of x^2 when Square) into *out, in two passes; partial sums live in a
// scratch tensor on the same GPU.
template <typename T, typename Acc, bool Square, typename Out, typename Finish>
void sum_all(const Tensor& x, Out* out, Finish finish_total) {
  const int64_t n = x.numel();
  const unsigned blocks = std::min<unsigned>(blocks_for(n), 1024);
  Tensor partial = Tensor::empty(Shape{blocks}, TensorOptions(dtype_of<Acc>::value, x.device()));
  partial_sums_kernel<T, Acc, Square><<<blocks, kRowThreads>>>(ptr<const T>(x), n, ptr<Acc>(partial));
  SL_CUDA_CHECK_LAUNCH();
  finish_sums_kernel<<<1, kRowThreads>>>(ptr<const Acc>(partial), blocks, out, finish_total);
  SL_CUDA_CHECK_LAUNCH();
}

// x's shape ends with `shape` (after dropping shape's leading 1s): a sum over whole leading rows.
bool is_trailing_part(const Shape& shape, const Shape& x) {
  int first = 0;
  while (first < shape.dim() && shape[first] == 1) ++first;
  const int kept = shape.dim() - first;
  if (kept > x.dim()) return false;
  for (int d = 0; d < kept; ++d)
    if (shape[first + d] != x[x.dim() - kept + d]) return false;
  return true;
}

}  // namespace

void sum(const Tensor& x, const Tensor& out, int64_t outer, int64_t n, int64_t inner, bool mean) {
  use_device_of(x);
  if (outer * inner == 0) return;
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = acc_t<T>;
    sum_out_t<T>* o = ptr<sum_out_t<T>>(out);
    if (n == 0) {  // an empty dim sums to zeros
      SL_CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(out.nbytes()), cudaStreamLegacy));
    } else if (outer * inner == 1) {
      sum_all<T, Acc, false>(x, o, FinishSum<T, Acc>{n, mean});
    } else if (inner == 1) {
      for_row_chunks(outer, [&](int64_t first, unsigned rows) {
        row_sums_kernel<T><<<rows, kRowThreads>>>(ptr<const T>(x) + first * n, n, mean, o + first);
      });
    } else if (outer == 1) {
      using Finish = FinishSum<T, Acc>;
      column_sums<Acc>(x, n, inner, ColumnOf<T, Acc>{ptr<const T>(x), inner},
                       StoreColumn<sum_out_t<T>, Acc, Finish>{o, Finish{n, mean}});
    } else {
      middle_sums_kernel<T><<<blocks_for(outer * inner), kThreads>>>(ptr<const T>(x), outer, n, inner, mean, o);
    }
  });
  SL_CUDA_CHECK_LAUNCH();
}

void max(const Tensor& x, const Tensor& values, const Tensor& index, int64_t outer, int64_t n, int64_t inner) {
  use_device_of(x);
  if (outer * inner == 0) return;
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    max_kernel<T><<<blocks_for(outer * inner), kThreads>>>(
        ptr<const T>(x), outer, n, inner, values.defined() ? ptr<T>(values) : nullptr, ptr<int64_t>(index));
  });
  SL_CUDA_CHECK_LAUNCH();
}

void broadcast_back(const Tensor& g, const Tensor& dx, int64_t outer, int64_t n, int64_t inner, double scale) {
  use_device_of(dx);
  const int64_t total = outer * n * inner;
  if (total == 0) return;
  dispatch_floating(dx.dtype(), "sum backward", [&](auto tag) {
    using T = decltype(tag);
    broadcast_back_kernel<T><<<blocks_for(total), kThreads>>>(ptr<const T>(g), ptr<T>(dx), n, inner, total,
                                                              static_cast<compute_t<T>>(scale));
  });
  SL_CUDA_CHECK_LAUNCH();
}

void scatter_max_grad(const Tensor& g, const Tensor& index, const Tensor& dx, int64_t outer, int64_t n, int64_t inner) {
  use_device_of(dx);
  SL_CUDA_CHECK(cudaMemsetAsync(dx.data_ptr(), 0, static_cast<size_t>(dx.nbytes()), cudaStreamLegacy));
  if (outer * inner == 0) return;
  dispatch_floating(dx.dtype(), "max backward", [&](auto tag) {
    using T = decltype(tag);
    scatter_max_grad_kernel<T><<<blocks_for(outer * inner), kThreads>>>(ptr<const T>(g), ptr<const int64_t>(index),
                                                                        ptr<T>(dx), outer, n, inner);
  });
  SL_CUDA_CHECK_LAUNCH();
}

void reduce_to(const Tensor& x, const Tensor& out) {
  use_device_of(x);
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = wide_t<T>;
    if (n_out > 1 && is_trailing_part(out.shape(), x.shape())) {  // a bias gradient: [..., C] -> [C]
      column_sums<Acc>(x, x.numel() / n_out, n_out, ColumnOf<T, Acc>{ptr<const T>(x), n_out},
                       StoreColumn<T, Acc, RoundTo<T, Acc>>{ptr<T>(out), {}});
      return;
    }
    const ReduceToIndex index = reduce_to_index(x.shape(), out.shape());
    reduce_to_kernel<T><<<blocks_for(n_out), kThreads>>>(ptr<const T>(x), ptr<T>(out), n_out, index);
  });
  SL_CUDA_CHECK_LAUNCH();
}

double sum_of_squares(const Tensor& x) {
  use_device_of(x);
  if (x.numel() == 0) return 0.0;
  Tensor total = Tensor::empty(Shape{}, TensorOptions(DType::f64, x.device()));
  dispatch_floating(x.dtype(), "sum_of_squares", [&](auto tag) {
    using T = decltype(tag);
    sum_all<T, double, true>(x, ptr<double>(total), KeepTotal<double>{});
  });
  return total.item();  // waits for the GPU
}

}  // namespace sl::cuda
