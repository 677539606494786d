// memory_model.cpp — estimate_memory (cost_model.h): the bytes one rank holds, in the memory ledger's
// categories, from the model's shapes and the layout's rules.
//
//   model states between steps (Ψ this rank's part, P it padded per bucket/unit to a multiple of N,
//   S = P/N; w, g the weights' and gradients' element bytes; mixed precision adds an f32 master):
//     DDP, a cut at dp 1   weights wΨ     grads gΨ (buckets or .grad)  optimizer 8Ψ (+4Ψ master)
//     naive                rank 0 as DDP; a worker keeps its weights only (its gradients go to rank 0)
//     ZeRO-1               weights wP     grads gP (the flat buffer)   optimizer 8S (+4S)
//     ZeRO-2               weights wP     grads gS (the shard)         optimizer 8S (+4S)
//     FSDP / HSDP          weights wS     grads gS                     optimizer 8S (+4S), per unit
//     offload              the optimizer (ZeRO) or every shard (FSDP) on the host: 16S in f32
//                          (moments, master weights, f32 gradient shard); FSDP adds its w+g shards' bytes
//   with experts, Ψ holds this ep rank's E/ep routed experts Ψe, whole on every tp rank (rank_part.h);
//   ZeRO and FSDP shard the other weights over N·ep ranks (dp_shard × ep) and keep the experts out of
//   their buffers and units (parallel/zero/expert_replicas.h): weights wΨe, gradients gΨe (.grad) and
//   AdamW's moments 8Ψe, whole on every rank
//
//   activations: what one step holds above those at its peak (the start of the last backward): per
//   layer and micro-batch in flight the tensors backward reads, Korthikanti et al.'s accounting in
//   elements of w bytes for b rows of T/cp tokens (sbh = b·T/cp·C):
//     LayerNorm inputs 2 sbh, c_attn and c_fc inputs 2 sbh (SP: gathered, whole), q k v 3 sbh/t,
//     the core's out sbh/t and lse (f32, a·s·b/t), c_fc's output and GELU's 8 sbh/t
//     recompute full: the block's input only (sbh); selective: the core's out and lse are not kept
//   plus the head's logits [b, T/cp, Vp/t] (f32 copies for the loss) and the first backward's
//   gradients of the widest buffers; micro-batches in flight: 1 without a pipeline, the schedule's
//   warm-up depth p - stage for 1F1B (every micro-batch for GPipe).
#include <algorithm>

#include "parallel/planner/activation_model.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/rank_part.h"
#include "parallel/nd/parallelize_options.h"
#include "tensor/error.h"

