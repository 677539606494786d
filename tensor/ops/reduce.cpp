// reduce.cpp — sum, mean, max and argmax, over the whole tensor or along one dim.
//
// A reduction along `dim` views x as [outer, n, inner] (n = x.size(dim)) and produces [outer, inner]
// (keepdim keeps a size-1 dim in its place); reducing everything is outer = inner = 1 and gives [].
//
//   sum   backward: dx[o, j, i] = g[o, i]                     (the gradient broadcasts back)
//   mean  backward: dx[o, j, i] = g[o, i] / n
//   max   backward: dx[o, j, i] = g[o, i] if j is the first maximum of x[o, :, i], else 0
//
// Accumulators: f32 and f64 sum in double (a million f32 values stay within ~1e-7 relative),
// bf16/f16 in float, integers in int64 (and their sum is i64, as in PyTorch). On a GPU the loops are
// tensor/cuda/reduce.cu, with the same accumulators.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace sl {

namespace {

struct ReduceView {
  int64_t outer = 1, n = 1, inner = 1;
  Shape out_shape;
};

ReduceView view_all(const Shape& shape) { return {1, shape.numel(), 1, Shape{}}; }

ReduceView view_along(const Shape& shape, int dim, bool keepdim, const char* op) {
  if (shape.dim() == 0) {  // a scalar reduces along dim 0 or -1 to itself, as in PyTorch
    SL_CHECK(dim == 0 || dim == -1, op, ": dim ", dim, " is out of range for a scalar (expected 0 or -1)");
    return {1, 1, 1, Shape{}};
  }
  int d = normalize_dim(dim, shape, op);
  ReduceView view;
  for (int k = 0; k < d; ++k) view.outer *= shape[k];
  view.n = shape[d];
  for (int k = d + 1; k < shape.dim(); ++k) view.inner *= shape[k];
  view.out_shape = shape;
  if (keepdim)
    view.out_shape[d] = 1;
  else
    view.out_shape.erase(view.out_shape.begin() + d);
  return view;
}

// ---- kernels ------------------------------------------------------------------------------------

template <typename T>
struct accumulator {
  using type = double;
};
template <>
struct accumulator<bf16> {
  using type = float;
};
template <>
struct accumulator<f16> {
  using type = float;
};
template <>
struct accumulator<int32_t> {
  using type = int64_t;
};
template <>
struct accumulator<int64_t> {
  using type = int64_t;
};
template <typename T>
using acc_t = typename accumulator<T>::type;
template <typename T>
using sum_out_t = std::conditional_t<std::is_integral_v<T>, int64_t, T>;

template <typename T>
acc_t<T> widen(T v) {
  return static_cast<acc_t<T>>(static_cast<compute_t<T>>(v));
}

// Sum of n contiguous values; eight independent lanes let the compiler vectorise the adds.
template <typename T>
acc_t<T> sum_contiguous(const T* x, int64_t n) {
  acc_t<T> lanes[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += widen(x[j + k]);
  acc_t<T> total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; j < n; ++j) total += widen(x[j]);
  return total;
}

// out[o, i] = scale * sum_j x[o, j, i]   (x [outer, n, inner], out [outer, inner])
template <typename T>
void sum_kernel(const T* x, sum_out_t<T>* out, const ReduceView& v, bool mean) {
  using Acc = acc_t<T>;
  using Out = sum_out_t<T>;
  auto finish = [&](Acc total) {
    if constexpr (std::is_integral_v<T>)
      return static_cast<Out>(total);
    else
      return static_cast<Out>(static_cast<compute_t<Out>>(mean ? total / static_cast<Acc>(v.n) : total));
  };
  if (v.inner == 1) {
    for (int64_t o = 0; o < v.outer; ++o) out[o] = finish(sum_contiguous(x + o * v.n, v.n));
    return;
  }
  std::vector<Acc> row(v.inner);  // running sums of one [inner] output row, walked row by row of x
  for (int64_t o = 0; o < v.outer; ++o) {
    std::fill(row.begin(), row.end(), Acc{});
    for (int64_t j = 0; j < v.n; ++j) {
      const T* x_row = x + (o * v.n + j) * v.inner;
      for (int64_t i = 0; i < v.inner; ++i) row[i] += widen(x_row[i]);
    }
    for (int64_t i = 0; i < v.inner; ++i) out[o * v.inner + i] = finish(row[i]);
  }
}

// values[o, i] = max_j x[o, j, i] and index[o, i] its first j. NaN counts as the maximum (it propagates).
template <typename T>
void max_kernel(const T* x, T* values, int64_t* index, const ReduceView& v) {
  using C = compute_t<T>;
  auto better = [](C candidate, C best) { return candidate > best || (candidate != candidate && best == best); };
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t i = 0; i < v.inner; ++i) {
      const T* column = x + o * v.n * v.inner + i;
      C best = static_cast<C>(column[0]);
      int64_t best_j = 0;
      for (int64_t j = 1; j < v.n; ++j) {
        C candidate = static_cast<C>(column[j * v.inner]);
        if (better(candidate, best)) {
          best = candidate;
          best_j = j;
        }
      }
      if (values) values[o * v.inner + i] = static_cast<T>(best);
      index[o * v.inner + i] = best_j;
    }
  }
}

// dx[o, j, i] = g[o, i] * scale   (sum and mean backward)
template <typename T>
void broadcast_back(const T* g, T* dx, const ReduceView& v, compute_t<T> scale) {
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t j = 0; j < v.n; ++j) {
      T* dx_row = dx + (o * v.n + j) * v.inner;
      const T* g_row = g + o * v.inner;
      for (int64_t i = 0; i < v.inner; ++i) dx_row[i] = static_cast<T>(static_cast<compute_t<T>>(g_row[i]) * scale);
    }
}

