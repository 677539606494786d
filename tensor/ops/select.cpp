// select.cpp — masks, selection and dropout: masked_fill, causal_mask, where, dropout.
//
//   masked_fill(x, mask, v)   out = mask != 0 ? v : x        dx = mask != 0 ? 0 : g     (mask broadcasts to x)
//   where(cond, a, b)         out = cond != 0 ? a : b        da = sum_to(cond ? g : 0), db = sum_to(cond ? 0 : g)
//   dropout(x, p)             out = keep ? x / (1 - p) : 0   dx = keep ? g / (1 - p) : 0
//   causal_mask(T)            [T, T] i32, 1 where column > row (the future a position must not see)
//
// A mask or condition may have any dtype; "set" means non-zero. It never gets a gradient. Operands
// of different shapes are walked together row by row (tensor/cpu/broadcast.h).
//
// Dropout's mask comes from the Philox stream: element i of the draw is kept iff the 32-bit word
// philox4x32(first + i, seed)[0] >= p * 2^32, an integer comparison, so a CUDA kernel reading the
// same counters draws exactly the same mask. The generator advances by numel per training call.
#include <cmath>

#include "autograd/function.h"
#include "tensor/cpu/broadcast.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace sl {

namespace {

template <typename M>
bool is_set(M value) {
  return static_cast<compute_t<M>>(value) != compute_t<M>(0);
}

// The dtype broadcast gradients are summed in before rounding to the operand's dtype.
DType accumulate_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// ---- masked_fill ---------------------------------------------------------------------------------------

// out [...] from x [...] and mask (broadcast to x); with `value` null, the backward: zero where set.
template <typename T, typename M>
void masked_select_kernel(const T* x, const M* mask, T* out, const cpu::BroadcastWalk<2>& walk, const T* value) {
  walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
    const T* x_row = x + at[0];
    const M* mask_row = mask + at[1];
    T* out_row = out + at[0];
    const T fill = value ? *value : static_cast<T>(compute_t<T>(0));
    for (int64_t i = 0; i < length; ++i) out_row[i] = is_set(mask_row[i * step[1]]) ? fill : x_row[i];
  });
}

struct MaskedFillFn : Function<MaskedFillFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Tensor& mask, double value) {
    Tensor out = Tensor::empty(x.shape(), x.options());
    ctx.save_for_backward({mask});
    ctx.set("dtype", x.dtype());
    if (x.device().is_cuda()) {
      cuda::masked_fill(x, mask, true, value, out);
      return out;
    }
    cpu::BroadcastWalk<2> walk(x.shape(), {x.shape(), mask.shape()});
    dispatch_all(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T fill = static_cast<T>(static_cast<compute_t<T>>(value));
      dispatch_all(mask.dtype(), [&](auto mask_tag) {
        using M = decltype(mask_tag);
        masked_select_kernel(x.data<T>(), mask.data<M>(), out.data<T>(), walk, &fill);
      });
    });
    return out;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& mask = ctx.saved()[0];
    Tensor g = grads[0].to(ctx.get<DType>("dtype"));
    Tensor dx = Tensor::empty(g.shape(), g.options());
    if (g.device().is_cuda()) {
      cuda::masked_fill(g, mask, false, 0.0, dx);
      return {dx, Tensor()};
    }
    cpu::BroadcastWalk<2> walk(g.shape(), {g.shape(), mask.shape()});
    dispatch_floating(g.dtype(), "masked_fill", [&](auto tag) {
      using T = decltype(tag);
      dispatch_all(mask.dtype(), [&](auto mask_tag) {
        using M = decltype(mask_tag);
        masked_select_kernel(g.data<T>(), mask.data<M>(), dx.data<T>(), walk, static_cast<const T*>(nullptr));
      });
    });
    return {dx, Tensor()};
  }
};

// ---- where ---------------------------------------------------------------------------------------------

