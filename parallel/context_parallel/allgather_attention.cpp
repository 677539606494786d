// allgather_attention.cpp — see allgather_attention.h.
#include "parallel/context_parallel/allgather_attention.h"

#include "autograd/function.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// Block `src` of a gathered [cp, B, NH, Tl, HS] buffer, as a view (no copy).
Tensor block_of(const Tensor& gathered, int src, const Shape& block) {
  return gathered.flat_view(src * block.numel(), block);
}

struct AllGatherAttentionFn : Function<AllGatherAttentionFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, SequenceShard shard,
                        ProcessGroupPtr group, double scale) {
    const int cp = shard.cp;
    Shape gathered_shape = k.shape();
    gathered_shape.insert(gathered_shape.begin(), cp);  // [cp, B, NH, Tl, HS]: every rank's block, in rank order
    Tensor k_all, v_all;
    {
      MemoryScope scope(MemoryCategory::comm);
      k_all = Tensor::empty(gathered_shape, k.options());
      v_all = Tensor::empty(gathered_shape, v.options());
    }
    group->all_gather(k_all, k);
    group->all_gather(v_all, v);
    Tensor out, lse;
    for (int s = 0; s < cp; ++s) {  // the ring's order, so both variants compute the same bits
      const int src = (shard.rank - s + cp) % cp;
      for (const StepWork& work : shard.work(src, q.size(2)))
        attend_step(work, q, block_of(k_all, src, k.shape()), block_of(v_all, src, v.shape()), scale, out, lse);
    }
    if (out.dtype() != q.dtype()) out = out.to(q.dtype());  // 16-bit q: the f32 merge rounded once
    ctx.save_for_backward({q, k_all, v_all, out, lse});  // the gathered K/V stay alive until backward
    ctx.set("shard", shard);
    ctx.set("group", group);
    ctx.set("scale", scale);
    return out;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& saved = ctx.saved();
    const Tensor &q = saved[0], &k_all = saved[1], &v_all = saved[2], &out = saved[3], &lse = saved[4];
    const auto& shard = ctx.get<SequenceShard>("shard");
    const int cp = shard.cp;
    const Shape& block = q.shape();
    Tensor dout = grads[0].defined() ? grads[0] : zeros_like(out);
    Tensor delta = attention_delta(dout, out);
    // The gradients sum in f32 for 16-bit q, k, v (attention_block.h) and are rounded once at the end.
    const TensorOptions acc = is_16bit(q.dtype()) ? q.options().with_dtype(DType::f32) : q.options();
    Tensor dq = zeros(q.shape(), acc), dk_all = zeros(k_all.shape(), acc), dv_all = zeros(v_all.shape(), acc);
    for (int s = 0; s < cp; ++s) {
      const int src = (shard.rank - s + cp) % cp;
      for (const StepWork& work : shard.work(src, q.size(2)))
        attend_step_backward(work, q, block_of(k_all, src, block), block_of(v_all, src, block), dout, lse, delta,
                             ctx.get<double>("scale"), dq, block_of(dk_all, src, block), block_of(dv_all, src, block));
    }
    Tensor dk = Tensor::empty(block, acc), dv = Tensor::empty(block, acc);
    const auto& group = ctx.get<ProcessGroupPtr>("group");
    group->reduce_scatter(dk, dk_all);  // block r's gradient, summed over every rank that attended to it
    group->reduce_scatter(dv, dv_all);
    const auto rounded = [&](const Tensor& g) { return g.dtype() == q.dtype() ? g : g.to(q.dtype()); };
    return {rounded(dq), rounded(dk), rounded(dv)};
  }
};

}  // namespace

Tensor allgather_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                           const ProcessGroupPtr& group, double scale) {
  SL_CHECK(group && group->size() == shard.cp && group->rank() == shard.rank, "allgather_attention: the group (rank ",
           group ? group->rank() : -1, " of ", group ? group->size() : 0, ") is not the shard's (rank ", shard.rank,
           " of cp ", shard.cp, ")");
  SL_CHECK(q.dim() == 4 && q.shape() == k.shape() && k.shape() == v.shape(),
           "allgather_attention: q, k, v must be [B, NH, T/cp, HS] alike, got ", q.shape(), ", ", k.shape(), ", ",
           v.shape());
  shard.check_length(q.size(2) * shard.cp);
  return AllGatherAttentionFn::apply(q, k, v, shard, group, attention_scale(q, scale));
}

}  // namespace sl::parallel
