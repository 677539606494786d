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
#pragma once
#include <cstdint>

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
  uint64_t first = 0;      // the counter of this head's element (0, 0)
  double keep_scale = 1;   // 1 / (1 - p)
  bool on() const { return threshold != 0; }
};

struct AttentionShape {
  int64_t Tq = 0, Tk = 0, HS = 0;
  bool causal = false;  // key j visible to query i iff j <= i (Tq == Tk)
  double scale = 1;
};

template <typename T>
struct HeadForward {
  Rows<const T> q, k, v;
  Rows<T> out;
  T* lse;  // [Tq]
};

template <typename T>
struct HeadBackward {
  Rows<const T> q, k, v, dout;
  const T *lse, *delta;  // [Tq] each: the rows' final lse and D
  Rows<T> dq, dk, dv;    // added into; a null data: not wanted
};

// Scratch for one thread: two score tiles, the running max and sum, and two transposed [HS, T] copies
// (kᵀ in forward; qᵀ and dOᵀ in backward), so that every GEMM is one BLAS runs on its small-matrix
// kernels (OpenBLAS packs a q·kᵀ with a wide result: ~2x slower at these sizes).
constexpr int64_t attention_scratch_size(int64_t Tq, int64_t Tk, int64_t HS) {
  return 2 * kQueryBlock * kKeyBlock + 2 * kQueryBlock + 2 * HS * (Tq > Tk ? Tq : Tk);
}

template <typename T>
void attention_head_forward(const HeadForward<T>& head, const AttentionShape& shape, const AttentionDropout& dropout,
                            T* scratch);
template <typename T>
void attention_head_backward(const HeadBackward<T>& head, const AttentionShape& shape,
                             const AttentionDropout& dropout, T* scratch);

}  // namespace sl::cpu
