// attention_composed.cpp — see tensor/attention_composed.h. Shapes: q [B, NH, Tq, HS],
// k, v [B, NH, Tk, HS], s and P [B, NH, Tq, Tk], lse and delta [B, NH, Tq] (as [B, NH, Tq, 1] to
// broadcast along a row).
#include "tensor/attention_composed.h"

#include <limits>

#include "tensor/ops.h"

namespace sl::composed {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// [B, NH, T] -> [B, NH, T, 1] (a view): one value per row, broadcast along the row.
Tensor per_row(const Tensor& x) { return x.reshape({x.size(0), x.size(1), x.size(2), 1}); }

// s = scale · q kᵀ, with the future (key j > query i) at -inf on a causal block.
Tensor block_scores(const Tensor& q, const Tensor& k, bool causal, double scale) {
  Tensor s = mul(matmul(q, k, false, true), scale);  // [B, NH, Tq, HS] @ [B, NH, Tk, HS]ᵀ
  if (causal) s = masked_fill(s, causal_mask(q.size(2), q.device()), -kInf);
  return s;
}

// logsigmoid(x) = min(x, 0) - log(1 + e^-|x|): only ever exp of a non-positive number, as the CPU
// loop's std::log1p form (log(1 + e) drops e below the rounding of 1, an error < 1 ulp of lse).
Tensor log_sigmoid(const Tensor& x) {
  Tensor abs_x = maximum(x, neg(x));
  Tensor min_x_0 = neg(maximum(neg(x), 0.0));
  return sub(min_x_0, log(add(exp(neg(abs_x)), 1.0)));
}

// Non-zero exactly where x is -inf: x raised to the lowest finite value, minus x (+inf there, 0
// elsewhere). A condition for where(), since the engine has no comparison op.
Tensor is_minus_inf(const Tensor& x) {
  const double lowest =
      x.dtype() == DType::f64 ? std::numeric_limits<double>::lowest() : std::numeric_limits<float>::lowest();
  return sub(maximum(x, lowest), x);
}

// dst's rows [0, begin) and [begin + Tb, T) along dim 2 around `middle` (Tb rows): the whole of dst
// with those rows replaced. narrow copies in this engine, so rows cannot be written through a view;
// the new whole is built by cat and copied over dst.
Tensor with_rows(const Tensor& dst, const Tensor& middle, int64_t begin) {
  const int64_t T = dst.size(2), end = begin + middle.size(2);
  SL_ASSERT(begin >= 0 && end <= T);
  std::vector<Tensor> parts;
  if (begin > 0) parts.push_back(dst.narrow(2, 0, begin));
  parts.push_back(middle);
  if (end < T) parts.push_back(dst.narrow(2, end, T - end));
  return parts.size() == 1 ? parts[0] : cat(parts, 2);
}

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2);
  SL_CHECK(k.size(2) > 0 || Tq == 0, "attention: ", Tq, " queries and no key to attend to");
  Tensor s = block_scores(q, k, causal, scale);
  Tensor m = max(s, 3, true);  // finite: every row sees at least one key (causal: its own)
  Tensor e = exp(sub(s, m)), l = sum(e, 3, true);
  // out = (e v) / l, not exp(s - lse) v: lse of logits ×1e3 is ~1e3, and its rounding would enter
  // every probability (as the blockwise kernel, normalise once at the end).
  Tensor out = div(matmul(e, v), l);  // e [B, NH, Tq, Tk] @ v [B, NH, Tk, HS]
  Tensor lse = add(m, log(l));
  return {out, lse.reshape({B, NH, Tq})};
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& lse,
                        const Tensor& delta, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  // P = exp(s - lse): this block's share of each row's whole softmax (masked entries exp(-inf) = 0).
  Tensor P = exp(sub(block_scores(q, k, causal, scale), per_row(lse)));
  if (dv.defined()) dv.add_(matmul(P, dout, true, false));  // Pᵀ [Tk, Tq] @ dO [Tq, HS]
  if (!dq.defined() && !dk.defined()) return;
  Tensor dP = matmul(dout, v, false, true);                      // dO [Tq, HS] @ Vᵀ [HS, Tk]
  Tensor dS = mul(P, sub(dP, per_row(delta)));                   // softmax backward, D = rowsum(dO ∘ O) (minus dlse)
  if (dq.defined()) dq.add_(matmul(dS, k), scale);               // [Tq, Tk] @ [Tk, HS]
  if (dk.defined()) dk.add_(matmul(dS, q, true, false), scale);  // dSᵀ [Tk, Tq] @ [Tq, HS]
}

// The online-softmax merge (tensor/attention.h) on rows [row_begin, row_begin + Tb) of (out, lse).
void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                     int64_t row_begin) {
  const int64_t Tb = out_b.size(2);
  SL_ASSERT(out_b.size(0) == out.size(0) && out_b.size(1) == out.size(1) && out_b.size(3) == out.size(3));
  SL_ASSERT(lse_b.numel() == out_b.size(0) * out_b.size(1) * Tb && out.dtype() == out_b.dtype());
  Tensor o = out.narrow(2, row_begin, Tb), l = lse.narrow(2, row_begin, Tb);  // copies
  Tensor lb = lse_b.reshape(l.shape());
  Tensor w = sigmoid(sub(lb, l));  // the block's weight e^λb / e^λ', in (0, 1)
  Tensor merged_out = sub(o, mul(per_row(w), sub(o, out_b)));
  Tensor merged_lse = sub(l, log_sigmoid(sub(l, lb)));
  // As the CPU loop, rows where a side saw no key are chosen by where, so nothing of that side's out
  // reaches them (0 · inf would be nan): a row that saw no key of the block (lse_b = -inf) keeps its
  // values exactly; a row that saw no key yet (lse = -inf, where merged_lse is -inf - -inf = nan)
  // takes the block's. Both -inf: the row stays empty (out 0, lse -inf).
  Tensor block_empty = is_minus_inf(lb), row_empty = is_minus_inf(l);
  composed::set_rows(out, where(per_row(block_empty), o, where(per_row(row_empty), out_b, merged_out)), row_begin);
  composed::set_rows(lse, where(block_empty, l, where(row_empty, lb, merged_lse)), row_begin);
}

void set_rows(const Tensor& dst, const Tensor& src, int64_t begin) { dst.copy_(with_rows(dst, src, begin)); }

void add_rows(const Tensor& dst, const Tensor& src, int64_t begin) {
  composed::set_rows(dst, add(dst.narrow(2, begin, src.size(2)), src), begin);
}

}  // namespace sl::composed
