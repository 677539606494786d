// traffic_model.cpp — estimate_traffic (cost_model.h): what one rank sends and receives in one
// optimizer step, per (group, op), as its CommLedger counts it on the threads backend's rings.
//
//   every step        "loss"   all-reduce of the global target count and of the loss (f64 each);
//                              fp16 loss scaling: one more for the overflow flag
//   data parallel     DDP      one all-reduce per bucket (in the gradients' dtype), once a step
//                    ZeRO-1/2  one reduce-scatter per bucket (ZeRO-2: per backward), one all-gather
//                              per bucket of the updated weights; clip: all-gather of one f64
//                    FSDP      per micro-batch: each unit gathered in forward and in backward and its
//                              gradients reduce-scattered; HSDP: each shard all-reduced over replicas
//   the cuts          pp       a send and a receive of [b, T/cp(/t under SP), C] per chunk boundary
//                              per micro-batch, forward and backward; the tied wte summed on {0, p-1}
//                     tp       per layer f/g all-reduces of [b, T, C] (SP: all-gathers and reduce-
//                              scatters of [b, T/t, C]), embedding g, head f, 3 CE all-reduces of b·T
//                     cp       ring: K/V passed cp-1 times forward and backward, dK/dV (f32) cp times;
//                              all-gather variant: 2 all-gathers forward, 2 reduce-scatters backward
//   Gradient sums (SP's partial LayerNorms, cp's whole part, the tied wte) run once a step after
//   backward: f32 all-reduces of the .grad (parallel/comm/flatten.h) or of a shard's pieces.
//   Clipping (train's default --grad-clip 1.0) all-gathers one f64 over the dims that cut the model.
//   experts           ep       per MoE layer and micro-batch 4 all-to-alls of the kept assignments
//                              (expert_traffic.cpp); the routing choices all-gathered over dp_cp
// The data-parallel strategies' part is data_parallel_traffic.cpp, the experts' expert_traffic.cpp.
//
// Groups are the mesh's (several names may share one group: "dp" at dp_shard 1 is "dp_replicate");
// each group is reported once, under the first name the trainer gives it; a group the trainer does
// not name (clipping over pp and tp at once) is reported as "pp+tp".
#include <algorithm>
#include <map>

#include "parallel/comm/mesh.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/rank_part.h"
#include "parallel/planner/traffic_step.h"
#include "parallel/nd/parallelize_options.h"
#include "tensor/error.h"

