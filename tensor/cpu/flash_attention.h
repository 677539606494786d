// flash_attention.h — the CPU kernels of blockwise attention (FlashAttention, Dao et al. 2022;
// FlashAttention-2's backward, Dao 2023), one head at a time, on raw rows.
//
//   q [Tq, HS], k, v [Tk, HS] of one head  ──►  out [Tq, HS], lse [Tq]
//
//   for each query block Q_i (kQueryBlock rows):            running max m, running sum l, O = 0
//     for each key block K_j, V_j that a row of Q_i sees:   (causal: keys past the block's last row
//       S = Q_i K_jᵀ                       GEMM [rows, cols] are skipped, never computed)
//       m' = max(m, scale·rowmax S)        P = exp(scale·S - m')  (masked keys: 0)
//       l  = l·e^(m - m') + rowsum P       O = O·e^(m - m') + dropout(P) V_j          GEMM
//     out = O / l        lse = m + log l
//
//   backward (D = rowsum(dO ∘ O), given with the FINAL lse of each row):
//     P = exp(scale·S - lse)   dV_j += dropout(P)ᵀ dO_i   dP = dropout(dO_i V_jᵀ)
//     dS = scale · P ∘ (dP - D)   dQ_i += dS K_j   dK_j += dSᵀ Q_i              (5 GEMMs per block)
//
// Only one [kQueryBlock, kKeyBlock] score block per thread is ever alive (the caller's scratch).
// Dropout keeps element (i, j) of the head iff dropout_keeps(first + i·Tk + j) (tensor/philox.h): the
// counters of the [Tq, Tk] matrix the eager path would draw, so forward and backward regenerate the
// same mask without storing it. f32 (accumulating in f32) and f64.
//
// bf16 and f16 (mixed precision) run the f32 kernel: each head's q, k, v (dO in backward) widened to
// f32 rows in the thread's scratch, its out (dq, dk, dv) rounded once to 16 bits at the end, lse and
// D kept in f32 (compute_t<T>). Scratch per thread is bounded by a head, never [B, NH, T, HS].
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace sl::cpu {

inline constexpr int64_t kQueryBlock = 32;  // query rows per block: the causal edge is cut this fine
inline constexpr int64_t kKeyBlock = 128;   // keys per block: a [32, 128] f32 score block is 16 KiB (L1)

// Rows of one head's matrix: row r at data + r * ld (ld = HS for [B, NH, T, HS], 3C inside c_attn's output).
template <typename P>
struct Rows {
  P* data = nullptr;
  int64_t ld = 0;
  P* row(int64_t r) const { return data + r * ld; }
};

struct AttentionDropout {
  uint64_t threshold = 0;  // dropout_threshold(p); 0 with keep_scale 1: no dropout
  uint64_t key = 0;        // the generator's seed
  uint64_t first = 0;      // the counter of element (0, 0)
  double keep_scale = 1;   // 1 / (1 - p)
  bool on() const { return threshold != 0; }
  AttentionDropout at(uint64_t offset) const {  // the same draw from `offset` counters on
    return on() ? AttentionDropout{threshold, key, first + offset, keep_scale} : *this;
  }
};

struct AttentionShape {
  int64_t Tq = 0, Tk = 0, HS = 0;
  bool causal = false;  // key j visible to query i iff j <= i (Tq == Tk)
  double scale = 1;
};

// Where head (b, h) of an operand lies: its rows start at data + offset + b·batch + h·head, ld apart.
//   [B, NH, T, HS]                       batch NH·T·HS, head T·HS, ld HS
//   [B, T, 3·NH·HS] (c_attn's q | k | v)  batch T·3W, head HS, ld 3W, offset 0 | W | 2W  (W = NH·HS)
struct HeadLayout {
  int64_t batch = 0, head = 0, ld = 0, offset = 0;
  template <typename P>
  Rows<P> rows(P* data, int64_t b, int64_t h) const {
    return {data ? data + offset + b * batch + h * head : nullptr, ld};
  }
};

// B x NH heads and each operand's layout: dq, dk, dv lie as q, k, v do, dO as out. lse and D are
// [B, NH, Tq]. Heads run on num_threads() threads (tensor/ops.h), each wholly on one thread, in the
// same order whatever the count: the bytes do not depend on it.
struct AttentionHeads {
  int64_t B = 0, NH = 0;
  HeadLayout q, k, v, out;
};

// dropout.first is the counter of element (0, 0, 0, 0): head bh's (i, j) is first + (bh·Tq + i)·Tk + j.
// T: float, double, bf16 or f16; lse (and delta) in compute_t<T> (f32 for the 16-bit types).
template <typename T>
void attention_forward_heads(const AttentionHeads& heads, const AttentionShape& shape, const AttentionDropout& dropout,
                             const T* q, const T* k, const T* v, T* out, compute_t<T>* lse);
// Adds into dq, dk, dv (null: not wanted). delta null: D = rowsum(dO ∘ O) computed here from out.
template <typename T>
void attention_backward_heads(const AttentionHeads& heads, const AttentionShape& shape,
                              const AttentionDropout& dropout, const T* q, const T* k, const T* v, const T* out,
                              const T* dout, const compute_t<T>* lse, const compute_t<T>* delta, T* dq, T* dk,
                              T* dv);

// The 16-bit heads (S: bf16 or f16) with their results kept in f32: out [B, NH, Tq, HS] f32 (not
// rounded: a block of ring attention merges with the others in f32 and the whole row is rounded once),
// and dq, dk, dv f32 accumulators added into (the gradient of each key block sums over query blocks
// and ranks before it is rounded). delta must be given. The same arithmetic as the 16-bit kernels
// above up to their final rounding.
template <typename S>
void attention_forward_heads_wide(const AttentionHeads& heads, const AttentionShape& shape,
                                  const AttentionDropout& dropout, const S* q, const S* k, const S* v, float* out,
                                  float* lse);
template <typename S>
void attention_backward_heads_wide(const AttentionHeads& heads, const AttentionShape& shape,
                                   const AttentionDropout& dropout, const S* q, const S* k, const S* v, const S* dout,
                                   const float* lse, const float* delta, float* dq, float* dk, float* dv);

}  // namespace sl::cpu