// ---- differentiable ops ----------------------------------------------------------------------------

struct SumFn : Function<SumFn> {
  // x [outer, n, inner] -> [outer, inner] (view.out_shape); mean divides by n
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ReduceView& view, bool mean) {
    ctx.set("view", view);
    ctx.set("mean", mean);
    ctx.set("shape", x.shape());
    DType out_dtype = is_integer(x.dtype()) ? DType::i64 : x.dtype();
    Tensor out = Tensor::empty(view.out_shape, x.options().with_dtype(out_dtype));
    if (x.device().is_cuda()) {
      if (mean) require_floating(x.dtype(), "mean");
      cuda::sum(x, out, view.outer, view.n, view.inner, mean);
      return out;
    }
    auto kernel = [&](auto tag) {
      using T = decltype(tag);
      sum_kernel<T>(x.data<T>(), out.data<sum_out_t<T>>(), view, mean);
    };
    if (mean)
      dispatch_floating(x.dtype(), "mean", kernel);
    else
      dispatch_all(x.dtype(), kernel);
    return out;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const auto& view = ctx.get<ReduceView>("view");
    Tensor dx = Tensor::empty(ctx.get<Shape>("shape"), grads[0].options());
    const double scale = ctx.get<bool>("mean") ? 1.0 / static_cast<double>(view.n) : 1.0;
    if (dx.device().is_cuda()) {
      cuda::broadcast_back(grads[0], dx, view.outer, view.n, view.inner, scale);
      return {dx};
    }
    dispatch_floating(dx.dtype(), "sum backward", [&](auto tag) {
      using T = decltype(tag);
      broadcast_back<T>(grads[0].data<T>(), dx.data<T>(), view, static_cast<compute_t<T>>(scale));
    });
    return {dx};
  }
};

struct MaxFn : Function<MaxFn> {
  // x [outer, n, inner] -> [outer, inner]; saves the index of each maximum for backward
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ReduceView& view) {
    Tensor out = Tensor::empty(view.out_shape, x.options());
    Tensor index = Tensor::empty(view.out_shape, x.options().with_dtype(DType::i64));
    if (x.device().is_cuda()) {
      cuda::max(x, out, index, view.outer, view.n, view.inner);
    } else {
      dispatch_all(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        max_kernel<T>(x.data<T>(), out.data<T>(), index.data<int64_t>(), view);
      });
    }
    ctx.save_for_backward({index});
    ctx.set("view", view);
    ctx.set("shape", x.shape());
    return out;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const auto& view = ctx.get<ReduceView>("view");
    if (grads[0].device().is_cuda()) {
      Tensor dx = Tensor::empty(ctx.get<Shape>("shape"), grads[0].options());
      cuda::scatter_max_grad(grads[0], ctx.saved()[0], dx, view.outer, view.n, view.inner);
      return {dx};
    }
    const int64_t* index = ctx.saved()[0].data<int64_t>();
    Tensor dx = zeros(ctx.get<Shape>("shape"), grads[0].options());
    dispatch_floating(dx.dtype(), "max backward", [&](auto tag) {
      using T = decltype(tag);
      const T* g = grads[0].data<T>();
      T* d = dx.data<T>();
      for (int64_t o = 0; o < view.outer; ++o)
        for (int64_t i = 0; i < view.inner; ++i) {
          int64_t k = o * view.inner + i;
          d[(o * view.n + index[k]) * view.inner + i] = g[k];
        }
    });
    return {dx};
  }
};

void check_not_empty(const Tensor& x, const ReduceView& view, const char* op, const char* what) {
  SL_CHECK(view.n > 0, op, ": cannot take the ", what, " of an empty tensor (shape ", x.shape(), ")");
}

void check_dim_not_empty(const Tensor& x, int dim, const ReduceView& view, const char* op) {
  SL_CHECK(view.n > 0, op, ": dim ", dim, " of shape ", x.shape(), " has size 0; there is nothing to reduce");
}

}  // namespace

Tensor sum(const Tensor& x) { return SumFn::apply(x, view_all(x.shape()), false); }

Tensor mean(const Tensor& x) {
  ReduceView view = view_all(x.shape());
  check_not_empty(x, view, "mean", "mean");
  return SumFn::apply(x, view, true);
}

Tensor max(const Tensor& x) {
  ReduceView view = view_all(x.shape());
  check_not_empty(x, view, "max", "max");
  return MaxFn::apply(x, view);
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  return SumFn::apply(x, view_along(x.shape(), dim, keepdim, "sum"), false);
}

Tensor mean(const Tensor& x, int dim, bool keepdim) {
  ReduceView view = view_along(x.shape(), dim, keepdim, "mean");
  check_dim_not_empty(x, dim, view, "mean");
  return SumFn::apply(x, view, true);
}

Tensor max(const Tensor& x, int dim, bool keepdim) {
  ReduceView view = view_along(x.shape(), dim, keepdim, "max");
  check_dim_not_empty(x, dim, view, "max");
  return MaxFn::apply(x, view);
}

Tensor argmax(const Tensor& x, int dim, bool keepdim) {
  ReduceView view = view_along(x.shape(), dim, keepdim, "argmax");
  check_dim_not_empty(x, dim, view, "argmax");
  Tensor index = Tensor::empty(view.out_shape, x.options().with_dtype(DType::i64));
  if (x.device().is_cuda()) {
    cuda::max(x, Tensor(), index, view.outer, view.n, view.inner);
    return index;
  }
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    max_kernel<T>(x.data<T>(), nullptr, index.data<int64_t>(), view);
  });
  return index;
}

}  // namespace sl
