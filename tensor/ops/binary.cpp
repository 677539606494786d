// binary.cpp — elementwise binary ops with NumPy broadcasting: add, sub, mul, div, maximum, sum_to.
//
//   out = op(a, b)        out.shape = broadcast_shapes(a.shape, b.shape)   e.g. [B, T, C] + [C]
//   da  = sum_to(dy * d op/da, a.shape)                   broadcasting's backward is a sum over
//   db  = sum_to(dy * d op/db, b.shape)                   the dims an operand was repeated along
//
// Forward loops, fastest first: equal shapes (one flat loop); a one-element operand (a scalar in a
// register); a trailing-row operand, b [T, C] or [C] against a [B, T, C] (a bias: b[i % inner]); and
// a general walk over the merged output dims, row by row, each operand's step along a row 1 or 0
// (tensor/cpu/broadcast.h). The per-element math is in tensor/functors.h; on a GPU the same functors
// run in tensor/cuda/elementwise.cu, one thread per output element.
//
// dtypes: both operands must have the same dtype and device (no implicit promotion: cast first).
// Integer tensors (i32, i64) work for add, sub, mul and maximum, without autograd (integers carry no
// gradient), and with a scalar only if the scalar is a whole number in range; div is floating only.
#include <limits>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/broadcast.h"
#include "tensor/cpu/convert.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// ---- the binary kernel -------------------------------------------------------------------------------

void check_same_dtype_and_device(const Tensor& a, const Tensor& b, const char* name) {
  SL_CHECK(a.dtype() == b.dtype(), name, ": dtype mismatch (", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
           ") for shapes ", a.shape(), " and ", b.shape(), ": cast one with .to(dtype)");
  SL_CHECK(a.device() == b.device(), name, ": tensors on ", a.device(), " and ", b.device(), " (shapes ", a.shape(),
           " and ", b.shape(), "): move one with .to(device)");
}

template <bool AllowInteger, typename F>
void dispatch_op(DType dtype, const char* name, F&& f) {
  if constexpr (AllowInteger)
    dispatch_all(dtype, f);
  else
    dispatch_floating(dtype, name, f);
}

// The row kernels every path comes down to: both operands walk, or one of them is a constant. They
// stay out of line (noinline): inlined into the dispatch lambdas, GCC drops the __restrict promises
// and no longer vectorizes them.
template <typename T, typename Op>
[[gnu::noinline]] void row_both(const T* __restrict a, const T* __restrict b, T* __restrict out, int64_t n, Op op) {
  using C = compute_t<T>;
  for_each_index(n, [&](int64_t i) { out[i] = static_cast<T>(op(static_cast<C>(a[i]), static_cast<C>(b[i]))); });
}
template <typename T, typename Op>
[[gnu::noinline]] void row_b_constant(const T* __restrict a, compute_t<T> b, T* __restrict out, int64_t n, Op op) {
  using C = compute_t<T>;
  for_each_index(n, [&](int64_t i) { out[i] = static_cast<T>(op(static_cast<C>(a[i]), b)); });
}
template <typename T, typename Op>
[[gnu::noinline]] void row_a_constant(compute_t<T> a, const T* __restrict b, T* __restrict out, int64_t n, Op op) {
  using C = compute_t<T>;
  for_each_index(n, [&](int64_t i) { out[i] = static_cast<T>(op(a, static_cast<C>(b[i]))); });
}

// f16: the same rows on f32 chunks, so they vectorise (tensor/cpu/convert.h).
template <typename Op>
[[gnu::noinline]] void row_both(const f16* a, const f16* b, f16* out, int64_t n, Op op) {
  cpu::in_f32_chunks(a, b, out, n, [&](const float* a32, const float* b32, float* out32, int64_t count) {
    row_both(a32, b32, out32, count, op);
  });
}
template <typename Op>
[[gnu::noinline]] void row_b_constant(const f16* a, float b, f16* out, int64_t n, Op op) {
  cpu::in_f32_chunks(a, nullptr, out, n, [&](const float* a32, const float*, float* out32, int64_t count) {
    row_b_constant(a32, b, out32, count, op);
  });
}
template <typename Op>
[[gnu::noinline]] void row_a_constant(float a, const f16* b, f16* out, int64_t n, Op op) {
  cpu::in_f32_chunks(b, nullptr, out, n, [&](const float* b32, const float*, float* out32, int64_t count) {
    row_a_constant(a, b32, out32, count, op);
  });
}