namespace sl::parallel::planner {

namespace {

constexpr int64_t kBucketBytes = int64_t{1} << 20;

struct States {
  int64_t weights = 0, grads = 0, optimizer = 0, host = 0;
  int64_t zero2_flat = 0;  // ZeRO-2's flat gradient buffer g·P, alive through backward
};

States ddp_states(const RankPart& part, int64_t w, int64_t g, int64_t master) {
  const int64_t psi = part.numel();
  return {w * psi, g * psi, (8 + master) * psi, 0};
}

// An ep rank's experts under ZeRO and FSDP: whole weights, .grad and AdamW moments (no offload,
// no mixed precision with ep: check_trainable).
int64_t expert_numel(const RankPart& part) {
  int64_t numel = 0;
  for (size_t i : params_where(part, true)) numel += part.params[i].numel;
  return numel;
}

States zero_states(const RankPart& part, const TrainPlan& plan, int64_t w, int64_t g, int64_t master) {
  const int N = plan.parallelism.dp_shard, ep = plan.parallelism.ep;
  int64_t padded = 0, shard = 0;
  for (const FlatBucketShape& b : flat_buckets(part, params_where(part, false), N * ep, kBucketBytes, w, false)) {
    padded += b.padded;
    shard += b.chunk;
  }
  const int64_t experts = expert_numel(part);
  States s{w * (padded + experts), (plan.dp_strategy == DpStrategy::zero1 ? g * padded : g * shard) + g * experts,
           (8 + master) * shard + 8 * experts, 0};
  if (plan.dp_strategy == DpStrategy::zero2) s.zero2_flat = g * padded;
  if (plan.offload) {
    s.host = 16 * shard;  // exp_avg, exp_avg_sq, the f32 master weights and gradient shard
    s.optimizer = 0;
  }
  return s;
}

States fsdp_states(const RankPart& part, const TrainPlan& plan, int64_t w, int64_t g, int64_t master) {
  const ParallelismConfig& c = plan.parallelism;
  const int n = c.dp_shard * (plan.cuts_model() ? c.cp : 1) * c.ep;  // dp_shard_cp (x ep)
  int64_t shard = 0;
  for (const UnitShape& unit : part.units) shard += (unit.numel + n - 1) / n;
  const int64_t experts = expert_numel(part);
  States s{w * (shard + experts), g * (shard + experts), (8 + master) * shard + 8 * experts, 0};
  if (plan.offload) s = {0, 0, 0, (w + g + 8 + master) * shard};
  return s;
}

}  // namespace

void check_trainable(const ModelShape& model, const TrainPlan& plan, int world) {
  plan.validate(world);  // the library's checks, ep's refusals included (parallelize_options.cpp)
  if (!model.has_experts()) return;
  SL_CHECK(!plan.precision.enabled(), "cost model: a mixture of experts trains in f32 only (train refuses ",
           "--moe-experts with --mixed-precision ", plan.precision.str(), ")");
  SL_CHECK(model.recompute != nn::Recompute::full, "cost model: a mixture of experts records its auxiliary losses ",
           "in forward, which --recompute full reruns (train refuses it)");
}

void check_layout(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch, int rank) {
  const ParallelismConfig& c = plan.parallelism;
  const int world = c.world_size();
  model.validate();
  check_trainable(model, plan, world);
  check_model_cut(model, plan.parallelize_options(), plan.micro_batches);
  SL_CHECK(rank >= 0 && rank < world, "cost model: rank ", rank, " is not in the world of ", world, " (",
           c.str(), ")");
  check_experts(model, c);
  const int64_t dp = static_cast<int64_t>(c.dp_replicate) * c.dp_shard * c.ep;
  SL_CHECK(batch.batch_size > 0 && batch.batch_size % (dp * plan.micro_batches) == 0, "cost model: the batch of ",
           batch.batch_size, " rows does not split into ", plan.micro_batches, " micro-batches x dp ", dp,
           c.ep > 1 ? " (ep included)" : "");
  SL_CHECK(batch.seq_len > 0 && batch.seq_len <= model.block_size && batch.seq_len % c.cp == 0, "cost model: T ",
           batch.seq_len, " must be in [1, block_size ", model.block_size, "] and divisible by cp ", c.cp);
  SL_CHECK(!plan.sequence_parallel || (batch.seq_len / c.cp) % c.tp == 0, "cost model: sequence parallel needs T/cp (",
           batch.seq_len / c.cp, ") divisible by tp (", c.tp, ")");
}

void check_experts(const ModelShape& model, const ParallelismConfig& c) {
  model.validate();
  SL_CHECK(c.ep == 1 || model.has_experts(), "cost model: ep ", c.ep, " splits experts, but the model has none");
  if (!model.has_experts()) return;
  SL_CHECK(model.moe_experts % c.ep == 0, "cost model: ep ", c.ep, " does not divide the ", model.moe_experts,
           " experts");
}

MemoryEstimate estimate_memory(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch, int rank) {
  check_layout(model, plan, batch, rank);
  const RankPart part = rank_part(model, plan, rank);
  const int64_t w = bytes_of(plan.precision.param_dtype);
  const int64_t g = plan.precision.enabled() ? bytes_of(plan.precision.grad_dtype) : w;
  const int64_t master = plan.precision.enabled() ? 4 : 0;
  States s;
  switch (plan.dp_strategy) {
    case DpStrategy::ddp: s = ddp_states(part, w, g, master); break;
    case DpStrategy::naive:
      s = ddp_states(part, w, g, master);
      if (rank != 0) s.grads = s.optimizer = 0;  // a worker's gradients go to rank 0, which steps
      break;
    case DpStrategy::zero1:
    case DpStrategy::zero2: s = zero_states(part, plan, w, g, master); break;
    case DpStrategy::fsdp: s = fsdp_states(part, plan, w, g, master); break;
  }
  MemoryEstimate out;
  out.weights = s.weights;
  out.grads = s.grads;
  out.optimizer = s.optimizer;
  out.host_offload = s.host;
  out.activations = activation_peak(model, plan, batch, part, rank, s.grads, s.zero2_flat);
  return out;
}

}  // namespace sl::parallel::planner
