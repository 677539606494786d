// flash_attention.cpp — causal_attention, the GPT's attention core, and the tensor-level kernels of
// tensor/attention.h over the per-head loops of tensor/cpu/flash_attention.h.
//
//   causal_attention(q, k, v, p)   q, k, v [B, NH, T, HS] -> dropout_p(causal_softmax(q kᵀ / sqrt(HS))) v
//
//   saves q, k, v, out [B, NH, T, HS] and lse [B, NH, T]: 16·B·NH·T·HS + 4·B·NH·T bytes in f32, where
//   the eager path (q kᵀ, causal_softmax, dropout, · v) keeps three [B, NH, T, T] matrices.
//
// Dropout draws B·NH·T·T counters, as dropout() of the probabilities does, and keeps the same
// elements; the mask is regenerated in backward from (first, key), never stored. On a GPU, and for
// bf16/f16, the op runs that eager composition (same counters, same mask): the blockwise kernel is
// CPU-only so far.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "autograd/function.h"
#include "tensor/attention.h"
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

void check_kernel_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  check_inputs("attention", q, k, v, causal);
  SL_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::f64, "attention: the blockwise kernel runs f32 (or f64 ",
           "for gradcheck), got ", dtype_name(q.dtype()));
  SL_CHECK(!q.device().is_cuda(), "attention: the blockwise kernel runs on the CPU only (q is on ", q.device().str(),
           ")");
}

// body(bh, scratch) for every head bh in [0, heads), on num_threads() threads taking the next head.
template <typename T, typename Body>
void for_each_head(int64_t heads, int64_t scratch_size, Body&& body) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    std::vector<T> scratch(static_cast<size_t>(scratch_size));
    for (int64_t bh = next++; bh < heads; bh = next++) body(bh, scratch.data());
  };
  const int64_t helpers = std::min<int64_t>(num_threads(), heads) - 1;
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < helpers; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& thread : threads) thread.join();
}

// body(bh, scratch) for every head of q [B, NH, Tq, HS] against k [B, NH, Tk, HS], in q's dtype:
// scratch is a float* or a double*.
template <typename Body>
void run_heads(const Tensor& q, const Tensor& k, Body&& body) {
  const int64_t scratch_size = cpu::attention_scratch_size(q.size(2), k.size(2), q.size(3));
  dispatch_floating(q.dtype(), "attention", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      for_each_head<T>(q.size(0) * q.size(1), scratch_size, [&](int64_t bh, T* scratch) { body(bh, scratch); });
  });
}

// Head bh's rows of a [B, NH, T, HS] tensor (or lse [B, NH, T]: HS 1).
template <typename P>
cpu::Rows<P> head_rows(P* data, int64_t bh, int64_t T, int64_t HS) {
  return {data ? data + bh * T * HS : nullptr, HS};
}
template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

cpu::AttentionDropout head_dropout(const AttentionDropoutDraw& draw, int64_t bh, int64_t Tq, int64_t Tk) {
  if (draw.p == 0) return {};
  return {dropout_threshold(draw.p), draw.key, draw.first + static_cast<uint64_t>(bh * Tq * Tk), 1.0 / (1.0 - draw.p)};
}

