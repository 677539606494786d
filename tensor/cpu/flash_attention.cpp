// flash_attention.cpp — see flash_attention.h. The GEMMs of a block run on cpu::gemm (one
// single-threaded BLAS call each); the softmax of a score block and its backward are the row loops
// below, on the library's vectorizable pieces (tensor/cpu/lanes.h: exp_of, lane_max, lane_sum).
// bf16 and f16 heads are widened to f32 per head and run the f32 loops (forward_heads_16bit).
#include "tensor/cpu/flash_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/lanes.h"
#include "tensor/functors.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

namespace sl::cpu {

namespace {

// xᵀ [HS, n] (row d at xt + d·n) from x's rows [n, HS].
template <typename T>
void transpose_rows(const Rows<const T>& x, int64_t n, int64_t HS, T* xt) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < HS; ++d) xt[d * n + r] = x.row(r)[d];
}

// The key blocks of query block [i0, i0 + rows): keys [0, key_end), key_end = i0 + rows when causal
// (every later key is in the future of every row: those blocks are skipped). Within a block, row
// i0 + r sees keys [j0, j0 + visible(r)).
struct Tile {
  int64_t i0, rows, j0, cols;
  bool causal;
  int64_t visible(int64_t r) const { return causal ? std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols) : cols; }
};

int64_t key_end(const AttentionShape& shape, int64_t i0, int64_t rows) { return shape.causal ? i0 + rows : shape.Tk; }

// p[r, j] *= keep(i0 + r, j0 + j) ? 1/(1-p) : 0 over a tile's visible entries.
template <typename T>
void drop(T* p, const Tile& tile, const AttentionShape& shape, const AttentionDropout& dropout) {
  const T keep_scale = static_cast<T>(dropout.keep_scale);
  for (int64_t r = 0; r < tile.rows; ++r) {
    T* row = p + r * tile.cols;
    const uint64_t counter = dropout.first + static_cast<uint64_t>((tile.i0 + r) * shape.Tk + tile.j0);
    for (int64_t j = 0, n = tile.visible(r); j < n; ++j)
      row[j] = dropout_keeps(counter + static_cast<uint64_t>(j), dropout.key, dropout.threshold) ? row[j] * keep_scale
                                                                                                : T(0);
  }
}

// One tile of the forward's online softmax: scores s [rows, cols] -> P = exp(scale·s - m') in place
// (masked keys 0), the running max m and sum l updated, and the rows of O so far rescaled by
// e^(m - m') (not on the first key block, where O is not yet written). m' only ever grows, so every
// exponent is <= 0: logits ×1e3 do not overflow.
template <typename T>
void online_softmax(T* s, T* m, T* l, const Tile& tile, T scale, const Rows<T>& out, int64_t HS) {
  for (int64_t r = 0; r < tile.rows; ++r) {
    T* row = s + r * tile.cols;
    const int64_t visible = tile.visible(r);
    if (visible == 0) {  // a row before the block's first key: nothing seen, nothing changes
      std::fill(row, row + tile.cols, T(0));
      continue;
    }
    const T m_new = std::max(m[r], lane_max<T>(visible, [&](int64_t j) { return scale * row[j]; }));
    for_each_index(visible, [&](int64_t j) { row[j] = exp_of(scale * row[j] - m_new); });
    std::fill(row + visible, row + tile.cols, T(0));
    const T total = lane_sum<T>(visible, [&](int64_t j) { return row[j]; });
    if (tile.j0 == 0) {
      l[r] = total;
    } else {
      const T alpha = std::exp(m[r] - m_new);
      l[r] = l[r] * alpha + total;
      T* o = out.row(tile.i0 + r);
      if (alpha != T(1)) for_each_index(HS, [&](int64_t d) { o[d] *= alpha; });
    }
    m[r] = m_new;
  }
}

// The backward works on transposed tiles, keys by queries ([cols, rows]): every product it needs
// is then a plain or a Q-side GEMM that BLAS runs on its small-matrix kernels (a transposed left
// operand over a wide C, as dV += Pᵀ dO would be, takes OpenBLAS's packing path: ~2x slower here).
// Key row j of a tile is seen by the query rows [first_query(j), rows).
int64_t first_query(const Tile& tile, int64_t j) {
  return tile.causal ? std::clamp<int64_t>(tile.j0 + j - tile.i0, 0, tile.rows) : 0;
}

