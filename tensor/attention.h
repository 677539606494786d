// attention.h — the engine's attention, blockwise (FlashAttention on the CPU): the GPT's one core
// (causal_attention in tensor/ops.h) and the block kernels context parallelism builds ring and
// all-gather attention from (parallel/context_parallel/attention_block.h).
//
//   q [B, NH, Tq, HS], k, v [B, NH, Tk, HS]   ──►   out [B, NH, Tq, HS],  lse [B, NH, Tq]
//
//     s[i, j] = scale · q_i · k_j          causal: key j visible iff j <= i (Tq == Tk)
//     lse[i]  = log Σ_j exp s[i, j]        out[i] = Σ_j dropout(exp(s[i, j] - lse[i])) · v_j
//
// Computed block by block (tensor/cpu/flash_attention.h): never the [Tq, Tk] matrix, and with
// causal, no block above the diagonal. A forward keeps out and lse; the backward recomputes each
// block's probabilities from the final lse (FlashAttention-2: D = rowsum(dO ∘ O), dS = P ∘ (dP - D)).
//
// Heads run in parallel on num_threads() threads (tensor/ops.h), each head wholly on one thread and
// in the same order for any count: the bytes do not depend on the thread count. CPU, f32 or f64;
// causal_attention and causal_attention_packed also bf16 and f16 (mixed precision: computed in f32,
// out and the gradients rounded once to 16 bits, lse kept in f32).
//
//   Tests: tests/tensor/test_flash_attention.cpp, tests/tensor/test_flash_attention_16bit.cpp,
//   tests/tensor/test_attention_composed.cpp (the CUDA path on CPU tensors, against the kernels)
#pragma once
#include <cstdint>

#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace sl {

struct AttentionOutput {
  Tensor out;  // [B, NH, Tq, HS]
  Tensor lse;  // [B, NH, Tq], q's dtype
};

// Dropout of the probabilities without a mask tensor: element (b, h, i, j) is kept iff
// dropout_keeps(first + ((b·NH + h)·Tq + i)·Tk + j, key, ·) (tensor/philox.h), exactly the mask
// dropout() draws for the [B, NH, Tq, Tk] matrix from a generator at offset `first`.
struct AttentionDropoutDraw {
  double p = 0;  // 0: no dropout
  uint64_t first = 0, key = 0;
};

// causal_attention (tensor/ops.h) on c_attn's output as it is: qkv [B, T, 3·W] holds q, k and v side
// by side (head h at columns h·HS of each third, W = n_head·HS); y [B, T, W] holds the heads side by
// side, c_proj's input. The same numbers and dropout counters as splitting qkv into [B, NH, T, HS]
// heads, causal_attention, and joining the heads again, without the copies that takes.
Tensor causal_attention_packed(const Tensor& qkv, int64_t n_head, double dropout_p = 0, bool training = true,
                               Generator* generator = nullptr);

// The kernels (no autograd). scale > 0. CPU tensors run the blockwise kernel; CUDA tensors (no dropout)
// the same math as engine ops that hold a block's [Tq, Tk] scores (attention_composed.h).
// q, k, v in f32 or f64: out, lse, dout, delta and the gradients in the same dtype. q, k, v in bf16 or
// f16 (a block of mixed-precision ring attention): out, lse, delta and the gradients dq, dk, dv in f32
// (a block merges with others and each key block's gradient sums over query blocks before the one
// rounding to 16 bits), dout in q's dtype. The 16-bit operands are widened per head inside the CPU
// kernel, per block on CUDA: what travels between ranks stays 16-bit.
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                  const AttentionDropoutDraw& dropout = {});
// Adds the gradients into dq [B, NH, Tq, HS], dk and dv [B, NH, Tk, HS] (an undefined one: not
// wanted). lse and delta [B, NH, Tq] are the query rows' final ones (the whole row's softmax).
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                        const Tensor& delta, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const AttentionDropoutDraw& dropout = {});
// D = rowsum(dO ∘ O): [B, NH, Tq, HS] x2 -> [B, NH, Tq] (f32 when either is 16-bit).
Tensor attention_delta(const Tensor& dout, const Tensor& out);

// ---- blocks of keys, merged (ring attention's steps: parallel/context_parallel) ----------------------
// Two blocks (out, lse) and (out_b, lse_b) over disjoint keys merge into the attention over both (the
// online softmax), only ever exponentiating a non-positive number:
//     lse' = lse - logsigmoid(lse - lse_b)        out' = out - sigmoid(lse_b - lse) · (out - out_b)
// A row that saw no key on one side (out 0, lse -inf) takes the other side exactly; both -inf stay
// -inf. In place, into rows [row_begin, row_begin + Tb) of out [B, NH, T, HS] and lse [B, NH, T] from
// out_b [B, NH, Tb, HS] and lse_b [B, NH, Tb]. f32 or f64; CPU: a row loop, CUDA: engine ops.
void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                     int64_t row_begin = 0);
// dst [B, NH, T, ...] rows [begin, begin + Tb) = src [B, NH, Tb, ...], in place.
void set_rows(const Tensor& dst, const Tensor& src, int64_t begin);
// dst [B, NH, T, HS] rows [begin, begin + Tb) += src [B, NH, Tb, HS], in place (f32 or f64).
void add_rows(const Tensor& dst, const Tensor& src, int64_t begin);

}  // namespace sl