template <typename T, typename Op>
void binary_loop(const T* a, const T* b, T* out, const Shape& a_shape, const Shape& b_shape, const Shape& out_shape,
                 Op op) {
  using C = compute_t<T>;
  const int64_t n = out_shape.numel();
  if (n == 0) return;
  if (a_shape == b_shape) {
    row_both(a, b, out, n, op);
  } else if (b_shape.numel() == 1) {
    row_b_constant(a, static_cast<C>(b[0]), out, n, op);
  } else if (a_shape.numel() == 1) {
    row_a_constant(static_cast<C>(a[0]), b, out, n, op);
  } else if (a_shape == out_shape && cpu::is_trailing_part(b_shape, out_shape)) {  // b is a row: [C] vs [B, T, C]
    const int64_t inner = b_shape.numel();
    for (int64_t row = 0; row < n; row += inner) row_both(a + row, b, out + row, inner, op);
  } else if (b_shape == out_shape && cpu::is_trailing_part(a_shape, out_shape)) {
    const int64_t inner = a_shape.numel();
    for (int64_t row = 0; row < n; row += inner) row_both(a, b + row, out + row, inner, op);
  } else {  // operands 0, 1: a, b; the output is written in order, row after row
    const cpu::BroadcastWalk<2> walk(out_shape, {a_shape, b_shape});
    T* out_row = out;
    walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
      const bool a_walks = step[0] == 1, b_walks = step[1] == 1;
      if (a_walks && b_walks)
        row_both(a + at[0], b + at[1], out_row, length, op);
      else if (a_walks)
        row_b_constant(a + at[0], static_cast<C>(b[at[1]]), out_row, length, op);  // [R, C] op [R, 1]
      else
        row_a_constant(static_cast<C>(a[at[0]]), b + at[1], out_row, length, op);
      out_row += length;
    });
  }
}

// out = op(a, b) with broadcasting (no autograd: the Functions below wrap it).
template <bool AllowInteger = false, typename Op>
Tensor binary(const Tensor& a, const Tensor& b, Op op, const char* name) {
  check_same_dtype_and_device(a, b, name);
  Shape out_shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(out_shape, a.options());
  if (a.device().is_cuda()) {
    if (!AllowInteger) require_floating(a.dtype(), name);
    cuda::binary(Op::kind, parameter_of(op), a, b, out);
    return out;
  }
  dispatch_op<AllowInteger>(a.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    binary_loop(a.data<T>(), b.data<T>(), out.data<T>(), a.shape(), b.shape(), out_shape, op);
  });
  return out;
}

// out = op(x, s) for a number s. Integer tensors need a whole s that fits their type.
template <bool AllowInteger = false, typename Op>
Tensor binary_scalar(const Tensor& x, double s, Op op, const char* name) {
  Tensor out = Tensor::empty(x.shape(), x.options());
  dispatch_op<AllowInteger>(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_integral_v<T>)
      SL_CHECK(s >= static_cast<double>(std::numeric_limits<T>::min()) &&  // range first: the cast needs it
                   s < -static_cast<double>(std::numeric_limits<T>::min()) &&
                   s == static_cast<double>(static_cast<T>(s)),
               name, ": the scalar ", s, " does not suit the ", dtype_name(x.dtype()), " tensor (shape ", x.shape(),
               "): integer tensors take only whole numbers that fit their type");
    if (x.device().is_cuda()) {
      cuda::binary_scalar(Op::kind, parameter_of(op), x, s, out);
      return;
    }
    T one[1] = {static_cast<T>(static_cast<C>(s))};
    binary_loop(x.data<T>(), one, out.data<T>(), x.shape(), Shape{}, x.shape(), op);
  });
  return out;
}

// ---- sum_to and its inverse, broadcast_to --------------------------------------------------------------

// acc[j] += x[j] for a row, in the accumulator type.
template <typename Acc, typename T>
[[gnu::noinline]] void accumulate_row(Acc* __restrict acc, const T* __restrict x, int64_t n) {
  for_each_index(n, [&](int64_t j) { acc[j] += static_cast<Acc>(static_cast<compute_t<T>>(x[j])); });
}

