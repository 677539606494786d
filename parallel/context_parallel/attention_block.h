// attention_block.h — attention of one query block against one key/value block, and the rule that
// merges blocks: the building brick of ring attention (Liu et al., 2023) and of FlashAttention.
//
//   q [B, NH, Tq, HS], k, v [B, NH, Tk, HS]   ──►   out [B, NH, Tq, HS],  lse [B, NH, Tq]
//
//     s[i, j] = scale · q_i · k_j          (scale = 1/sqrt(HS); masked entries are -inf)
//     lse[i]  = log Σ_j exp s[i, j]        out[i] = Σ_j exp(s[i, j] - lse[i]) · v_j
//
//   mask  none    every key is visible (a key block wholly in the query block's past)
//         causal  key j visible iff j <= i (the block on the diagonal, Tq == Tk)
//         skip    no key is visible (a block wholly in the future): out 0, lse -inf, no work
//
// Two blocks (out, lse) and (out_b, lse_b) over disjoint keys merge into the attention over both
// (the online softmax, the engine's merge_attention in tensor/attention.h): with λ = lse, λ_b the new
// λ' = log(e^λ + e^λ_b)
//
//     lse' = lse - logsigmoid(lse - lse_b)                  = λ + log(1 + e^(λ_b - λ))
//     out' = out - sigmoid(lse_b - lse) · (out - out_b)     = (e^λ out + e^λ_b out_b) / e^λ'
//
// Both forms only ever exponentiate a non-positive number, so logits ×1e3 never overflow. A row
// that saw no key on one side (out 0, lse -inf: a skip block, or every key masked) takes the other
// side exactly, where the formulas would give -inf - -inf = nan; both sides -inf stay -inf. So a
// merge may start from that empty state as well as from a real first block (as the ring does).
//
// Backward of one block, given the FINAL lse of the query rows (the whole row's softmax) and
// D[i] = Σ_d dO[i, d] · O[i, d] (the final output's): P = exp(s - lse), the block's probabilities
// in the whole row, and
//     dV = Pᵀ dO      dP = dO Vᵀ      dS = P ∘ (dP - D)      dQ = scale · dS K      dK = scale · dSᵀ Q
// Summed over the key blocks, these are exactly the gradients of attention over the whole row.
//
// A block is computed by the engine's attention kernels (tensor/attention.h, the serial GPT's own
// attention): on the CPU in tiles of [32, 128] scores, never a [Tq, Tk] matrix, let alone the T×T of
// the whole sequence; on CUDA the same math as engine ops, which do hold the block's [Tq, Tk] scores
// (tensor/attention_composed.h). f32 (accumulating in f32) or f64 (for gradcheck): lse has q's dtype.
// The kernels below also take bf16 and f16 q, k, v (mixed precision): the block's out and lse, and the
// gradients they add into, are then f32, so that blocks merge and gradients sum before the one
// rounding to 16 bits, as the serial GPT's kernel rounds once; K and V travel in 16 bits.
//
//   Lesson: lessons/13_ring_attention.cpp   Tests: tests/parallel/context_parallel/test_context_parallel.cpp (gradcheck, ×1e3),
//   tests/parallel/context_parallel/test_attention_merge.cpp (merges with rows that saw no key)
#pragma once
#include "tensor/attention.h"
#include "tensor/tensor.h"

namespace sl::parallel {

enum class BlockMask { none, causal, skip };
const char* block_mask_name(BlockMask mask);

struct BlockOutput {
  Tensor out;  // [B, NH, Tq, HS]
  Tensor lse;  // [B, NH, Tq]
};

// The autograd Function: gradients flow to q, k, v from both out and lse.
// scale <= 0 means 1/sqrt(HS).
BlockOutput attention_block(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask, double scale = 0);

// ---- the kernels the ring and all-gather variants call (no autograd) --------------------------------
BlockOutput attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, BlockMask mask,
                                    double scale);
// The merge of (out_b, lse_b) into rows of (out, lse) is the engine's merge_attention, and
// D = rowsum(dO ∘ O) its attention_delta (tensor/attention.h).
// Adds one block's gradients into dq [B, NH, Tq, HS], dk and dv [B, NH, Tk, HS] (any of them may be
// undefined: not wanted). lse and delta are the query rows' final ones.
void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                              const Tensor& lse, const Tensor& delta, BlockMask mask, double scale, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv);

// 1/sqrt(HS) when scale <= 0.
double attention_scale(const Tensor& q, double scale);

}  // namespace sl::parallel