// Pᵀ from the final lse: sᵀ [cols, rows] -> exp(scale·s - lse) in place (masked entries 0).
template <typename T>
void probabilities_t(T* st, const T* lse, const Tile& tile, T scale) {
  const T* l = lse + tile.i0;
  for (int64_t j = 0; j < tile.cols; ++j) {
    T* row = st + j * tile.rows;
    const int64_t lo = first_query(tile, j);
    std::fill(row, row + lo, T(0));
    for_each_index(tile.rows - lo, [&](int64_t r) { row[lo + r] = exp_of(scale * row[lo + r] - l[lo + r]); });
  }
}

// xᵀ [cols, rows] *= keep(i0 + r, j0 + j) ? 1/(1-p) : 0 over the tile's visible entries.
template <typename T>
void drop_t(T* xt, const Tile& tile, const AttentionShape& shape, const AttentionDropout& dropout) {
  const T keep_scale = static_cast<T>(dropout.keep_scale);
  for (int64_t j = 0; j < tile.cols; ++j) {
    T* row = xt + j * tile.rows;
    for (int64_t r = first_query(tile, j); r < tile.rows; ++r) {
      const uint64_t counter = dropout.first + static_cast<uint64_t>((tile.i0 + r) * shape.Tk + tile.j0 + j);
      row[r] = dropout_keeps(counter, dropout.key, dropout.threshold) ? row[r] * keep_scale : T(0);
    }
  }
}

// dPᵀ [cols, rows] -> dSᵀ = scale · P ∘ (dP - D) in place (dP already through the dropout mask).
template <typename T>
void score_grad_t(T* dpt, const T* pt, const T* delta, const Tile& tile, T scale) {
  const T* d = delta + tile.i0;
  for (int64_t j = 0; j < tile.cols; ++j) {
    T* g = dpt + j * tile.rows;
    const T* p = pt + j * tile.rows;
    for_each_index(tile.rows, [&](int64_t r) { g[r] = scale * p[r] * (g[r] - d[r]); });
  }
}

// One head's operands.
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

// Scratch for one thread: two score tiles, the running max and sum, two transposed [HS, T] copies
// (kᵀ in forward; qᵀ and dOᵀ in backward) so that every GEMM is one BLAS runs on its small-matrix
// kernels (OpenBLAS packs a q·kᵀ with a wide result: ~2x slower at these sizes), and D [Tq].
int64_t scratch_size(const AttentionShape& shape) {
  return 2 * kQueryBlock * kKeyBlock + 2 * kQueryBlock + 2 * shape.HS * std::max(shape.Tq, shape.Tk) + shape.Tq;
}

