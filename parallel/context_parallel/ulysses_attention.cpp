// ulysses_attention.cpp — see ulysses_attention.h. The layout changes are reshapes and permutes
// around one differentiable all-to-all, so they run wherever the engine's permute does (CPU, CUDA).
#include "parallel/context_parallel/ulysses_attention.h"

#include "autograd/function.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/runner/fault_sites.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// x [n, ...] -> [n, ...]: chunk d of dim 0 goes to rank d, chunk s of the result came from rank s.
// Its own adjoint: the gradient of chunk (s → r) is sent back r → s by the same exchange.
Tensor exchanged(const Tensor& x, const ProcessGroupPtr& group) {
  Tensor out;
  {
    MemoryScope scope(MemoryCategory::comm);
    out = Tensor::empty(x.shape(), x.options());
  }
  group->all_to_all(out, x);
  return out;
}

struct AllToAllFn : Function<AllToAllFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return exchanged(x, group);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {exchanged(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

// The sizes both directions share: U head groups of h heads, the local tokens as `chunks` pieces of p.
struct Swap {
  int64_t B, h, chunks, p, HS;
  int64_t U;
};

Swap swap_sizes(const Tensor& x, int64_t heads, int64_t tokens, const SequenceShard& shard,
                const ProcessGroupPtr& group) {
  SL_CHECK(group && group->size() == shard.ulysses && group->rank() == shard.ulysses_rank(),
           "ulysses: the group (rank ", group ? group->rank() : -1, " of ", group ? group->size() : 0,
           ") is not the shard's Ulysses group (rank ", shard.ulysses_rank(), " of ", shard.ulysses, ")");
  SL_CHECK(x.dim() == 4, "ulysses: expected [B, NH, T, HS], got ", x.shape());
  const int64_t U = shard.ulysses, chunks = shard.balance == CpBalance::zigzag ? 2 : 1;
  SL_CHECK(heads % U == 0, "ulysses: ", heads, " heads do not split over the Ulysses degree ", U,
           " (n_head must divide by cp, or by the Ulysses degree of a hybrid, times tp)");
  SL_CHECK(tokens % chunks == 0, "ulysses: ", tokens, " local tokens do not form ", chunks, " pieces");
  return {x.size(0), heads / U, chunks, tokens / chunks, x.size(3), U};
}

}  // namespace

Tensor sequence_to_heads(const Tensor& x, const SequenceShard& shard, const ProcessGroupPtr& ulysses_group) {
  const Swap s = swap_sizes(x, x.size(1), x.size(2), shard, ulysses_group);
  // [B, NH, Tl, HS] -> [U, B, h, Tl, HS]: head group d's slice is chunk d, for rank d
  Tensor send = permute(x.reshape({s.B, s.U, s.h, s.chunks * s.p, s.HS}), {1, 0, 2, 3, 4});
  Tensor received = AllToAllFn::apply(send, ulysses_group);  // [U (source u'), B, h, chunks, p, HS]
  // Piece c of source u' is piece u' of the ring shard's chunk c: order (chunk, source, token).
  // (The mistake a fault of the divergence finder plants, runner/fault_sites.h: the order they
  // arrived in, (source, chunk, token), which differs only when there are two chunks.)
  const FaultSites* faults = FaultSites::here();
  const bool as_arrived = faults && s.chunks > 1 && faults->breaks(FaultSites::Mistake::ulysses_arrival_order);
  return permute(received.reshape({s.U, s.B, s.h, s.chunks, s.p, s.HS}),
                 as_arrived ? std::vector<int>{1, 2, 0, 3, 4, 5} : std::vector<int>{1, 2, 3, 0, 4, 5})
      .reshape({s.B, s.h, s.chunks * s.U * s.p, s.HS});
}

Tensor heads_to_sequence(const Tensor& y, const SequenceShard& shard, const ProcessGroupPtr& ulysses_group) {
  SL_CHECK(y.dim() == 4 && y.size(2) % shard.ulysses == 0, "ulysses: expected [B, NH/U, T/R, HS], got ", y.shape());
  const Swap s = swap_sizes(y, y.size(1) * shard.ulysses, y.size(2) / shard.ulysses, shard, ulysses_group);
  // [B, h, (chunks, U, p), HS] -> [U (destination), B, h, chunks, p, HS]: each rank's own pieces
  Tensor send = permute(y.reshape({s.B, s.h, s.chunks, s.U, s.p, s.HS}), {3, 0, 1, 2, 4, 5});
  Tensor received = AllToAllFn::apply(send, ulysses_group);  // [U (head group), B, h, chunks, p, HS]
  return permute(received.reshape({s.U, s.B, s.h, s.chunks * s.p, s.HS}), {1, 0, 2, 3, 4})
      .reshape({s.B, s.U * s.h, s.chunks * s.p, s.HS});
}

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                         const ProcessGroupPtr& ulysses_group, const ProcessGroupPtr& ring_group) {
  SL_CHECK(q.dim() == 4 && q.shape() == k.shape() && k.shape() == v.shape(),
           "ulysses_attention: q, k, v must be [B, NH, T/cp, HS] alike, got ", q.shape(), ", ", k.shape(), ", ",
           v.shape());
  shard.check_length(q.size(2) * shard.cp);
  Tensor qh = sequence_to_heads(q, shard, ulysses_group), kh = sequence_to_heads(k, shard, ulysses_group),
         vh = sequence_to_heads(v, shard, ulysses_group);  // [B, NH/U, T/R, HS]
  // R = 1: the whole sequence in order, the serial GPT's causal attention. R > 1: the ring over it.
  Tensor out = shard.ulysses == shard.cp ? causal_attention(qh, kh, vh)
                                         : ring_attention(qh, kh, vh, shard.ring(), ring_group);
  return heads_to_sequence(out, shard, ulysses_group);
}

}  // namespace sl::parallel