// The sum of x[0, n) in 8 running sums (SIMD lanes), added up at the end.
template <typename Acc, typename T>
[[gnu::noinline]] Acc sum_all(const T* __restrict x, int64_t n) {
  Acc lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += static_cast<Acc>(static_cast<compute_t<T>>(x[i + j]));
  for (; i < n; ++i) lanes[0] += static_cast<Acc>(static_cast<compute_t<T>>(x[i]));
  Acc total = 0;
  for (Acc lane : lanes) total += lane;
  return total;
}

// x [out shape] summed down to `shape` (which broadcasts to x's shape). Accumulates in double
// (int64 for integers), so a bias gradient summed over B*T rows loses nothing.
Tensor reduce_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = Tensor::empty(shape, x.options());
  if (x.device().is_cuda()) {
    cuda::reduce_to(x, out);
    return out;
  }
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    const T* in = x.data<T>();
    const int64_t n = x.numel();
    std::vector<Acc> acc(shape.numel(), Acc(0));
    if (n == 0) {
      // nothing to add: an empty x sums to zeros
    } else if (shape.numel() == 1) {
      acc[0] = sum_all<Acc>(in, n);
    } else if (cpu::is_trailing_part(shape, x.shape())) {  // a bias: [B, T, C] -> [C]
      const int64_t inner = shape.numel();
      for (int64_t row = 0; row < n; row += inner) accumulate_row(acc.data(), in + row, inner);
    } else {  // operands 0, 1: x, the sums
      const cpu::BroadcastWalk<2> walk(x.shape(), {x.shape(), shape});
      walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
        if (step[1] == 1) {
          accumulate_row(acc.data() + at[1], in + at[0], length);
        } else {  // [R, C] -> [R, 1]: the row sums to one element
          Acc total = 0;
          for (int64_t j = 0; j < length; ++j) total += static_cast<Acc>(static_cast<C>(in[at[0] + j]));
          acc[at[1]] += total;
        }
      });
    }
    T* o = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<T>(static_cast<C>(acc[i]));
  });
  return out;
}

// x repeated along the broadcast dims to `shape` (sum_to's backward).
Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = Tensor::empty(shape, x.options());
  if (x.device().is_cuda()) {
    cuda::broadcast_to(x, out);
    return out;
  }
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const cpu::BroadcastWalk<2> walk(shape, {shape, x.shape()});  // operands 0, 1: out, x
    walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
      for (int64_t j = 0; j < length; ++j) o[at[0] + j] = in[at[1] + j * step[1]];
    });
  });
  return out;
}

// ---- the differentiable ops: tensor op tensor ------------------------------------------------------------

// The gradient of an operand: reduced to its shape, or undefined when it needs none.
Tensor grad_for(const FunctionCtx& ctx, size_t input, const Tensor& g, const Shape& shape) {
  return ctx.needs_input_grad(input) ? reduce_to(g, shape) : Tensor();
}

void save_shapes(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
  ctx.set("a_shape", a.shape());
  ctx.set("b_shape", b.shape());
}

struct AddFn : Function<AddFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    save_shapes(ctx, a, b);
    return binary<true>(a, b, Add{}, "add");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // da = db = dy
    return {grad_for(ctx, 0, grads[0], ctx.get<Shape>("a_shape")),
            grad_for(ctx, 1, grads[0], ctx.get<Shape>("b_shape"))};
  }
};

struct SubFn : Function<SubFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    save_shapes(ctx, a, b);
    return binary<true>(a, b, Sub{}, "sub");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // da = dy, db = -dy (negated after the sum)
    Tensor db = grad_for(ctx, 1, grads[0], ctx.get<Shape>("b_shape"));
    return {grad_for(ctx, 0, grads[0], ctx.get<Shape>("a_shape")), db.defined() ? neg(db) : db};
  }
};

struct MulFn : Function<MulFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    ctx.save_for_backward({a, b});
    return binary<true>(a, b, Mul{}, "mul");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // da = dy b, db = dy a
    const Tensor &a = ctx.saved()[0], &b = ctx.saved()[1], g = grads[0].to(a.dtype());
    return {ctx.needs_input_grad(0) ? reduce_to(binary(g, b, Mul{}, "mul"), a.shape()) : Tensor(),
            ctx.needs_input_grad(1) ? reduce_to(binary(g, a, Mul{}, "mul"), b.shape()) : Tensor()};
  }
};

