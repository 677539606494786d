// attention_composed.h — the attention kernels of tensor/attention.h written as compositions of the
// engine's ops (matmul, exp, log, max, sum, masked_fill, where, cat, ...), each of which has a CUDA
// path: what CUDA tensors run, while CPU tensors keep the blockwise kernel and the row loops.
//
//   forward   s = scale · q kᵀ [B, NH, Tq, Tk] (causal: masked_fill -inf above the diagonal)
//             e = exp(s - m), m = max_j s;  lse = m + log Σ_j e;  out = (e · v) / Σ_j e
//   backward  P = exp(s - lse); dV += Pᵀ dO; dP = dO Vᵀ; dS = P ∘ (dP - D); dQ += scale·dS K; dK += scale·dSᵀ Q
//   merge     out -= sigmoid(lse_b - lse) · (out - out_b),  lse -= logsigmoid(lse - lse_b)
//             (where(): a row whose lse_b is -inf keeps its values, one whose lse is -inf takes the block's)
//
// Unlike the blockwise kernel, the forward and backward hold the block's [Tq, Tk] scores (a ring
// block is T/cp × T/cp, not the T×T of the whole sequence). Every function here also runs on CPU
// tensors, which is how tests/tensor/test_attention_composed.cpp checks them against the CPU kernels
// without a GPU. No autograd (callers run under NoGradGuard or inside a Function); f32 or f64; scale > 0.
#pragma once
#include "tensor/attention.h"

namespace sl::composed {

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                        const Tensor& delta, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv);
void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t row_begin);
void set_rows(const Tensor& dst, const Tensor& src, int64_t begin);
void add_rows(const Tensor& dst, const Tensor& src, int64_t begin);

}  // namespace sl::composed
