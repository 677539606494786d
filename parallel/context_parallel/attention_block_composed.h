// attention_block_composed.h — the block ops of attention_block.h written as compositions of the
// engine's ops (matmul, exp, log, max, sum, masked_fill, where, cat, ...), each of which runs on CUDA:
// the path CUDA tensors take, while CPU tensors keep the blockwise kernels and row loops.
//
//   forward   s = scale · q kᵀ [B, NH, Tq, Tk] (causal: masked_fill -inf above the diagonal)
//             e = exp(s - m), m = max_j s;  lse = m + log Σ_j e;  out = (e · v) / Σ_j e
//   backward  P = exp(s - lse); dV += Pᵀ dO; dP = dO Vᵀ; dS = P ∘ (dP - D); dQ += scale·dS K; dK += scale·dSᵀ Q
//   merge     out -= sigmoid(lse_b - lse) · (out - out_b),  lse -= logsigmoid(lse - lse_b)
//             (where(): a row whose lse_b is -inf keeps its values, one whose lse is -inf takes the block's)
//
// Unlike the blockwise kernel, the forward and backward hold the block's [Tq, Tk] scores (a ring
// block is T/cp × T/cp, not the T×T of the whole sequence). Every function here also runs on CPU
// tensors, which is how tests/parallel/context_parallel/test_chapter_ops_cuda.cpp checks them against the kernels without a
// GPU. Internal to parallel/context_parallel: no autograd (callers run under NoGradGuard or inside a
// Function), f32 or f64.
#pragma once
#include "parallel/context_parallel/attention_block.h"

namespace sl::parallel {

namespace composed {

// As attention_block_forward / attention_block_backward / merge_attention; scale > 0.
BlockOutput attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask, double scale);
void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                              const Tensor& delta, BlockMask mask, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv);
void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t row_begin);
// As set_rows / add_rows below.
void set_rows(const Tensor& dst, const Tensor& src, int64_t begin);
void add_rows(const Tensor& dst, const Tensor& src, int64_t begin);

}  // namespace composed

// dst [B, NH, T, ...] rows [begin, begin + Tb) = src [B, NH, Tb, ...], in place (sequence_shard.cpp:
// a row loop on the CPU, composed:: on CUDA).
void set_rows(const Tensor& dst, const Tensor& src, int64_t begin);
// dst [B, NH, T, HS] rows [begin, begin + Tb) += src [B, NH, Tb, HS], in place.
void add_rows(const Tensor& dst, const Tensor& src, int64_t begin);

}  // namespace sl::parallel