template <typename T>
void attention_head_forward(const HeadForward<T>& head, const AttentionShape& shape, const AttentionDropout& dropout,
                            T* scratch) {
  const int64_t HS = shape.HS;
  const T scale = static_cast<T>(shape.scale);
  T *s = scratch, *m = scratch + kQueryBlock * kKeyBlock, *l = m + kQueryBlock, *kt = l + kQueryBlock;
  transpose_rows(head.k, shape.Tk, HS, kt);  // kᵀ [HS, Tk]
  for (int64_t i0 = 0; i0 < shape.Tq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, shape.Tq - i0), end = key_end(shape, i0, rows);
    std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
    for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
      const Tile tile{i0, rows, j0, std::min(kKeyBlock, end - j0), shape.causal};
      // S = Q_i K_jᵀ: [rows, HS] @ [HS, cols]
      gemm(false, false, rows, tile.cols, HS, head.q.row(i0), head.q.ld, kt + j0, shape.Tk, s, tile.cols, false);
      online_softmax(s, m, l, tile, scale, head.out, HS);
      if (dropout.on()) drop(s, tile, shape, dropout);  // l keeps the undropped sum: dropout is after softmax
      // O (+)= P V_j: [rows, cols] @ [cols, HS]
      gemm(false, false, rows, HS, tile.cols, s, tile.cols, head.v.row(j0), head.v.ld, head.out.row(i0),
           head.out.ld, j0 > 0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T inv = T(1) / l[r];
      T* o = head.out.row(i0 + r);
      for_each_index(HS, [&](int64_t d) { o[d] *= inv; });
      head.lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

template <typename T>
void attention_head_backward(const HeadBackward<T>& head, const AttentionShape& shape,
                             const AttentionDropout& dropout, T* scratch) {
  const int64_t HS = shape.HS;
  const T scale = static_cast<T>(shape.scale);
  T *pt = scratch, *dpt = scratch + kQueryBlock * kKeyBlock;  // [cols, rows] each
  T *qt = dpt + kQueryBlock * kKeyBlock + 2 * kQueryBlock, *dot = qt + HS * shape.Tq;
  transpose_rows(head.q, shape.Tq, HS, qt);       // qᵀ [HS, Tq]
  transpose_rows(head.dout, shape.Tq, HS, dot);  // dOᵀ [HS, Tq]
  for (int64_t i0 = 0; i0 < shape.Tq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, shape.Tq - i0), end = key_end(shape, i0, rows);
    for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
      const Tile tile{i0, rows, j0, std::min(kKeyBlock, end - j0), shape.causal};
      const int64_t cols = tile.cols;
      // Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ (the gradient of the dropped probabilities): [cols, rows]
      gemm(false, false, cols, rows, HS, head.k.row(j0), head.k.ld, qt + i0, shape.Tq, pt, rows, false);
      gemm(false, false, cols, rows, HS, head.v.row(j0), head.v.ld, dot + i0, shape.Tq, dpt, rows, false);
      probabilities_t(pt, head.lse, tile, scale);
      if (dropout.on()) drop_t(dpt, tile, shape, dropout);  // ... through the mask: dP
      score_grad_t(dpt, pt, head.delta, tile, scale);       // dpt is now dSᵀ (scale folded in)
      if (head.dv.data) {
        if (dropout.on()) drop_t(pt, tile, shape, dropout);  // dV sees the probabilities V saw
        // dV_j += Pᵀ dO_i: [cols, rows] @ [rows, HS]
        gemm(false, false, cols, HS, rows, pt, rows, head.dout.row(i0), head.dout.ld, head.dv.row(j0), head.dv.ld,
             true);
      }
      if (head.dq.data)  // dQ_i += dS K_j = (dSᵀ)ᵀ K_j: [rows, cols] @ [cols, HS]
        gemm(true, false, rows, HS, cols, dpt, rows, head.k.row(j0), head.k.ld, head.dq.row(i0), head.dq.ld, true);
      if (head.dk.data)  // dK_j += dSᵀ Q_i: [cols, rows] @ [rows, HS]
        gemm(false, false, cols, HS, rows, dpt, rows, head.q.row(i0), head.q.ld, head.dk.row(j0), head.dk.ld, true);
    }
  }
}

// body(b, h, scratch) for every head, on num_threads() threads taking the next head.
template <typename T, typename Body>
void for_each_head(const AttentionHeads& heads, int64_t scratch_elements, Body&& body) {
  std::atomic<int64_t> next{0};
  const int64_t count = heads.B * heads.NH;
  auto worker = [&] {
    std::vector<T> scratch(static_cast<size_t>(scratch_elements));
    for (int64_t bh = next++; bh < count; bh = next++) body(bh / heads.NH, bh % heads.NH, scratch.data());
  };
  const int64_t helpers = std::min<int64_t>(num_threads(), count) - 1;
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < helpers; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& thread : threads) thread.join();
}

// D = rowsum(dO ∘ O) of one head's rows, in C (f32 for 16-bit rows).
template <typename C, typename T>
void head_delta(const Rows<const T>& dout, const Rows<const T>& out, int64_t Tq, int64_t HS, C* delta) {
  for (int64_t r = 0; r < Tq; ++r)
    delta[r] = lane_sum<C>(HS, [&](int64_t c) { return static_cast<C>(dout.row(r)[c]) * static_cast<C>(out.row(r)[c]); });
}

// The 16-bit heads: a head's rows widened to f32 rows [n, HS] (ld HS), and f32 results rounded once
// into 16-bit rows (added to what they hold when `add`: the backward adds into dq, dk, dv).
template <typename S>
Rows<const float> widen(const Rows<const S>& x, int64_t n, int64_t HS, float* wide) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < HS; ++d) wide[r * HS + d] = static_cast<float>(x.row(r)[d]);
  return {wide, HS};
}
template <typename S>
void round_into(const float* wide, int64_t n, int64_t HS, const Rows<S>& x, bool add) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < HS; ++d) {
      S& e = x.row(r)[d];
      e = S(add ? static_cast<float>(e) + wide[r * HS + d] : wide[r * HS + d]);
    }
}

