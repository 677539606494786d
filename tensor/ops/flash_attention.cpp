// flash_attention.cpp — causal_attention, the GPT's attention core, and the tensor-level kernels of
// tensor/attention.h over the per-head loops of tensor/cpu/flash_attention.h.
//
//   causal_attention(q, k, v, p)   q, k, v [B, NH, T, HS] -> dropout_p(causal_softmax(q kᵀ / sqrt(HS))) v
//
//   saves q, k, v, out [B, NH, T, HS] and lse [B, NH, T]: 16·B·NH·T·HS + 4·B·NH·T bytes in f32, where
//   the eager path (q kᵀ, causal_softmax, dropout, · v) keeps three [B, NH, T, T] matrices.
//   bf16/f16 (mixed precision): q, k, v and out in 16 bits, lse in f32: 8·B·NH·T·HS + 4·B·NH·T bytes.
//   The kernel computes in f32 and rounds out (and dq, dk, dv) once to 16 bits: the mixed-precision
//   rule of every op, where the eager composition rounds the scores and probabilities too.
//
// Dropout draws B·NH·T·T counters, as dropout() of the probabilities does, and keeps the same
// elements; the mask is regenerated in backward from (first, key), never stored. On a GPU the op runs
// that eager composition (same counters, same mask): the blockwise kernel is CPU-only so far.
#include <cmath>
#include <type_traits>

#include "autograd/function.h"
#include "tensor/attention.h"
#include "tensor/attention_composed.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/flash_attention.h"
#include "tensor/ops.h"

namespace sl {

namespace {

void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  SL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": q, k, v must be [B, NH, T, HS], got ", q.shape(),
           ", ", k.shape(), ", ", v.shape());
  SL_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
           ": q ", q.shape(), " does not fit k ", k.shape(), " and v ", v.shape());
  SL_CHECK(!causal || q.size(2) == k.size(2), op, ": causal attention needs as many queries as keys (Tq ", q.size(2),
           " != Tk ", k.size(2), ")");
  SL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, ": q, k, v must share a dtype, got ",
           dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
}

// CPU: the blockwise kernel; CUDA: the same math as engine ops (attention_composed.h), without dropout.
void check_kernel_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         const AttentionDropoutDraw& dropout) {
  check_inputs("attention", q, k, v, causal);
  SL_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::f64 || is_16bit(q.dtype()), "attention: the kernels run ",
           "f32, bf16 or f16 (or f64 for gradcheck), got ", dtype_name(q.dtype()));
  SL_CHECK(!q.device().is_cuda() || dropout.p == 0, "attention: dropout ", dropout.p,
           " inside the kernels runs on the CPU only (q is on ", q.device().str(), ")");
}

// f(T{}) for the tensor-level kernels' types, float and double (the callers have checked the dtype).
template <typename F>
void with_kernel_type(DType dtype, F&& f) {
  dispatch_floating(dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) f(tag);
  });
}

cpu::AttentionDropout kernel_dropout(const AttentionDropoutDraw& draw) {
  if (draw.p == 0) return {};
  return {dropout_threshold(draw.p), draw.key, draw.first, 1.0 / (1.0 - draw.p)};
}

// [B, NH, T, HS] tensors: head (b, h) is the block of T rows at (b·NH + h)·T·HS.
cpu::HeadLayout split_heads(const Tensor& x) { return {x.size(1) * x.size(2) * x.size(3), x.size(2) * x.size(3), x.size(3), 0}; }

