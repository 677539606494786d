// activation_model.cpp — activation_peak (activation_model.h): the highest point of one step on one
// rank, above the model states, from shapes. It is what the memory ledger's total shows at the first
// backward that holds the most: every micro-batch still in flight keeps what its ops saved, and the
// first backward op adds its gradients. r = b·s rows (b micro-batch rows, s = T/cp), C, a heads, tp t,
// w the activations' bytes, Vl = Vp/t the vocabulary rows of this tp rank.
//
//   one layer of one micro-batch (none; ops as tensor/ops and nn/gpt.cpp save them):
//     ln_1 and ln_2 outputs 2rCw (+ mean, rstd f32: 16 r), c_attn's q|k|v 3rCw/t, the core's out rCw/t and
//     lse 4ra/t (blockwise: no T²), the residual h rCw, c_fc and GELU 8rCw/t, the block's output rCw
//     SP: LayerNorm regions r/t rows, but c_attn and c_fc keep their gathered inputs whole (2rCw)
//     selective: not the core's out and lse; full: the block's input only
//   a unit (a chunk of Lc layers and one micro-batch): Lc layers (its input counts as the layer before
//     its first's output); a chunk that ends the model also keeps its last output (ln_f's input) and
//     the head: ln_f's output, the logits rVl·w (vocab-parallel cross-entropy: 3 f32 row stats)
//   units in flight at the first backward: 1 without a pipeline (one micro-batch at a time), m for
//     GPipe, min(p - r, m) for 1F1B and zero-bubble, the warm-up + 1 of interleaved (chunk by chunk in
//     groups of p micro-batches); a stage that is not the last also holds the output it sent
//   the moments compared (the peak is the higher):
//     loss    the loss's backward (the model's last chunk): the gradient of the logits and the row lse
//     block   the last layer's first backward op (MLP c_proj): dy rCw, dx 4rCw/t, dW 4C²w/t, db Cw
//             (16-bit: through f32 copies of each), with FSDP's gathered units (weights and gradients)
//   an MoE layer (moe_extra_bytes): the router's f32 logits and probabilities, the k·r dispatched rows
//     and expert outputs, the experts' c_fc and GELU 2(k + S)·rF (whole over tp), in place of the MLP's 8rC/t
//   plus the batch's token ids and targets (i64), the gradients a cut at dp 1 frees at zero_grad (not
//   yet made again at the first backward; after it they are back), ZeRO-2's flat gradient buffer.
#include "parallel/planner/activation_model.h"

#include <algorithm>

