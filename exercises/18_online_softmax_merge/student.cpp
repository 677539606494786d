// exercises/18_online_softmax_merge/student.cpp — one attention block's (out, lse), and the merge of two.
//
// Attention of the queries q [B, NH, Tq, HS] against a BLOCK of keys/values k, v [B, NH, Tk, HS]:
//
//   s[i, j] = scale · q_i · k_j                  scale = 1/sqrt(HS)
//             masked (left out) when causal and pos_k[j] > pos_q[i]: the key is in the query's future
//   lse[i]  = log Σ_j exp s[i, j]                [B, NH, Tq]       the block's log-sum-exp
//   out[i]  = Σ_j exp(s[i, j] - lse[i]) · v_j    [B, NH, Tq, HS]   softmax over this block's keys only
//
// exp(s) overflows for scores above ~709 (f64): with m = max_j s[i, j],
//   lse[i] = m + log Σ_j exp(s[i, j] - m)        every exponent <= 0
// A row that sees no key of the block has an empty sum: out 0 and lse = -inf (not 0/0 = nan).
//
// Two blocks over disjoint key sets A and B merge into the attention over A ∪ B (the online softmax):
//   lse = log(e^lse_a + e^lse_b)                 stably: m = max(lse_a, lse_b), m + log(e^(lse_a-m) + e^(lse_b-m))
//   out = e^(lse_a - lse) · out_a + e^(lse_b - lse) · out_b
// (each block's softmax was normalised by its own e^lse; re-weighting by e^lse / e^lse_total puts both
// on the union's denominator). A block with lse = -inf for a row contributes nothing to that row; when
// both are -inf the row stays (out 0, lse -inf). Careful: -inf - -inf is nan.
//
// The tools: q, k, v are f64 and contiguous; read them with q.data<double>() (index
// ((b · NH + h) · Tq + i) · HS + d), make results with sl::zeros({B, NH, Tq, HS}, sl::DType::f64) and
// write through out.data<double>(). q.size(0..3) gives B, NH, Tq, HS. std::exp, std::log, std::log1p,
// -std::numeric_limits<double>::infinity(). sl::parallel::BlockOutput is just {Tensor out; Tensor lse;}.
// Do not call the library's attention_block / merge_attention: that is the answer.
//
// Grade it:  make exercise N=18
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "exercises/grader.h"
#include "parallel/context_parallel/attention_block.h"
#include "tensor/ops.h"

namespace exercise18 {

// PREDICT FIRST, before any code. Causal attention, the query at position 5, keys at positions 0-7 in
// two blocks, A = 0-3 and B = 4-7, every score equal (q = 0). After merging, the output is
// w·out_A + (1 - w)·out_B with w = e^(lse_A - lse). What is w? Replace the throw with your number; the
// grader merges the library's blocks and measures it.
double predicted_weight_of_a() { throw exercises::NotImplemented("predicted_weight_of_a (predict first)"); }

// q [B, NH, Tq, HS], k, v [B, NH, Tk, HS] (f64); pos_q [Tq], pos_k [Tk] the tokens' global positions.
// causal: key j is visible to query i iff pos_k[j] <= pos_q[i]; otherwise every key is visible.
// Returns out [B, NH, Tq, HS] and lse [B, NH, Tq] over this block's visible keys.
sl::parallel::BlockOutput attend_block(const sl::Tensor& q, const sl::Tensor& k, const sl::Tensor& v,
                                       const std::vector<int64_t>& pos_q, const std::vector<int64_t>& pos_k,
                                       bool causal) {
  // TODO: per (b, h, i): the visible scores, their max, lse, then the normalised sum of v.
  throw exercises::NotImplemented("attend_block");
}

// a, b: two blocks' (out [B, NH, Tq, HS], lse [B, NH, Tq]) for the same queries over disjoint keys.
// Returns NEW tensors (leave a and b alone): the attention over the keys of both.
sl::parallel::BlockOutput merge_blocks(const sl::parallel::BlockOutput& a, const sl::parallel::BlockOutput& b) {
  // TODO: per row: the merged lse (max trick, -inf handled), then the two re-weighted outputs.
  throw exercises::NotImplemented("merge_blocks");
}

}  // namespace exercise18
