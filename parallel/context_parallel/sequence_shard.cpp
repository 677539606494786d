// sequence_shard.cpp — see sequence_shard.h.
#include "parallel/context_parallel/sequence_shard.h"

#include <vector>

#include "tensor/attention.h"
#include "tensor/ops.h"

namespace sl::parallel {

const char* cp_balance_name(CpBalance balance) { return balance == CpBalance::zigzag ? "zigzag" : "none"; }

void SequenceShard::check_length(int64_t T) const {
  SL_CHECK(cp >= 1 && rank >= 0 && rank < cp, "SequenceShard: rank ", rank, " is not in cp ", cp);
  SL_CHECK(ulysses >= 1 && cp % ulysses == 0, "SequenceShard: the Ulysses degree ", ulysses,
           " does not divide cp ", cp);
  if (balance == CpBalance::zigzag)
    SL_CHECK(T % (2 * cp) == 0, "context parallel (zigzag): sequence length T ", T, " must be divisible by 2 x cp = ",
             2 * cp, " (T % ", 2 * cp, " = ", T % (2 * cp), ")");
  else
    SL_CHECK(T % cp == 0, "context parallel: sequence length T ", T, " must be divisible by cp ", cp, " (T % ", cp,
             " = ", T % cp, ")");
}

SequenceShard SequenceShard::ring() const {
  SL_ASSERT(ulysses >= 1 && cp % ulysses == 0);
  return {cp / ulysses, rank / ulysses, balance, 1};
}

// The pieces of the sequence this rank holds, in local order: the ring-level shard's chunks (one,
// or two with zigzag), and of each chunk the ulysses_rank()-th of `ulysses` equal pieces.
std::vector<SequenceShard::Piece> SequenceShard::pieces(int64_t T) const {
  check_length(T);
  const SequenceShard r = ring();
  const int chunks = balance == CpBalance::zigzag ? 2 : 1;
  const int64_t chunk = T / (r.cp * chunks), piece = chunk / ulysses;
  std::vector<Piece> out;
  for (int c = 0; c < chunks; ++c) {
    const int64_t index = c == 0 ? r.rank : 2 * r.cp - 1 - r.rank;
    out.push_back({index * chunk + ulysses_rank() * piece, piece});
  }
  return out;
}

Tensor SequenceShard::positions(int64_t T) const {
  std::vector<double> p;
  for (const Piece& piece : pieces(T))
    for (int64_t i = 0; i < piece.length; ++i) p.push_back(static_cast<double>(piece.begin + i));
  return from_vector(p, Shape({static_cast<int64_t>(p.size())}), DType::i64);
}

Tensor SequenceShard::take(const Tensor& x, int dim) const {
  std::vector<Tensor> parts;
  for (const Piece& piece : pieces(x.size(dim))) parts.push_back(x.narrow(dim, piece.begin, piece.length));
  return parts.size() == 1 ? parts[0] : cat(parts, dim);
}

std::vector<StepWork> SequenceShard::work(int src, int64_t Tl) const {
  SL_ASSERT(ulysses == 1);  // the ring's table: a hybrid's ring runs over ring()
  if (balance == CpBalance::none) {
    if (src == rank) return {{BlockMask::causal, 0, Tl, 0, Tl, true}};
    if (src < rank) return {{BlockMask::none, 0, Tl, 0, Tl}};
    return {};  // wholly in the future
  }
  const int64_t h = Tl / 2;  // one chunk
  if (src == rank)
    return {{BlockMask::causal, 0, h, 0, h, true},   // chunk i against itself
            {BlockMask::none, h, h, 0, h, true},     // chunk 2cp-1-i against chunk i (all in its past)
            {BlockMask::causal, h, h, h, h, false}};  // chunk 2cp-1-i against itself
  if (src < rank) return {{BlockMask::none, 0, Tl, 0, h}};  // all Q against chunk src
  return {{BlockMask::none, h, h, 0, Tl}};                   // Q's chunk 2cp-1-rank against all K/V
}

namespace {

Tensor rows(const Tensor& x, int64_t begin, int64_t length) {
  return begin == 0 && length == x.size(2) ? x : x.narrow(2, begin, length);
}

}  // namespace

void attend_step(const StepWork& work, const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out,
                 Tensor& lse) {
  if (work.mask == BlockMask::skip) return;
  BlockOutput block = attention_block_forward(rows(q, work.q_begin, work.q_len), rows(k, work.kv_begin, work.kv_len),
                                              rows(v, work.kv_begin, work.kv_len), work.mask, scale);
  if (work.starts_rows) {  // the rows' first block: no -inf start to merge from
    if (work.q_begin == 0 && work.q_len == q.size(2)) {
      out = block.out;
      lse = block.lse;
      return;
    }
    if (!out.defined()) {  // the block's dtypes: f32 for 16-bit q (attention_block.h)
      out = Tensor::empty(q.shape(), block.out.options());
      lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, block.lse.options());
    }
    set_rows(out, block.out, work.q_begin);
    set_rows(lse, block.lse, work.q_begin);
  } else {
    merge_attention(out, lse, block.out, block.lse, work.q_begin);
  }
}

void attend_step_backward(const StepWork& work, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                          const Tensor& lse, const Tensor& delta, double scale, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv) {
  if (work.mask == BlockMask::skip) return;
  const bool all_q = work.q_begin == 0 && work.q_len == q.size(2);
  const bool all_kv = work.kv_begin == 0 && work.kv_len == k.size(2);
  Tensor q_rows = rows(q, work.q_begin, work.q_len), k_rows = rows(k, work.kv_begin, work.kv_len);
  Tensor dq_rows = all_q ? dq : zeros(q_rows.shape(), dq.options());  // the accumulators' dtype
  Tensor dk_rows = all_kv ? dk : zeros(k_rows.shape(), dk.options());
  Tensor dv_rows = all_kv ? dv : zeros(k_rows.shape(), dv.options());
  auto lse_rows = [&](const Tensor& t) { return all_q ? t : t.narrow(2, work.q_begin, work.q_len); };
  attention_block_backward(q_rows, k_rows, rows(v, work.kv_begin, work.kv_len), rows(dout, work.q_begin, work.q_len),
                           lse_rows(lse), lse_rows(delta), work.mask, scale, dq_rows, dk_rows, dv_rows);
  if (!all_q) add_rows(dq, dq_rows, work.q_begin);
  if (!all_kv) {
    add_rows(dk, dk_rows, work.kv_begin);
    add_rows(dv, dv_rows, work.kv_begin);
  }
}

}  // namespace sl::parallel