struct WhereFn : Function<WhereFn> {
  // On a GPU: g routed by the condition (zeros elsewhere), then summed down to each operand's shape.
  static TensorList backward_on_gpu(FunctionCtx& ctx, const Tensor& condition, const Tensor& g, const Shape& a_shape,
                                    const Shape& b_shape) {
    const Tensor zero = zeros(Shape{}, g.options());
    auto routed = [&](const Tensor& if_set, const Tensor& if_clear, const Shape& shape) {
      Tensor full = Tensor::empty(g.shape(), g.options());
      cuda::where(condition, if_set, if_clear, full);
      return sum_to(full, shape);
    };
    return {Tensor(), ctx.needs_input_grad(1) ? routed(g, zero, a_shape) : Tensor(),
            ctx.needs_input_grad(2) ? routed(zero, g, b_shape) : Tensor()};
  }

  static Tensor forward(FunctionCtx& ctx, const Tensor& condition, const Tensor& a, const Tensor& b) {
    Shape out_shape = broadcast_shapes(broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
    Tensor out = Tensor::empty(out_shape, a.options());
    ctx.save_for_backward({condition});
    ctx.set("a_shape", a.shape());
    ctx.set("b_shape", b.shape());
    if (a.device().is_cuda()) {
      cuda::where(condition, a, b, out);
      return out;
    }
    cpu::BroadcastWalk<4> walk(out_shape, {out_shape, condition.shape(), a.shape(), b.shape()});
    dispatch_all(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_all(condition.dtype(), [&](auto condition_tag) {
        using M = decltype(condition_tag);
        const M* c = condition.data<M>();
        const T *pa = a.data<T>(), *pb = b.data<T>();
        T* o = out.data<T>();
        walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
          for (int64_t i = 0; i < length; ++i)
            o[at[0] + i] = is_set(c[at[1] + i * step[1]]) ? pa[at[2] + i * step[2]] : pb[at[3] + i * step[3]];
        });
      });
    });
    return out;
  }

  // One pass over g sends each element to a's or b's gradient, summing where they were broadcast.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& condition = ctx.saved()[0];
    const Tensor& g = grads[0];
    const Shape& a_shape = ctx.get<Shape>("a_shape");
    const Shape& b_shape = ctx.get<Shape>("b_shape");
    if (g.device().is_cuda()) return backward_on_gpu(ctx, condition, g, a_shape, b_shape);
    TensorOptions sum_options = g.options().with_dtype(accumulate_dtype(g.dtype()));
    Tensor da = ctx.needs_input_grad(1) ? zeros(a_shape, sum_options) : Tensor();
    Tensor db = ctx.needs_input_grad(2) ? zeros(b_shape, sum_options) : Tensor();
    cpu::BroadcastWalk<4> walk(g.shape(), {g.shape(), condition.shape(), a_shape, b_shape});
    dispatch_floating(g.dtype(), "where", [&](auto tag) {
      using T = decltype(tag);
      using Compute = compute_t<T>;
      Compute* ga = da.defined() ? da.data<Compute>() : nullptr;
      Compute* gb = db.defined() ? db.data<Compute>() : nullptr;
      const T* gp = g.data<T>();
      dispatch_all(condition.dtype(), [&](auto condition_tag) {
        using M = decltype(condition_tag);
        const M* c = condition.data<M>();
        walk.for_each_row([&](const auto& at, int64_t length, const auto& step) {
          for (int64_t i = 0; i < length; ++i) {
            Compute* target = is_set(c[at[1] + i * step[1]]) ? (ga ? ga + at[2] + i * step[2] : nullptr)
                                                             : (gb ? gb + at[3] + i * step[3] : nullptr);
            if (target) *target += static_cast<Compute>(gp[at[0] + i]);
          }
        });
      });
    });
    return {Tensor(), da.defined() ? da.to(g.dtype()) : da, db.defined() ? db.to(g.dtype()) : db};
  }
};

// ---- dropout -------------------------------------------------------------------------------------------