cpu::AttentionHeads split_layout(const Tensor& q, const Tensor& k) {
  return {q.size(0), q.size(1), split_heads(q), split_heads(k), split_heads(k), split_heads(q)};
}

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// The dtype of lse: the kernel's compute type (f32 for bf16 and f16, f64 for gradcheck).
DType lse_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                  const AttentionDropoutDraw& dropout) {
  check_kernel_inputs(q, k, v, causal, dropout);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2), Tk = k.size(2);
  SL_CHECK(Tk > 0 || Tq == 0, "attention: ", Tq, " queries and no key to attend to");
  if (is_16bit(q.dtype())) {  // out and lse in f32: this block merges with others before one rounding
    if (q.device().is_cuda())  // the engine ops compute f32: this block's rows widened, never the sequence
      return composed::attention_forward(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), causal, scale);
    const TensorOptions wide = q.options().with_dtype(DType::f32);
    AttentionOutput o{Tensor::empty(q.shape(), wide), Tensor::empty({B, NH, Tq}, wide)};
    dispatch_floating(q.dtype(), "attention", [&](auto tag) {
      using S = decltype(tag);
      if constexpr (!std::is_same_v<S, compute_t<S>>)
        cpu::attention_forward_heads_wide<S>(split_layout(q, k), {Tq, Tk, q.size(3), causal, scale},
                                             kernel_dropout(dropout), q.data<S>(), k.data<S>(), v.data<S>(),
                                             o.out.data<float>(), o.lse.data<float>());
    });
    return o;
  }
  if (q.device().is_cuda()) return composed::attention_forward(q, k, v, causal, scale);
  AttentionOutput o{Tensor::empty(q.shape(), q.options()), Tensor::empty({B, NH, Tq}, q.options())};
  with_kernel_type(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_forward_heads<T>(split_layout(q, k), {Tq, Tk, q.size(3), causal, scale}, kernel_dropout(dropout),
                                    q.data<T>(), k.data<T>(), v.data<T>(), o.out.data<T>(), o.lse.data<T>());
  });
  return o;
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                        const Tensor& delta, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const AttentionDropoutDraw& dropout) {
  check_kernel_inputs(q, k, v, causal, dropout);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2);
  SL_ASSERT(dout.shape() == q.shape() && lse.numel() == B * NH * Tq && delta.numel() == B * NH * Tq);
  SL_ASSERT((!dq.defined() || dq.shape() == q.shape()) && (!dk.defined() || dk.shape() == k.shape()) &&
            (!dv.defined() || dv.shape() == v.shape()));
  if (is_16bit(q.dtype())) {  // dout in q's dtype; lse, delta and the accumulators dq, dk, dv in f32
    for (const Tensor* t : {&lse, &delta, &dq, &dk, &dv})
      SL_CHECK(!t->defined() || t->dtype() == DType::f32, "attention: with ", dtype_name(q.dtype()),
               " q, k, v, lse, delta and the gradients dq, dk, dv are f32, got ", dtype_name(t->dtype()));
    if (q.device().is_cuda()) {
      const auto wide = [](const Tensor& t) { return t.to(DType::f32); };
      return composed::attention_backward(wide(q), wide(k), wide(v), wide(dout), lse, delta, causal, scale, dq, dk,
                                          dv);
    }
    dispatch_floating(q.dtype(), "attention", [&](auto tag) {
      using S = decltype(tag);
      if constexpr (!std::is_same_v<S, compute_t<S>>)
        cpu::attention_backward_heads_wide<S>(split_layout(q, k), {Tq, k.size(2), q.size(3), causal, scale},
                                              kernel_dropout(dropout), q.data<S>(), k.data<S>(), v.data<S>(),
                                              dout.data<S>(), lse.data<float>(), delta.data<float>(),
                                              data_or_null<float>(dq), data_or_null<float>(dk),
                                              data_or_null<float>(dv));
    });
    return;
  }
  if (q.device().is_cuda()) return composed::attention_backward(q, k, v, dout, lse, delta, causal, scale, dq, dk, dv);
  with_kernel_type(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_backward_heads<T>(split_layout(q, k), {Tq, k.size(2), q.size(3), causal, scale},
                                     kernel_dropout(dropout), q.data<T>(), k.data<T>(), v.data<T>(), nullptr,
                                     dout.data<T>(), lse.data<T>(), delta.data<T>(), data_or_null<T>(dq),
                                     data_or_null<T>(dk), data_or_null<T>(dv));
  });
}

Tensor attention_delta(const Tensor& dout, const Tensor& out) {
  if (is_16bit(dout.dtype()) || is_16bit(out.dtype()))  // products and their sum in f32, as the kernels do
    return sum(mul(dout.to(DType::f32), out.to(DType::f32)), 3);
  return sum(mul(dout, out), 3);
}

namespace {

// One causal attention: the heads and where they lie, the shape, the dropout draw. What a forward
// computes by and its backward needs again.
struct CausalAttention {
  cpu::AttentionHeads heads;
  cpu::AttentionShape shape;
  AttentionDropoutDraw dropout;

  // Draws the [B, NH, T, T] probabilities' counters, as dropout() would, when p > 0.
  CausalAttention(const cpu::AttentionHeads& layout, int64_t T, int64_t HS, double p, Generator* generator)
      : heads(layout), shape{T, T, HS, true, 1.0 / std::sqrt(static_cast<double>(HS))} {
    if (p == 0) return;
    Generator& gen = generator ? *generator : default_generator();
    dropout = {p, gen.advance(static_cast<uint64_t>(heads.B * heads.NH * T * T)), gen.seed()};
  }
  // q, k, v (all three may be one packed tensor; f32, f64, bf16 or f16) -> out, lse (lse_dtype).
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) const {
    dispatch_floating(q.dtype(), "causal_attention", [&](auto tag) {
      using T = decltype(tag);
      cpu::attention_forward_heads<T>(heads, shape, kernel_dropout(dropout), q.data<T>(), k.data<T>(), v.data<T>(),
                                      out.data<T>(), lse.data<compute_t<T>>());
    });
  }
  // Adds into dq, dk, dv (zeros; one tensor when packed). D = rowsum(dO ∘ O) is taken per head.
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) const {
    dispatch_floating(q.dtype(), "causal_attention", [&](auto tag) {
      using T = decltype(tag);
      cpu::attention_backward_heads<T>(heads, shape, kernel_dropout(dropout), q.data<T>(), k.data<T>(), v.data<T>(),
                                       out.data<T>(), dout.data<T>(), lse.data<compute_t<T>>(), nullptr, dq.data<T>(),
                                       dk.data<T>(), dv.data<T>());
    });
  }
};