namespace sl::parallel::planner {

namespace {

// The cuts' activations: pipeline p2p, tp's mappings and vocab-parallel loss, cp's K/V.
void cut_traffic(Step& s) {
  const ParallelismConfig& c = s.plan.parallelism;
  const int64_t C = s.model.n_embd, t = c.tp, b = s.micro_rows, Tl = s.tokens;
  const int64_t X = b * Tl * C;  // [b, T/cp, C]
  const bool sp = s.plan.sequence_parallel && t > 1;
  const int64_t layers = static_cast<int64_t>(s.part.layers.size());
  const int reruns = s.model.recompute == nn::Recompute::none ? 0 : 1;  // forward again in backward
  if (c.pp > 1) {
    const int chunks = c.pp * s.part.chunks;
    const int stage = s.book.rank_in({MeshDim::pp});
    int64_t boundaries_in = 0, boundaries_out = 0;
    for (int local = 0; local < s.part.chunks; ++local) {
      const int chunk = local * c.pp + stage;
      boundaries_in += chunk > 0;
      boundaries_out += chunk < chunks - 1;
    }
    const int64_t act = (sp ? X / t : X) * s.pes;
    s.book.p2p({MeshDim::pp}, act, s.M * (boundaries_out + boundaries_in), s.M * (boundaries_in + boundaries_out));
  }
  if (t > 1) {
    const int64_t per_layer_fwd = 2 * (1 + reruns), per_layer_bwd = 2;
    if (!sp) {
      // an MoE block's MLP is whole on every tp rank: its attention's half of the mappings only
      const int64_t moe_layers = std::count_if(s.part.layers.begin(), s.part.layers.end(),
                                               [&](int64_t layer) { return s.model.moe_layer(layer); });
      int64_t calls = (layers - moe_layers) * (per_layer_fwd + per_layer_bwd) + moe_layers * (1 + reruns + 1);
      if (s.part.first_stage) calls += 1;  // the embedding's g
      if (s.part.last_stage) calls += 1;   // the head's f (backward)
      s.book.all_reduce({MeshDim::tp}, X, s.pes, calls * s.M);
    } else {
      int64_t gathers = layers * (per_layer_fwd + per_layer_bwd), scatters = gathers;
      if (s.part.first_stage) {
        s.book.all_reduce({MeshDim::tp}, X, s.pes, s.M);  // the vocab-parallel embedding's g, before the scatter
        gathers += 1;                           // the scatter's backward
      }
      if (s.part.last_stage) gathers += 1, scatters += 1;  // the head's gather and its backward
      s.book.all_gather({MeshDim::tp}, X / t * s.pes, gathers * s.M);
      s.book.reduce_scatter({MeshDim::tp}, X / t * s.pes, scatters * s.M);
    }
    if (s.part.last_stage) s.book.all_reduce({MeshDim::tp}, b * Tl, 4, 3 * s.M);  // max, target logit, Σ exp (f32)
  }
  if (c.cp > 1) {
    // K or V of this rank's heads [b, NH/t, T/cp, HS]; dK, dV of the ring and all-gather travel in
    // their f32 accumulators, also in 16 bits (attention_block.h); Ulysses's in the weights' dtype.
    const int64_t kv = X / t * s.pes, dkv = X / t * std::max<int64_t>(s.pes, 4), forwards = 1 + reruns;
    // ring: K/V pass n-1 times per forward and once more in backward, dK/dV n times (ring_attention.h)
    auto ring = [&](const auto& p2p, int64_t n) {
      p2p(kv, 2 * layers * (n - 1) * (forwards + 1) * s.M);
      p2p(dkv, 2 * layers * n * s.M);
    };
    // Ulysses: q, k, v there and out back per forward, the four gradients in backward
    const int64_t swaps = layers * (4 * forwards + 4);
    const int U = s.plan.cp_variant == CpVariant::hybrid ? s.plan.ulysses_degree : c.cp;
    // A hybrid with U = cp is Ulysses on the cp group itself (make_cp_groups)
    const CpVariant variant = s.plan.cp_variant == CpVariant::hybrid && U == c.cp ? CpVariant::ulysses : s.plan.cp_variant;
    switch (variant) {
      case CpVariant::ring: ring([&](int64_t bytes, int64_t n) { s.book.p2p({MeshDim::cp}, bytes, n, n); }, c.cp); break;
      case CpVariant::allgather:
        s.book.all_gather({MeshDim::cp}, kv, 2 * forwards * layers * s.M);
        s.book.reduce_scatter({MeshDim::cp}, dkv, 2 * layers * s.M);
        break;
      case CpVariant::ulysses: s.book.all_to_all({MeshDim::cp}, kv, swaps * s.M); break;
      case CpVariant::hybrid:  // the runner's own groups; a ring block [b, NH/(t·U), T/R, HS] is kv again
        s.book.own_all_to_all("cp_ulysses", U, kv, swaps * s.M);
        ring([&](int64_t bytes, int64_t n) { s.book.own_p2p("cp_ring", bytes, n, n); }, c.cp / U);
        break;
    }
  }
}

// The trainer's names in its order (Trainer::named_ledgers): the strategy's groups, then pp, cp, tp.
// A name's set is its own dims (a size-1 dim adds nobody: dp_shard_cp at cp 1 is dp_shard).
MeshDims trainer_names(const TrainPlan& plan) {
  MeshDims names;
  const ParallelismConfig& c = plan.parallelism;
  switch (plan.dp_strategy) {
    case DpStrategy::ddp:
      if (!plan.cuts_model() || c.dp_replicate * c.dp_shard * c.ep > 1) names.push_back(MeshDim::dp);
      if (c.ep > 1) names.push_back(MeshDim::expert_dp_cp);
      break;
    case DpStrategy::zero1:
    case DpStrategy::zero2:  // with ep the shards span dp_shard x ep, a set the trainer names "dp_shard+ep"
      names.push_back(c.ep > 1 ? MeshDim::expert_dp_cp : MeshDim::dp_shard);
      break;
    case DpStrategy::fsdp:
      names.push_back((plan.cuts_model() && c.cp > 1) || c.ep > 1 ? MeshDim::dp_shard_cp : MeshDim::dp_shard);
      if (c.ep > 1) names.push_back(MeshDim::expert_dp_cp);
      if (c.dp_replicate > 1) names.push_back(MeshDim::dp_replicate);
      break;
    case DpStrategy::naive: break;
  }
  if (c.pp > 1) names.push_back(MeshDim::pp);
  if (c.cp > 1) names.push_back(MeshDim::cp);
  if (c.tp > 1) names.push_back(MeshDim::tp);
  return names;
}

// Naive DP (parallel/data_parallel/naive_data_parallel.h): rank 0 scatters the inputs (i64), gathers
// the logits [R, T, V], scatters their gradient with the loss (+1 float), gathers 4Ψ of gradients;
// the weights go down a broadcast chain (every rank but the last forwards 4Ψ). No loss all-reduce:
// its step is the strategy's own.
std::vector<GroupTraffic> naive_traffic(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch,
                                        int rank) {
  const int n = plan.parallelism.world_size();
  const RankPart part = rank_part(model, plan, rank);
  const int64_t R = batch.batch_size / n, T = batch.seq_len, V = model.vocab_size, psi = part.numel();
  const bool root = rank == 0;
  std::vector<int> everyone(n);
  for (int r = 0; r < n; ++r) everyone[r] = r;
  std::vector<GroupTraffic> out;
  auto p2p = [&](const char* exchange, bool root_sends, int64_t bytes) {
    const int64_t peers = root ? n - 1 : 1;
    const bool sends = root == root_sends;
    out.push_back({std::string("naive:") + exchange, sends ? CommOp::send : CommOp::recv, peers,
                   sends ? peers * bytes : 0, sends ? 0 : peers * bytes, everyone, /*dims=*/{}});
  };
  p2p("scatter_batch", true, R * T * 8);
  out.push_back({"naive:replicate_model", CommOp::broadcast, 1, rank < n - 1 ? 4 * psi : 0, rank > 0 ? 4 * psi : 0,
                 everyone, {}});
  p2p("gather_outputs", false, R * T * V * 4);
  p2p("scatter_loss_grad", true, (R * T * V + 1) * 4);
  p2p("gather_grads", false, 4 * psi);
  if (n == 1) out.erase(std::remove_if(out.begin(), out.end(), [](const GroupTraffic& t) { return t.op != CommOp::broadcast; }), out.end());
  return out;
}

}  // namespace

void check_layout(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch, int rank);

std::vector<GroupTraffic> estimate_traffic(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch,
                                           int rank) {
  check_layout(model, plan, batch, rank);
  const ParallelismConfig& c = plan.parallelism;
  const RankPart part = rank_part(model, plan, rank);
  Book book(plan, rank);
  const int dp = c.dp_replicate * c.dp_shard * c.ep;  // ep ranks read other rows too
  const int64_t pes = bytes_of(plan.precision.param_dtype);
  const int64_t ges = plan.precision.enabled() ? bytes_of(plan.precision.grad_dtype) : pes;
  Step s{model, plan, part, book, batch.batch_size / dp / plan.micro_batches, batch.seq_len / c.cp,
         plan.micro_batches, pes, ges};
  if (plan.dp_strategy == DpStrategy::naive) return naive_traffic(model, plan, batch, rank);
  const int world = c.world_size();
  const int loss_calls = plan.precision.loss_scale.enabled ? 3 : 2;
  book.own_all_reduce("loss", world, rank, 1, 8);
  for (int k = 1; k < loss_calls; ++k) book.own_all_reduce("loss", world, rank, 1, 8);
  switch (plan.dp_strategy) {
    case DpStrategy::ddp: ddp_traffic(s, !plan.cuts_model() || dp > 1); break;
    case DpStrategy::zero1:
    case DpStrategy::zero2: zero_traffic(s); break;
    case DpStrategy::fsdp: fsdp_traffic(s); break;
    case DpStrategy::naive: break;
  }
  cut_traffic(s);
  expert_traffic(s);
  return book.finish(trainer_names(plan));
}

}  // namespace sl::parallel::planner