// Saves the mask as 0/1 in x's dtype; the scale is applied in both directions from the exact p.
struct DropoutFn : Function<DropoutFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, double p, Generator* generator) {
    Generator& gen = generator ? *generator : default_generator();
    const uint64_t first = gen.advance(static_cast<uint64_t>(x.numel()));
    const uint64_t key = gen.seed();
    const uint64_t threshold = dropout_threshold(p);
    Tensor out = Tensor::empty(x.shape(), x.options());
    Tensor mask = Tensor::empty(x.shape(), x.options());
    ctx.save_for_backward({mask});
    ctx.set("p", p);
    if (x.device().is_cuda()) {  // the same counters, so the same mask, as the loop below
      cuda::dropout(x, first, key, threshold, 1.0 / (1.0 - p), out, mask);
      return out;
    }
    dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
      using T = decltype(tag);
      using Compute = compute_t<T>;
      const Compute scale = static_cast<Compute>(1.0 / (1.0 - p));
      const T* xp = x.data<T>();
      T* o = out.data<T>();
      T* m = mask.data<T>();
      for (int64_t i = 0, n = x.numel(); i < n; ++i) {
        bool keep = dropout_keeps(first + static_cast<uint64_t>(i), key, threshold);
        m[i] = static_cast<T>(keep ? Compute(1) : Compute(0));
        o[i] = static_cast<T>(keep ? static_cast<Compute>(xp[i]) * scale : Compute(0));
      }
    });
    return out;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& mask = ctx.saved()[0];
    Tensor g = grads[0].to(mask.dtype());
    Tensor dx = Tensor::empty(mask.shape(), mask.options());
    if (g.device().is_cuda()) {  // dx = g * mask / (1 - p)
      cuda::binary(ElementwiseOp::mul, 0.0, g, mask, dx);
      cuda::scale(dx, 1.0 / (1.0 - ctx.get<double>("p")));
      return {dx};
    }
    dispatch_floating(mask.dtype(), "dropout", [&](auto tag) {
      using T = decltype(tag);
      using Compute = compute_t<T>;
      const Compute scale = static_cast<Compute>(1.0 / (1.0 - ctx.get<double>("p")));
      const T* gp = g.data<T>();
      const T* m = mask.data<T>();
      T* d = dx.data<T>();
      for (int64_t i = 0, n = mask.numel(); i < n; ++i)
        d[i] = static_cast<T>(static_cast<Compute>(gp[i]) * static_cast<Compute>(m[i]) * scale);
    });
    return {dx};
  }
};

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  SL_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), "masked_fill: a mask of shape ",
           mask.shape(), " cannot be broadcast to x's shape ", x.shape());
  SL_CHECK(mask.device() == x.device(), "masked_fill: x is on ", x.device(), " but the mask is on ", mask.device());
  return MaskedFillFn::apply(x, mask, value);
}

Tensor causal_mask(int64_t T, Device device) {
  SL_CHECK(T >= 0, "causal_mask: T must be >= 0 but got ", T);
  // Built on the host and copied to a GPU when asked for one: made once per sequence length.
  Tensor mask = Tensor::empty(Shape{T, T}, TensorOptions{DType::i32, device.is_cpu() ? device : Device::cpu(), false});
  int32_t* m = mask.data<int32_t>();
  for (int64_t row = 0; row < T; ++row)
    for (int64_t column = 0; column < T; ++column) m[row * T + column] = column > row ? 1 : 0;
  return mask.to(device);
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  SL_CHECK(a.dtype() == b.dtype(), "where: a and b must share a dtype (got ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()), ")");
  SL_CHECK(a.device() == b.device() && condition.device() == a.device(),
           "where: condition, a and b must be on one "
           "device (got ",
           condition.device(), ", ", a.device(), ", ", b.device(), ")");
  return WhereFn::apply(condition, a, b);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  SL_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1) but got ", p);
  // Evaluation (or p = 0) is the identity and draws no random numbers.
  if (!training || p == 0) return x;
  SL_CHECK(is_floating(x.dtype()), "dropout: expected a floating tensor (f32, f64, bf16, f16) but got ",
           dtype_name(x.dtype()));
  return DropoutFn::apply(x, p, generator);
}

}  // namespace sl
