// ring_attention.cpp — see ring_attention.h.
#include "parallel/context_parallel/ring_attention.h"

#include "autograd/function.h"
#include "parallel/runner/fault_sites.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

using Op = ProcessGroup::P2POp;

struct Ring {
  ProcessGroupPtr group;
  int next, prev;
  explicit Ring(ProcessGroupPtr g)
      : group(std::move(g)), next((group->rank() + 1) % group->size()),
        prev((group->rank() + group->size() - 1) % group->size()) {}

  // Posts "send a, b to next; receive into fresh a', b' from prev" and returns at once.
  std::vector<WorkPtr> pass(const Tensor& a, const Tensor& b, Tensor& a_in, Tensor& b_in) const {
    MemoryScope scope(MemoryCategory::comm);
    a_in = Tensor::empty(a.shape(), a.options());
    b_in = Tensor::empty(b.shape(), b.options());
    return group->batch_isend_irecv({{Op::Kind::send, a, next}, {Op::Kind::send, b, next},
                                     {Op::Kind::recv, a_in, prev}, {Op::Kind::recv, b_in, prev}});
  }
};

void wait_all(std::vector<WorkPtr>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

// The mask of a ring that forgot zigzag's swap (the zigzag_unswapped fault the divergence finder
// plants, runner/fault_sites.h; lesson 13's --break-zigzag): it believes cp rank r holds chunks r and
// cp+r, while the rows hold chunks r and 2cp-1-r. Each quarter block (a half of the local Q against a
// half of the held K/V) is full, causal or skipped by the chunks it believes; a row's first block is
// at step 0, its own chunk's.
std::vector<StepWork> unswapped_work(const SequenceShard& shard, int src, int64_t Tl) {
  const int64_t h = Tl / 2, q_chunk[2] = {shard.rank, shard.cp + shard.rank}, kv_chunk[2] = {src, shard.cp + src};
  std::vector<StepWork> work;
  for (int i = 0; i < 2; ++i) {
    bool started = false;
    for (int j = 0; j < 2; ++j) {
      if (q_chunk[i] < kv_chunk[j]) continue;  // wholly in the future
      const BlockMask mask = q_chunk[i] == kv_chunk[j] ? BlockMask::causal : BlockMask::none;
      work.push_back({mask, i * h, h, j * h, h, src == shard.rank && !started});
      started = true;
    }
  }
  return work;
}

// What this rank's queries do against rank src's K/V at a ring step (sequence_shard.h).
std::vector<StepWork> step_work(const SequenceShard& shard, int src, int64_t Tl, bool unswapped) {
  return unswapped ? unswapped_work(shard, src, Tl) : shard.work(src, Tl);
}

// The dtype blocks merge and gradients sum in: q's, or f32 for 16-bit q (attention_block.h).
TensorOptions accumulator(const Tensor& q) {
  return is_16bit(q.dtype()) ? q.options().with_dtype(DType::f32) : q.options();
}

// The accumulated result in x's dtype: rounded once from f32 for 16-bit x.
Tensor in_dtype_of(const Tensor& x, const Tensor& accumulated) {
  return accumulated.dtype() == x.dtype() ? accumulated : accumulated.to(x.dtype());
}

struct RingAttentionFn : Function<RingAttentionFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, SequenceShard shard,
                        ProcessGroupPtr group, double scale, bool unswapped) {
    const int cp = shard.cp;
    const int64_t Tl = q.size(2);
    Ring ring(group);
    Tensor out, lse, k_cur = k, v_cur = v;
    for (int s = 0; s < cp; ++s) {
      const int src = (shard.rank - s + cp) % cp;
      std::vector<WorkPtr> works;
      Tensor k_next, v_next;
      if (s + 1 < cp) works = ring.pass(k_cur, v_cur, k_next, v_next);  // in flight while we compute
      for (const StepWork& work : step_work(shard, src, Tl, unswapped))
        attend_step(work, q, k_cur, v_cur, scale, out, lse);
      wait_all(works);
      k_cur = k_next;
      v_cur = v_next;
    }
    out = in_dtype_of(q, out);
    ctx.save_for_backward({q, k, v, out, lse});
    ctx.set("shard", shard);
    ctx.set("group", group);
    ctx.set("scale", scale);
    ctx.set("unswapped", unswapped);
    return out;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& saved = ctx.saved();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto& shard = ctx.get<SequenceShard>("shard");
    const double scale = ctx.get<double>("scale");
    const int cp = shard.cp;
    const int64_t Tl = q.size(2);
    Ring ring(ctx.get<ProcessGroupPtr>("group"));
    Tensor dout = grads[0].defined() ? grads[0] : zeros_like(out);
    Tensor delta = attention_delta(dout, out);  // D = rowsum(dO ∘ O) [B, NH, Tl]
    Tensor dq = zeros(q.shape(), accumulator(q));
    Tensor k_cur = k, v_cur = v;
    Tensor dk_in, dv_in, dk_sent, dv_sent;  // the held block's dK/dV from the holders before us
    std::vector<WorkPtr> grad_works;
    for (int s = 0; s < cp; ++s) {
      const int src = (shard.rank - s + cp) % cp;
      std::vector<WorkPtr> kv_works;
      Tensor k_next, v_next;
      if (s + 1 < cp) kv_works = ring.pass(k_cur, v_cur, k_next, v_next);
      const std::vector<StepWork> works = step_work(shard, src, Tl, ctx.get<bool>("unswapped"));
      Tensor dk_part, dv_part;
      if (!works.empty()) {
        dk_part = zeros(k.shape(), accumulator(k));  // travels on in the accumulators' dtype
        dv_part = zeros(v.shape(), accumulator(v));
        for (const StepWork& work : works)
          attend_step_backward(work, q, k_cur, v_cur, dout, lse, delta, scale, dq, dk_part, dv_part);
      }
      wait_all(grad_works);  // the block's dK/dV so far has arrived (and our last sends are done)
      if (s > 0) {
        if (dk_part.defined()) {
          dk_part.add_(dk_in);
          dv_part.add_(dv_in);
        } else {  // a skipped block: nothing to add, but the buffer still travels on
          dk_part = dk_in;
          dv_part = dv_in;
        }
      }
      dk_sent = dk_part;
      dv_sent = dv_part;
      grad_works = ring.pass(dk_sent, dv_sent, dk_in, dv_in);  // after cp passes, our own block is home
      wait_all(kv_works);
      k_cur = k_next;
      v_cur = v_next;
    }
    wait_all(grad_works);
    return {in_dtype_of(q, dq), in_dtype_of(k, dk_in), in_dtype_of(v, dv_in)};
  }
};

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
                      const ProcessGroupPtr& group, double scale) {
  SL_CHECK(group && group->size() == shard.cp && group->rank() == shard.rank, "ring_attention: the group (rank ",
           group ? group->rank() : -1, " of ", group ? group->size() : 0, ") is not the shard's (rank ", shard.rank,
           " of cp ", shard.cp, ")");
  SL_CHECK(q.dim() == 4 && q.shape() == k.shape() && k.shape() == v.shape(),
           "ring_attention: q, k, v must be [B, NH, T/cp, HS] alike, got ", q.shape(), ", ", k.shape(), ", ",
           v.shape());
  shard.check_length(q.size(2) * shard.cp);
  const FaultSites* faults = FaultSites::here();  // a fault the divergence finder planted; none otherwise
  const bool unswapped =
      faults && shard.balance == CpBalance::zigzag && faults->breaks(FaultSites::Mistake::zigzag_unswapped);
  return RingAttentionFn::apply(q, k, v, shard, group, attention_scale(q, scale), unswapped);
}

}  // namespace sl::parallel
