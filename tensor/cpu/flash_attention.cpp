// flash_attention.cpp — see flash_attention.h. The GEMMs of a block run on cpu::gemm (one
// single-threaded BLAS call each); the softmax of a score block and its backward are the row loops
// below, on the library's vectorizable pieces (tensor/cpu/lanes.h: exp_of, lane_max, lane_sum).
#include "tensor/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/lanes.h"
#include "tensor/functors.h"
#include "tensor/philox.h"

namespace sl::cpu {

namespace {

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

// The backward's P from the final lse: exp(scale·s - lse) (masked keys 0), in place.
template <typename T>
void probabilities(T* s, const T* lse, const Tile& tile, T scale) {
  for (int64_t r = 0; r < tile.rows; ++r) {
    T* row = s + r * tile.cols;
    const int64_t visible = tile.visible(r);
    const T l = lse[tile.i0 + r];
    for_each_index(visible, [&](int64_t j) { row[j] = exp_of(scale * row[j] - l); });
    std::fill(row + visible, row + tile.cols, T(0));
  }
}

// dP [rows, cols] -> dS = scale · P ∘ (dP - D) in place (dP already through the dropout mask).
template <typename T>
void score_grad(T* dp, const T* p, const T* delta, const Tile& tile, T scale) {
  for (int64_t r = 0; r < tile.rows; ++r) {
    T* d = dp + r * tile.cols;
    const T* pr = p + r * tile.cols;
    const T dr = delta[tile.i0 + r];
    for_each_index(tile.cols, [&](int64_t j) { d[j] = scale * pr[j] * (d[j] - dr); });
  }
}

}  // namespace

template <typename T>
void attention_head_forward(const HeadForward<T>& head, const AttentionShape& shape, const AttentionDropout& dropout,
                            T* scratch) {
  const int64_t HS = shape.HS;
  const T scale = static_cast<T>(shape.scale);
  T *s = scratch, *m = scratch + kQueryBlock * kKeyBlock, *l = m + kQueryBlock;
  for (int64_t i0 = 0; i0 < shape.Tq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, shape.Tq - i0), end = key_end(shape, i0, rows);
    std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
    for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
      const Tile tile{i0, rows, j0, std::min(kKeyBlock, end - j0), shape.causal};
      // S = Q_i K_jᵀ: [rows, HS] @ [cols, HS]ᵀ
      gemm(false, true, rows, tile.cols, HS, head.q.row(i0), head.q.ld, head.k.row(j0), head.k.ld, s, tile.cols,
           false);
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
  T *p = scratch, *dp = scratch + kQueryBlock * kKeyBlock;
  for (int64_t i0 = 0; i0 < shape.Tq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, shape.Tq - i0), end = key_end(shape, i0, rows);
    for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
      const Tile tile{i0, rows, j0, std::min(kKeyBlock, end - j0), shape.causal};
      const int64_t cols = tile.cols;
      gemm(false, true, rows, cols, HS, head.q.row(i0), head.q.ld, head.k.row(j0), head.k.ld, p, cols, false);
      gemm(false, true, rows, cols, HS, head.dout.row(i0), head.dout.ld, head.v.row(j0), head.v.ld, dp, cols,
           false);  // dO_i V_jᵀ: the gradient of the dropped probabilities
      probabilities(p, head.lse, tile, scale);
      if (dropout.on()) drop(dp, tile, shape, dropout);  // ... through the mask: dP
      score_grad(dp, p, head.delta, tile, scale);        // dp is now dS (scale folded in)
      if (head.dv.data) {
        if (dropout.on()) drop(p, tile, shape, dropout);  // dV sees the probabilities V saw
        // dV_j += Pᵀ dO_i: [rows, cols]ᵀ @ [rows, HS]
        gemm(true, false, cols, HS, rows, p, cols, head.dout.row(i0), head.dout.ld, head.dv.row(j0), head.dv.ld, true);
      }
      if (head.dq.data)  // dQ_i += dS K_j: [rows, cols] @ [cols, HS]
        gemm(false, false, rows, HS, cols, dp, cols, head.k.row(j0), head.k.ld, head.dq.row(i0), head.dq.ld, true);
      if (head.dk.data)  // dK_j += dSᵀ Q_i: [rows, cols]ᵀ @ [rows, HS]
        gemm(true, false, cols, HS, rows, dp, cols, head.q.row(i0), head.q.ld, head.dk.row(j0), head.dk.ld, true);
    }
  }
}

template void attention_head_forward<float>(const HeadForward<float>&, const AttentionShape&,
                                            const AttentionDropout&, float*);
template void attention_head_forward<double>(const HeadForward<double>&, const AttentionShape&,
                                             const AttentionDropout&, double*);
template void attention_head_backward<float>(const HeadBackward<float>&, const AttentionShape&,
                                             const AttentionDropout&, float*);
template void attention_head_backward<double>(const HeadBackward<double>&, const AttentionShape&,
                                              const AttentionDropout&, double*);

}  // namespace sl::cpu