struct DivFn : Function<DivFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    ctx.save_for_backward({a, b});
    return binary(a, b, Div{}, "div");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // da = dy / b, db = -dy a / b^2
    const Tensor &a = ctx.saved()[0], &b = ctx.saved()[1], g = grads[0].to(a.dtype());
    Tensor db;
    if (ctx.needs_input_grad(1))
      db = reduce_to(binary(binary(g, a, Mul{}, "div"), b, NegDivBySquare{}, "div"), b.shape());
    return {ctx.needs_input_grad(0) ? reduce_to(binary(g, b, Div{}, "div"), a.shape()) : Tensor(), db};
  }
};

struct MaximumFn : Function<MaximumFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    ctx.save_for_backward({a, b});
    return binary<true>(a, b, Maximum{}, "maximum");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // dy goes to a where a >= b, else to b
    const Tensor &a = ctx.saved()[0], &b = ctx.saved()[1], g = grads[0].to(a.dtype());
    Tensor picks_a = binary(a, b, MaximumPicksA{}, "maximum");  // [out shape], 1 or 0
    return {ctx.needs_input_grad(0) ? reduce_to(binary(g, picks_a, MaskGrad{true}, "maximum"), a.shape()) : Tensor(),
            ctx.needs_input_grad(1) ? reduce_to(binary(g, picks_a, MaskGrad{false}, "maximum"), b.shape()) : Tensor()};
  }
};

// sum_to as an op of its own: x [out shape] -> shape; its backward repeats dy back out.
struct SumToFn : Function<SumToFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Shape& shape) {
    ctx.set("x_shape", x.shape());
    return reduce_to(x, shape);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {broadcast_to(grads[0], ctx.get<Shape>("x_shape"))};
  }
};

}  // namespace

// ---- the differentiable ops: tensor op number (same names: MulFn -> "MulBackward") --------------------

namespace with_scalar {
namespace {

struct AddFn : Function<AddFn> {
  static Tensor forward(FunctionCtx&, const Tensor& x, double s) { return binary_scalar<true>(x, s, Add{}, "add"); }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {grads[0]}; }
};

struct SubFn : Function<SubFn> {
  static Tensor forward(FunctionCtx&, const Tensor& x, double s) { return binary_scalar<true>(x, s, Sub{}, "sub"); }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {grads[0]}; }
};

struct MulFn : Function<MulFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double s) {
    ctx.set("scalar", s);
    return binary_scalar<true>(x, s, Mul{}, "mul");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {binary_scalar(grads[0], ctx.get<double>("scalar"), Mul{}, "mul")};
  }
};

struct DivFn : Function<DivFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double s) {
    ctx.set("scalar", s);
    return binary_scalar(x, s, Div{}, "div");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {binary_scalar(grads[0], ctx.get<double>("scalar"), Div{}, "div")};
  }
};

struct MaximumFn : Function<MaximumFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double s) {
    ctx.save_for_backward({x});
    ctx.set("scalar", s);
    return binary_scalar<true>(x, s, Maximum{}, "maximum");
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // dy where x >= s, else 0
    const Tensor& x = ctx.saved()[0];
    return {binary(grads[0].to(x.dtype()), x, MaximumScalarGrad{ctx.get<double>("scalar")}, "maximum")};
  }
};

}  // namespace
}  // namespace with_scalar

Tensor add(const Tensor& a, const Tensor& b) { return AddFn::apply(a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return SubFn::apply(a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return MulFn::apply(a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return DivFn::apply(a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return MaximumFn::apply(a, b); }
Tensor add(const Tensor& a, double b) { return with_scalar::AddFn::apply(a, b); }
Tensor sub(const Tensor& a, double b) { return with_scalar::SubFn::apply(a, b); }
Tensor mul(const Tensor& a, double b) { return with_scalar::MulFn::apply(a, b); }
Tensor div(const Tensor& a, double b) { return with_scalar::DivFn::apply(a, b); }
Tensor maximum(const Tensor& a, double b) { return with_scalar::MaximumFn::apply(a, b); }

Tensor sum_to(const Tensor& x, const Shape& shape) {
  SL_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to: shape ", shape,
           " cannot be broadcast to the tensor's shape ", x.shape(), ", so the tensor cannot be summed down to it");
  if (x.shape() == shape) return x;
  return SumToFn::apply(x, shape);
}

}  // namespace sl