namespace sl::parallel::planner {

namespace {

struct Shapes {
  int64_t b, s, r, C, a, t, w, Vl;
  bool sp;
};

Shapes shapes_of(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch) {
  const ParallelismConfig& c = plan.parallelism;
  Shapes x{};
  x.b = batch.batch_size / (static_cast<int64_t>(c.dp_replicate) * c.dp_shard * c.ep) / plan.micro_batches;
  x.s = batch.seq_len / c.cp;
  x.r = x.b * x.s;
  x.C = model.n_embd;
  x.a = model.n_head;
  x.t = c.tp;
  x.w = bytes_of(plan.precision.param_dtype);
  x.Vl = (model.vocab_size + x.t - 1) / x.t;
  x.sp = plan.sequence_parallel && x.t > 1;
  return x;
}

// The block's input (and output): [b, s, C], or its SP shard [b, s/t, C].
int64_t stream_bytes(const Shapes& x) { return (x.sp ? x.r / x.t : x.r) * x.C * x.w; }

// What one layer keeps for one micro-batch (its output included, its input not).
int64_t layer_bytes(const Shapes& x, const TrainPlan& plan, nn::Recompute recompute) {
  if (recompute == nn::Recompute::full) return stream_bytes(x);
  const int64_t ln_rows = x.sp ? x.r / x.t : x.r;
  // SP: a LayerNorm's output shard is freed once gathered; c_attn and c_fc keep the gathered rows whole
  const int64_t ln_regions = ln_rows * ((x.sp ? 2 : 4) * x.C * x.w + 16);  // (ln_1, ln_2,) h, output; stats
  const int64_t gathered = x.sp ? 2 * x.r * x.C * x.w : 0;
  int64_t sliced = x.r * 12 * x.C / x.t * x.w;  // q|k|v, out, c_fc, GELU
  int64_t lse = x.r * x.a / x.t * 4;
  if (recompute == nn::Recompute::selective) {
    sliced -= x.r * x.C / x.t * x.w;
    lse = 0;
  }
  // CP's core takes q, k, v as heads (contiguous copies, c_attn's output freed) and gives out as heads
  // (copied back for c_proj): the ring keeps q, k, v, out and c_proj's copy, one r·C/t more; all-gather
  // keeps q and the gathered K/V (comm) instead of k and v, one r·C/t less, plus 2·cp·r·C/t gathered
  const int64_t head_rows = x.r * x.C / x.t * x.w;
  if (plan.parallelism.cp > 1)
    sliced += plan.cp_variant == CpVariant::allgather ? 2 * plan.parallelism.cp * head_rows - head_rows : head_rows;
  return ln_regions + gathered + sliced + lse;
}

// What an MoE layer keeps beyond a dense one's (none or selective): instead of c_fc's output and GELU
// (8rC/t), the router's logits and probabilities (f32, r·E each), the dispatched rows and the experts'
// outputs (k·r·C each, kept before the combine), c_fc's output and GELU of the k routed and S shared
// experts (2(k + S)·r·F, whole on every tp rank); k·min(1, cf) with a capacity factor cf.
int64_t moe_extra_bytes(const ModelShape& m, const Shapes& x) {
  const double cf = m.moe_capacity_factor, kept_share = cf > 0 ? std::min(1.0, cf) : 1.0;
  const auto routed = static_cast<int64_t>(kept_share * static_cast<double>(m.moe_top_k * x.r));
  const int64_t F = m.expert_width();
  const int64_t kept = 8 * x.r * m.moe_experts + 2 * routed * x.C * x.w +
                       2 * (routed + m.shared_experts * x.r) * F * x.w;  // whole on every tp rank
  return kept - 8 * x.r * x.C / x.t * x.w;
}

// The head's saved tensors for one micro-batch: ln_f's output and stats, the logits (and the
// vocab-parallel loss's row stats).
int64_t head_bytes(const Shapes& x) {
  const int64_t ln = x.r * x.C * x.w + (x.sp ? x.r / x.t : x.r) * 8;  // SP: stats of the shard, output gathered
  return ln + x.r * x.Vl * x.w + (x.t > 1 ? 3 * x.r * 4 : 0);
}

// The loss's backward: the logits' gradient and the loss's row lse (f32).
int64_t loss_backward_bytes(const Shapes& x) { return x.r * x.Vl * x.w + (x.t > 1 ? 0 : x.r * 4); }

// The first backward op of a layer, MLP c_proj (in 4C/t, out C): dy, dx, dW, db; 16-bit through f32.
int64_t block_backward_bytes(const Shapes& x) {
  const int64_t in = 4 * x.C / x.t;
  const int64_t dy = x.r * x.C, dx = x.r * in, dw = x.C * in, db = x.C;
  if (x.w >= 4) return (dy + dx + dw + db) * x.w;
  return dy * x.w + (dy + 2 * dx + 2 * dw + db) * 4;  // f32 dy, x, W, dx, dW, db beside the 16-bit dy
}

struct InFlight {
  int64_t units = 1;        // chunk-micro-batches holding activations at the first backward
  int64_t model_tails = 0;  // of which end the model (they keep ln_f's input and the head)
  bool backward_on_tail = false;
  int64_t steady_units = 0;  // in flight at a later backward (0: none later)
};

InFlight in_flight(const TrainPlan& plan, const RankPart& part, int stage) {
  const int64_t p = plan.parallelism.pp, m = plan.micro_batches, v = part.chunks;
  InFlight f;
  if (p == 1 || plan.schedule == ScheduleKind::naive) {
    f.units = 1;
  } else if (plan.schedule == ScheduleKind::gpipe) {
    f.units = m;
  } else if (plan.schedule == ScheduleKind::interleaved) {
    f.units = std::min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1);
  } else {
    f.units = std::min<int64_t>(m, p - stage);
  }
  if (part.last_stage) {
    // forward i runs chunk (i / p) % v; the model's last chunk is chunk v - 1 of the last stage
    for (int64_t i = 0; i < f.units; ++i)
      if (v == 1 || (i / p) % v == v - 1) ++f.model_tails;
    f.backward_on_tail = true;
  }
  // a later backward: one unit fewer, unless a forward came in between (1F1B's steady state)
  if (m > 1)
    f.steady_units = plan.schedule == ScheduleKind::gpipe ? m - 1
                     : p == 1                             ? 1
                     : m * v > f.units                    ? f.units
                                                          : f.units - 1;
  return f;
}

// FSDP's units gathered at the first backward (weights and gradients, unsharded): the largest block
// unit, and the units outside the blocks on a part that starts the model (they stay gathered).
int64_t fsdp_gathered(const TrainPlan& plan, const RankPart& part, int64_t w, int64_t g) {
  if (plan.dp_strategy != DpStrategy::fsdp) return 0;
  const ParallelismConfig& c = plan.parallelism;
  const int64_t n = c.dp_shard * (plan.cuts_model() ? c.cp : 1) * c.ep;  // an ep rank's experts: in no unit
  int64_t block = 0, rest = 0;
  for (const UnitShape& unit : part.units) {
    const int64_t padded = (unit.numel + n - 1) / n * n;
    if (unit.name.rfind("h.", 0) == 0)
      block = std::max(block, padded);
    else if (part.first_stage)
      rest += padded;
  }
  return (w + g) * (block + rest);
}

}  // namespace