// q, k, v [B, NH, T, HS] -> out [B, NH, T, HS].
struct CausalAttentionFn : Function<CausalAttentionFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, double p,
                        Generator* generator) {
    const CausalAttention attention(split_layout(q, k), q.size(2), q.size(3), p, generator);
    Tensor out = Tensor::empty(q.shape(), q.options());
    Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, q.options().with_dtype(lse_dtype(q.dtype())));
    attention.forward(q, k, v, out, lse);
    ctx.save_for_backward({q, k, v, out, lse});
    ctx.set("attention", attention);
    return out;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& s = ctx.saved();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    Tensor dout = grads[0].defined() ? grads[0] : zeros_like(out);
    Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
    ctx.get<CausalAttention>("attention").backward(q, k, v, out, dout, lse, dq, dk, dv);
    return {dq, dk, dv};
  }
};

// c_attn's output [B, T, 3W] (q | k | v, head h at columns h·HS of each third, W = NH·HS) -> y [B, T, W].
cpu::AttentionHeads packed_layout(int64_t B, int64_t T, int64_t NH, int64_t HS) {
  const int64_t W = NH * HS;
  const cpu::HeadLayout q{T * 3 * W, HS, 3 * W, 0}, k{T * 3 * W, HS, 3 * W, W}, v{T * 3 * W, HS, 3 * W, 2 * W};
  return {B, NH, q, k, v, {T * W, HS, W, 0}};
}

struct PackedCausalAttentionFn : Function<PackedCausalAttentionFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& qkv, int64_t NH, double p, Generator* generator) {
    const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2) / 3;
    const CausalAttention attention(packed_layout(B, T, NH, W / NH), T, W / NH, p, generator);
    Tensor y = Tensor::empty({B, T, W}, qkv.options());
    Tensor lse = Tensor::empty({B, NH, T}, qkv.options().with_dtype(lse_dtype(qkv.dtype())));
    attention.forward(qkv, qkv, qkv, y, lse);
    ctx.save_for_backward({qkv, y, lse});
    ctx.set("attention", attention);
    return y;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& s = ctx.saved();
    const Tensor &qkv = s[0], &y = s[1], &lse = s[2];
    Tensor dy = grads[0].defined() ? grads[0] : zeros_like(y);
    Tensor dqkv = zeros_like(qkv);  // dq | dk | dv, as qkv
    ctx.get<CausalAttention>("attention").backward(qkv, qkv, qkv, y, dy, lse, dqkv, dqkv, dqkv);
    return {dqkv};
  }
};

bool runs_blockwise(const Tensor& x) { return !x.device().is_cuda() && is_floating(x.dtype()); }

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, bool training,
                        Generator* generator) {
  check_inputs("causal_attention", q, k, v, true);
  SL_CHECK(dropout_p >= 0 && dropout_p < 1, "causal_attention: dropout_p must be in [0, 1) but got ", dropout_p);
  const double p = training ? dropout_p : 0.0;
  if (!runs_blockwise(q)) {
    // The eager composition on a GPU, where the blockwise kernel does not run yet (the same dropout counters).
    Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
    return matmul(dropout(att, p, p > 0, generator), v);
  }
  if (q.size(2) == 0) return zeros(q.shape(), q.options());
  return CausalAttentionFn::apply(q, k, v, p, generator);
}

Tensor causal_attention_packed(const Tensor& qkv, int64_t n_head, double dropout_p, bool training,
                               Generator* generator) {
  SL_CHECK(qkv.dim() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0, "causal_attention_packed: qkv must be ",
           "[B, T, 3 x n_head x HS], got ", qkv.shape(), " for n_head ", n_head);
  SL_CHECK(dropout_p >= 0 && dropout_p < 1, "causal_attention_packed: dropout_p must be in [0, 1) but got ",
           dropout_p);
  const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2) / 3;
  if (!runs_blockwise(qkv) || T == 0) {  // split into heads, and causal_attention's own path
    TensorList parts = split(qkv, W, 2);  // 3 x [B, T, W]
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, n_head, W / n_head}).transpose(1, 2); };
    Tensor y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), dropout_p, training, generator);
    return y.transpose(1, 2).reshape({B, T, W});
  }
  return PackedCausalAttentionFn::apply(qkv, n_head, training ? dropout_p : 0.0, generator);
}

}  // namespace sl