// f32 rows [Tq or Tk, HS] per widened operand, after the kernel's own scratch.
int64_t wide_rows(const AttentionShape& shape) { return std::max(shape.Tq, shape.Tk) * shape.HS; }

// O: S (out rounded once to 16 bits) or float (out kept in f32: a block that merges with others).
template <typename S, typename O>
void forward_heads_16bit(const AttentionHeads& heads, const AttentionShape& shape, const AttentionDropout& dropout,
                         const S* q, const S* k, const S* v, O* out, float* lse) {
  const int64_t base = scratch_size(shape), n = wide_rows(shape), HS = shape.HS;
  for_each_head<float>(heads, base + 4 * n, [&](int64_t b, int64_t h, float* work) {
    const int64_t bh = b * heads.NH + h;
    float* wide = work + base;  // q | k | v | out, f32
    const HeadForward<float> head{widen(heads.q.rows(q, b, h), shape.Tq, HS, wide),
                                  widen(heads.k.rows(k, b, h), shape.Tk, HS, wide + n),
                                  widen(heads.v.rows(v, b, h), shape.Tk, HS, wide + 2 * n),
                                  {wide + 3 * n, HS}, lse + bh * shape.Tq};
    attention_head_forward(head, shape, dropout.at(static_cast<uint64_t>(bh * shape.Tq * shape.Tk)), work);
    round_into(wide + 3 * n, shape.Tq, HS, heads.out.rows(out, b, h), false);
  });
}

// G: S (dq, dk, dv rounded once into 16-bit gradients) or float (added into f32 accumulators).
template <typename S, typename G>
void backward_heads_16bit(const AttentionHeads& heads, const AttentionShape& shape, const AttentionDropout& dropout,
                          const S* q, const S* k, const S* v, const S* out, const S* dout, const float* lse,
                          const float* delta, G* dq, G* dk, G* dv) {
  const int64_t base = scratch_size(shape), n = wide_rows(shape), HS = shape.HS;
  for_each_head<float>(heads, base + 7 * n, [&](int64_t b, int64_t h, float* work) {
    const int64_t bh = b * heads.NH + h;
    float* wide = work + base;  // q | k | v | dO | dq | dk | dv, f32
    const Rows<const S> g = heads.out.rows(dout, b, h);
    float* own_delta = work + base - shape.Tq;
    if (!delta) head_delta(g, heads.out.rows(out, b, h), shape.Tq, HS, own_delta);
    std::fill(wide + 4 * n, wide + 7 * n, 0.0f);
    const HeadBackward<float> head{widen(heads.q.rows(q, b, h), shape.Tq, HS, wide),
                                   widen(heads.k.rows(k, b, h), shape.Tk, HS, wide + n),
                                   widen(heads.v.rows(v, b, h), shape.Tk, HS, wide + 2 * n),
                                   widen(g, shape.Tq, HS, wide + 3 * n),
                                   lse + bh * shape.Tq,
                                   delta ? delta + bh * shape.Tq : own_delta,
                                   {dq ? wide + 4 * n : nullptr, HS},
                                   {dk ? wide + 5 * n : nullptr, HS},
                                   {dv ? wide + 6 * n : nullptr, HS}};
    attention_head_backward(head, shape, dropout.at(static_cast<uint64_t>(bh * shape.Tq * shape.Tk)), work);
    if (dq) round_into(wide + 4 * n, shape.Tq, HS, heads.q.rows(dq, b, h), true);
    if (dk) round_into(wide + 5 * n, shape.Tk, HS, heads.k.rows(dk, b, h), true);
    if (dv) round_into(wide + 6 * n, shape.Tk, HS, heads.v.rows(dv, b, h), true);
  });
}

}  // namespace

template <typename T>
void attention_forward_heads(const AttentionHeads& heads, const AttentionShape& shape, const AttentionDropout& dropout,
                             const T* q, const T* k, const T* v, T* out, compute_t<T>* lse) {
  if constexpr (!std::is_same_v<T, compute_t<T>>) {  // bf16, f16
    forward_heads_16bit(heads, shape, dropout, q, k, v, out, lse);
  } else {
    for_each_head<T>(heads, scratch_size(shape), [&](int64_t b, int64_t h, T* scratch) {
      const int64_t bh = b * heads.NH + h;
      const HeadForward<T> head{heads.q.rows(q, b, h), heads.k.rows(k, b, h), heads.v.rows(v, b, h),
                                heads.out.rows(out, b, h), lse + bh * shape.Tq};
      attention_head_forward(head, shape, dropout.at(static_cast<uint64_t>(bh * shape.Tq * shape.Tk)), scratch);
    });
  }
}