int64_t activation_peak(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch,
                        const RankPart& part, int rank, int64_t held_grads, int64_t zero2_flat) {
  const Shapes x = shapes_of(model, plan, batch);
  const int stage = mesh_coordinates(plan.parallelism, rank)[grid_index(MeshDim::pp)];
  const int64_t layers_per_unit = static_cast<int64_t>(part.layers.size()) / part.chunks;
  int64_t unit = layers_per_unit * layer_bytes(x, plan, model.recompute);
  if (model.has_experts() && model.recompute != nn::Recompute::full) {
    const auto moe_layers = std::count_if(part.layers.begin(), part.layers.end(),
                                          [&](int64_t layer) { return model.moe_layer(layer); });
    unit += moe_layers * moe_extra_bytes(model, x) / part.chunks;
  }
  const int64_t tail = stream_bytes(x) + head_bytes(x);
  const int64_t dp = static_cast<int64_t>(plan.parallelism.dp_replicate) * plan.parallelism.dp_shard * plan.parallelism.ep;
  const int64_t tokens = 2 * batch.batch_size / dp * batch.seq_len * 8 + batch.seq_len * 8 + 8;
  const int64_t w = x.w;
  const int64_t g = plan.precision.enabled() ? bytes_of(plan.precision.grad_dtype) : w;
  const bool frees_grads = plan.cuts_model() && dp == 1 && plan.dp_strategy == DpStrategy::ddp;
  int64_t common = tokens + zero2_flat;
  int64_t freed = frees_grads ? held_grads : 0;
  if (plan.dp_strategy == DpStrategy::naive) {  // the logits a worker sends and the gradient it gets back;
    const int64_t logits = x.r * x.Vl * x.w;    // rank 0 gathers every rank's, and their gradients
    common += rank == 0 ? (2 * dp + 1) * logits : 2 * logits;
    if (rank == 0) freed = held_grads / 2;  // its gradients, set to none, half made again at the peak
  }

  auto held = [&](const InFlight& f, int64_t units) {
    int64_t bytes = units * unit + std::min(units, f.model_tails) * tail;
    if (!part.last_stage && units > 0) bytes += stream_bytes(x);  // the output it sent
    return bytes;
  };
  const InFlight f = in_flight(plan, part, stage);
  int64_t peak = 0;
  auto moments = [&](int64_t units, int64_t grads_missing) {
    const int64_t kept = held(f, units);
    if (f.backward_on_tail) peak = std::max(peak, kept + loss_backward_bytes(x) + common - grads_missing);
    // the block moment: the backward unit's tail (ln_f's input, the head) is gone
    const int64_t block_kept = kept - (f.backward_on_tail ? tail : 0);
    peak =
        std::max(peak, block_kept + block_backward_bytes(x) + fsdp_gathered(plan, part, w, g) + common - grads_missing);
  };
  moments(f.units, freed);
  if (f.steady_units > 0) moments(f.steady_units, 0);
  return peak;
}

}  // namespace sl::parallel::planner
