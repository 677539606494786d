// attention_block.cpp — see attention_block.h. On the CPU a block's forward and backward are the
// engine's blockwise kernels (tensor/attention.h, the GPT's own attention) and the merge is the row
// loop below; CUDA tensors take the compositions of engine ops in attention_block_composed.cpp.
#include "parallel/context_parallel/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "parallel/context_parallel/attention_block_composed.h"
#include "tensor/attention.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace sl::parallel {

const char* block_mask_name(BlockMask mask) {
  switch (mask) {
    case BlockMask::none: return "none";
    case BlockMask::causal: return "causal";
    case BlockMask::skip: return "skip";
  }
  return "?";
}

double attention_scale(const Tensor& q, double scale) {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

namespace {

// Stable for any x: only ever exp of a non-positive number.
template <typename C>
C log_sigmoid(C x) { return std::min(x, C(0)) - std::log1p(std::exp(-std::abs(x))); }
template <typename C>
C sigmoid_of(C x) {
  if (x >= 0) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask) {
  SL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention_block: q, k, v must be [B, NH, T, HS], got ",
           q.shape(), ", ", k.shape(), ", ", v.shape());
  SL_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
           "attention_block: q ", q.shape(), " does not fit k ", k.shape(), " and v ", v.shape());
  SL_CHECK(mask != BlockMask::causal || q.size(2) == k.size(2), "attention_block: a causal block must be square (Tq ",
           q.size(2), " != Tk ", k.size(2), ")");
  SL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::f32 || q.dtype() == DType::f64),
           "attention_block: q, k, v must all be f32 (or f64 for gradcheck), got ", dtype_name(q.dtype()), ", ",
           dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  SL_CHECK(q.device() == k.device() && q.device() == v.device(), "attention_block: q, k, v must be on one device, got ",
           q.device().str(), ", ", k.device().str(), ", ", v.device().str());
}

struct AttentionBlockFn : Function<AttentionBlockFn> {
  static TensorList forward(FunctionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask,
                            double scale) {
    BlockOutput o = attention_block_forward(q, k, v, mask, scale);
    ctx.save_for_backward({q, k, v, o.out, o.lse});
    ctx.set("mask", mask);
    ctx.set("scale", scale);
    return {o.out, o.lse};
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& s = ctx.saved();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
    const auto mask = ctx.get<BlockMask>("mask");
    if (mask == BlockMask::skip) return {dq, dk, dv};
    Tensor dout = grads[0].defined() ? grads[0] : zeros_like(out);
    // lse depends on s through dlse/ds = P, so its gradient joins dP's row term: D - dlse.
    Tensor delta = attention_delta(dout, out);
    if (grads[1].defined()) delta = sub(delta, grads[1]);
    attention_block_backward(q, k, v, dout, lse, delta, mask, ctx.get<double>("scale"), dq, dk, dv);
    return {dq, dk, dv};
  }
};

}  // namespace

BlockOutput attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask,
                                    double scale) {
  check_inputs(q, k, v, mask);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2);
  if (mask == BlockMask::skip)
    return {zeros(q.shape(), q.options()), full({B, NH, Tq}, -std::numeric_limits<double>::infinity(), q.options())};
  if (q.device().is_cuda()) return composed::attention_block_forward(q, k, v, mask, attention_scale(q, scale));
  AttentionOutput o = attention_forward(q, k, v, mask == BlockMask::causal, attention_scale(q, scale));
  return {o.out, o.lse};
}

void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                     int64_t row_begin) {
  const int64_t BH = out.size(0) * out.size(1), T = out.size(2), HS = out.size(3), Tb = out_b.size(2);
  SL_ASSERT(out_b.size(0) * out_b.size(1) == BH && out_b.size(3) == HS && row_begin + Tb <= T);
  SL_ASSERT(lse.numel() == BH * T && lse_b.numel() == BH * Tb && out.dtype() == out_b.dtype());
  if (out.device().is_cuda()) return composed::merge_attention(out, lse, out_b, lse_b, row_begin);
  dispatch_floating(out.dtype(), "merge_attention", [&](auto tag) {
    using C = decltype(tag);
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
      C *o = out.data<C>(), *l = lse.data<C>();
      const C *ob = out_b.data<C>(), *lb = lse_b.data<C>();
      for (int64_t bh = 0; bh < BH; ++bh)
        for (int64_t i = 0; i < Tb; ++i) {
          const int64_t row = bh * T + row_begin + i, row_b = bh * Tb + i;
          const C la = l[row], lbv = lb[row_b], minus_inf = -std::numeric_limits<C>::infinity();
          if (lbv == minus_inf) continue;  // a row that saw no key of the block: nothing to add
          if (la == minus_inf) {           // a row that saw no key yet: the block is all it has
            // (the formulas would give lse -inf - logsigmoid(-inf) = nan, and read the row's out)
            std::copy(ob + row_b * HS, ob + (row_b + 1) * HS, o + row * HS);
            l[row] = lbv;
            continue;
          }
          const C w = sigmoid_of(lbv - la);  // the block's weight, e^λb / e^λ'
          for (int64_t d = 0; d < HS; ++d) o[row * HS + d] -= w * (o[row * HS + d] - ob[row_b * HS + d]);
          l[row] = la - log_sigmoid(la - lbv);
        }
    }
  });
}

void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                              const Tensor& lse, const Tensor& delta, BlockMask mask, double scale, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv) {
  check_inputs(q, k, v, mask);
  if (mask == BlockMask::skip) return;
  if (q.device().is_cuda())
    return composed::attention_block_backward(q, k, v, dout, lse, delta, mask, attention_scale(q, scale), dq, dk, dv);
  attention_backward(q, k, v, dout, lse, delta, mask == BlockMask::causal, attention_scale(q, scale), dq, dk, dv);
}

BlockOutput attention_block(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask, double scale) {
  check_inputs(q, k, v, mask);
  TensorList o = AttentionBlockFn::apply(q, k, v, mask, scale);
  return {o[0], o[1]};
}

}  // namespace sl::parallel
