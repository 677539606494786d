// attention_block.cpp — see attention_block.h. A block's forward and backward are the engine's
// attention kernels (tensor/attention.h: the GPT's own blockwise kernel on the CPU, engine ops on
// CUDA); this file adds the masks, the scale and the autograd Function.
#include "parallel/context_parallel/attention_block.h"

#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "tensor/attention.h"
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

// f32 or f64 for the autograd Function; the kernels also take bf16 and f16 (`sixteen_bit`).
void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask, bool sixteen_bit = false) {
  SL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention_block: q, k, v must be [B, NH, T, HS], got ",
           q.shape(), ", ", k.shape(), ", ", v.shape());
  SL_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
           "attention_block: q ", q.shape(), " does not fit k ", k.shape(), " and v ", v.shape());
  SL_CHECK(mask != BlockMask::causal || q.size(2) == k.size(2), "attention_block: a causal block must be square (Tq ",
           q.size(2), " != Tk ", k.size(2), ")");
  const bool kernel_dtype = q.dtype() == DType::f32 || q.dtype() == DType::f64 || (sixteen_bit && is_16bit(q.dtype()));
  SL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && kernel_dtype, "attention_block: q, k, v must all be ",
           sixteen_bit ? "f32, bf16 or f16" : "f32", " (or f64 for gradcheck), got ", dtype_name(q.dtype()), ", ",
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
  check_inputs(q, k, v, mask, true);
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2);
  const TensorOptions result = is_16bit(q.dtype()) ? q.options().with_dtype(DType::f32) : q.options();
  if (mask == BlockMask::skip)
    return {zeros(q.shape(), result), full({B, NH, Tq}, -std::numeric_limits<double>::infinity(), result)};
  AttentionOutput o = attention_forward(q, k, v, mask == BlockMask::causal, attention_scale(q, scale));
  return {o.out, o.lse};
}

void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                              const Tensor& lse, const Tensor& delta, BlockMask mask, double scale, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv) {
  check_inputs(q, k, v, mask, true);
  if (mask == BlockMask::skip) return;
  attention_backward(q, k, v, dout, lse, delta, mask == BlockMask::causal, attention_scale(q, scale), dq, dk, dv);
}

BlockOutput attention_block(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask, double scale) {
  check_inputs(q, k, v, mask);
  TensorList o = AttentionBlockFn::apply(q, k, v, mask, scale);
  return {o[0], o[1]};
}

}  // namespace sl::parallel