template <typename T>
void attention_backward_heads(const AttentionHeads& heads, const AttentionShape& shape,
                              const AttentionDropout& dropout, const T* q, const T* k, const T* v, const T* out,
                              const T* dout, const compute_t<T>* lse, const compute_t<T>* delta, T* dq, T* dk,
                              T* dv) {
  if constexpr (!std::is_same_v<T, compute_t<T>>) {  // bf16, f16
    backward_heads_16bit(heads, shape, dropout, q, k, v, out, dout, lse, delta, dq, dk, dv);
  } else {
    const int64_t scratch = scratch_size(shape);
    for_each_head<T>(heads, scratch, [&](int64_t b, int64_t h, T* work) {
      const int64_t bh = b * heads.NH + h;
      const Rows<const T> g = heads.out.rows(dout, b, h);
      T* own_delta = work + scratch - shape.Tq;  // D = rowsum(dO ∘ O) when the caller gives none
      if (!delta) head_delta(g, heads.out.rows(out, b, h), shape.Tq, shape.HS, own_delta);
      const HeadBackward<T> head{heads.q.rows(q, b, h),
                                 heads.k.rows(k, b, h),
                                 heads.v.rows(v, b, h),
                                 g,
                                 lse + bh * shape.Tq,
                                 delta ? delta + bh * shape.Tq : own_delta,
                                 heads.q.rows(dq, b, h),
                                 heads.k.rows(dk, b, h),
                                 heads.v.rows(dv, b, h)};
      attention_head_backward(head, shape, dropout.at(static_cast<uint64_t>(bh * shape.Tq * shape.Tk)), work);
    });
  }
}

#define SL_INSTANTIATE(T)                                                                                          \
  template void attention_forward_heads<T>(const AttentionHeads&, const AttentionShape&, const AttentionDropout&, \
                                           const T*, const T*, const T*, T*, compute_t<T>*);                       \
  template void attention_backward_heads<T>(const AttentionHeads&, const AttentionShape&, const AttentionDropout&, \
                                            const T*, const T*, const T*, const T*, const T*, const compute_t<T>*, \
                                            const compute_t<T>*, T*, T*, T*);
SL_INSTANTIATE(float)
SL_INSTANTIATE(double)
SL_INSTANTIATE(bf16)
SL_INSTANTIATE(f16)
#undef SL_INSTANTIATE

template <typename S>
void attention_forward_heads_wide(const AttentionHeads& heads, const AttentionShape& shape,
                                  const AttentionDropout& dropout, const S* q, const S* k, const S* v, float* out,
                                  float* lse) {
  forward_heads_16bit(heads, shape, dropout, q, k, v, out, lse);
}

template <typename S>
void attention_backward_heads_wide(const AttentionHeads& heads, const AttentionShape& shape,
                                   const AttentionDropout& dropout, const S* q, const S* k, const S* v, const S* dout,
                                   const float* lse, const float* delta, float* dq, float* dk, float* dv) {
  SL_ASSERT(delta != nullptr);
  backward_heads_16bit(heads, shape, dropout, q, k, v, static_cast<const S*>(nullptr), dout, lse, delta, dq, dk, dv);
}

#define SL_INSTANTIATE_WIDE(S)                                                                                   \
  template void attention_forward_heads_wide<S>(const AttentionHeads&, const AttentionShape&,                   \
                                                const AttentionDropout&, const S*, const S*, const S*, float*, \
                                                float*);                                                       \
  template void attention_backward_heads_wide<S>(const AttentionHeads&, const AttentionShape&,                  \
                                                 const AttentionDropout&, const S*, const S*, const S*, const S*, \
                                                 const float*, const float*, float*, float*, float*);
SL_INSTANTIATE_WIDE(bf16)
SL_INSTANTIATE_WIDE(f16)
#undef SL_INSTANTIATE_WIDE

}  // namespace sl::cpu