cpu::AttentionShape shape_of(const Tensor& q, const Tensor& k, bool causal, double scale) {
  return {q.size(2), k.size(2), q.size(3), causal, scale};
}

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                  const AttentionDropoutDraw& dropout) {
  check_kernel_inputs(q, k, v, causal);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2), Tk = k.size(2), HS = q.size(3);
  SL_CHECK(Tk > 0 || Tq == 0, "attention: ", Tq, " queries and no key to attend to");
  AttentionOutput o{Tensor::empty(q.shape(), q.options()), Tensor::empty({B, NH, Tq}, q.options())};
  const cpu::AttentionShape shape = shape_of(q, k, causal, scale);
  run_heads(q, k, [&](int64_t bh, auto* scratch) {
    using T = std::remove_pointer_t<decltype(scratch)>;
    const cpu::HeadForward<T> head{head_rows<const T>(q.data<T>(), bh, Tq, HS),
                                   head_rows<const T>(k.data<T>(), bh, Tk, HS),
                                   head_rows<const T>(v.data<T>(), bh, Tk, HS),
                                   head_rows<T>(o.out.data<T>(), bh, Tq, HS), o.lse.data<T>() + bh * Tq};
    cpu::attention_head_forward(head, shape, head_dropout(dropout, bh, Tq, Tk), scratch);
  });
  return o;
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                        const Tensor& delta, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const AttentionDropoutDraw& dropout) {
  check_kernel_inputs(q, k, v, causal);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2), Tk = k.size(2), HS = q.size(3);
  SL_ASSERT(dout.shape() == q.shape() && lse.numel() == B * NH * Tq && delta.numel() == B * NH * Tq);
  SL_ASSERT((!dq.defined() || dq.shape() == q.shape()) && (!dk.defined() || dk.shape() == k.shape()) &&
            (!dv.defined() || dv.shape() == v.shape()));
  const cpu::AttentionShape shape = shape_of(q, k, causal, scale);
  run_heads(q, k, [&](int64_t bh, auto* scratch) {
    using T = std::remove_pointer_t<decltype(scratch)>;
    const cpu::HeadBackward<T> head{head_rows<const T>(q.data<T>(), bh, Tq, HS),
                                    head_rows<const T>(k.data<T>(), bh, Tk, HS),
                                    head_rows<const T>(v.data<T>(), bh, Tk, HS),
                                    head_rows<const T>(dout.data<T>(), bh, Tq, HS),
                                    lse.data<T>() + bh * Tq,
                                    delta.data<T>() + bh * Tq,
                                    head_rows<T>(data_or_null<T>(dq), bh, Tq, HS),
                                    head_rows<T>(data_or_null<T>(dk), bh, Tk, HS),
                                    head_rows<T>(data_or_null<T>(dv), bh, Tk, HS)};
    cpu::attention_head_backward(head, shape, head_dropout(dropout, bh, Tq, Tk), scratch);
  });
}

Tensor attention_delta(const Tensor& dout, const Tensor& out) { return sum(mul(dout, out), 3); }

namespace {

struct CausalAttentionFn : Function<CausalAttentionFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, double p,
                        Generator* generator) {
    AttentionDropoutDraw draw;
    if (p > 0) {  // the counters of the [B, NH, T, T] probabilities, as dropout() would draw them
      Generator& gen = generator ? *generator : default_generator();
      draw = {p, gen.advance(static_cast<uint64_t>(q.size(0) * q.size(1) * q.size(2) * q.size(2))), gen.seed()};
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    AttentionOutput o = attention_forward(q, k, v, /*causal=*/true, scale, draw);
    ctx.save_for_backward({q, k, v, o.out, o.lse});
    ctx.set("scale", scale);
    ctx.set("dropout", draw);
    return o.out;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& s = ctx.saved();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    Tensor dout = grads[0].defined() ? grads[0] : zeros_like(out);
    Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
    attention_backward(q, k, v, dout, lse, attention_delta(dout, out), true, ctx.get<double>("scale"), dq, dk, dv,
                       ctx.get<AttentionDropoutDraw>("dropout"));
    return {dq, dk, dv};
  }
};

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, bool training,
                        Generator* generator) {
  check_inputs("causal_attention", q, k, v, true);
  SL_CHECK(dropout_p >= 0 && dropout_p < 1, "causal_attention: dropout_p must be in [0, 1) but got ", dropout_p);
  const double p = training ? dropout_p : 0.0;
  if (q.device().is_cuda() || (q.dtype() != DType::f32 && q.dtype() != DType::f64)) {
    // The eager composition, where the blockwise kernel does not run yet (the same dropout counters).
    Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
    return matmul(dropout(att, p, p > 0, generator), v);
  }
  if (q.size(2) == 0) return zeros(q.shape(), q.options());
  return CausalAttentionFn::apply(q, k, v, p, generator);
}

}  // namespace sl
