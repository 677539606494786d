// expert_parallel.h — expert parallelism: a mixture of experts' E experts sharded over ep ranks, the
// tokens moved to their experts and back by two all-to-alls. The serial layer is nn/moe.h; its steps
// (nn/moe_routing.h: route, plan, dispatch, experts, combine) stay, and only dispatch and combine
// change: each gains an all-to-all.
//
//   rank r of ep holds experts [r·E/ep, (r+1)·E/ep) and a replica of everything else (router,
//   attention, dense weights). Its N_l tokens:
//
//   x [N_l, C] ─router─► route (local)             experts [N_l, k], weights [N_l, k]
//   all_gather the choices over the ranks that split the batch (dp × ep): [R·N_l, k], in the global
//   token order (batch rank b holds tokens [b·N_l, (b+1)·N_l)); plan_dispatch on them with the
//   capacity of the global batch, ceil(cf · R·N_l · k / E): every rank computes the same plan, the
//   serial model's, and takes its own tokens' rows from it
//   dispatch   rows of my kept assignments, grouped by expert, so by owner ─all-to-all #1─►
//              each rank receives the rows for its experts, source by source (splits: from the plan,
//              no exchange of counts)
//   experts    rows regrouped expert by expert, each in the global plan's order (the serial GEMM),
//              MLP_e on each block, put back source by source
//   combine    ─all-to-all #2─► the outputs back in the order sent ─combine (local weights)─► [N_l, C]
//
//   Backward: the reverse of each all-to-all (the splits swapped), in the reverse order.
//
// One MoE batch: micro-batch m of every rank that splits the batch (dp, which holds ep), in rank
// order: the rows the serial model routes in one forward. Its capacity, drops and load are the serial
// model's. The auxiliary losses over it: E·Σ f_e P_e takes f_e from the gathered counts and P_e's sum
// over this rank's tokens divided by the batch's N; the z-loss likewise. Each rank's aux_loss() is its
// part, the parts sum to the serial loss of that batch. In a training step the layer attaches that
// part to its own output with the weight of its MoE batch, G_m·dp/C (G_m: the batch's counted targets;
// expert_parallel_step.h), as Megatron's MoEAuxLossAutoScaler does: whichever backward reaches the
// output carries it, the loss's or, on a pipeline stage before the last, the gradient the next stage
// sent. A per-rank capacity or per-rank f_e would be a different model (its drops and loss differ):
// not offered.
//
// Gradients (the rule every strategy keeps: parallel/runner/data_parallel_strategy.h): the router,
// attention and dense weights are replicated over ep and averaged over dp_cp (ep included) like any
// data-parallel weight. An expert lives on one ep rank and is placed sharded(0, "ep"): the strategy
// leaves it out of its dp buckets and averages it over expert_dp_cp, the ranks holding the same
// experts. Its gradient on its owner sums what every ep source sent back; the layer scales it by 1/ep
// on the way (scale_gradient, identity forward), so the average over the R/ep replicas gives
// Σ over all R ranks / R, what the replicated weights get. Averaging it over ep would mix experts.
// An expert that computed no row in any of the step's MoE batches (no token chose it, or every one
// was dropped) has no gradient in the serial model, so AdamW skips it: no weight decay, no moment
// update. Its replicas run it on no rows (their reduction needs every rank), which leaves zeros; so
// the runner drops its .grad before the update (ModelRunner::unused_parameters). The global plan
// says which experts computed rows, the same on every rank: no communication decides it.
//
// Where ep sits in the mesh: between dp_shard and cp (mesh.h), Megatron's tp-cp-ep-dp-pp order and
// torchtitan's, whose ep is carved out of the data-parallel ranks: ep ranks read other rows as dp
// ranks do, and its two all-to-alls per layer want faster links than dp's one reduction per step.
//
// Bytes per MoE layer and micro-batch (f32 rows of C), four all-to-alls: dispatch and the combine's
// reverse send the rows of this rank's kept assignments whose experts live on other ranks, the
// combine and the dispatch's reverse send back the rows it received from them; each is
// tokens·k·C·4·(ep−1)/ep when the load is uniform and nothing drops. Before them, the all-gather of
// the [N_l, k] i64 choices over the batch ranks (its ledger is dp's). Memory per rank:
// E/ep experts (8C² + 5C weights each) plus the replicated weights (router E·C, attention, embeddings).
//
// Two mistakes of lesson 17 can be planted in this layer by build/bin/diverge's probe
// (parallel/runner/fault_sites.h): the capacity counted over each rank's own tokens (local_capacity)
// and the combine's weights detached from the router (detached_combine_weights).
//
// Under ZeRO-1/2 and FSDP (parallel/zero/zero_strategies.h): the replicated weights go into ZeRO's flat
// buffers or FSDP's units, sharded over dp_shard × ep (every rank holding them); the experts stay out
// of them, whole, their gradients in .grad averaged over expert_dp_cp (= dp_shard here) by one
// all-reduce per expert tensor, stepped by an nn::AdamW whose moments are whole
// (parallel/zero/expert_replicas.h), the unused ones dropped as above. Memory per rank: the replicated
// weights' gradients (ZeRO-2) and AdamW moments (and, under FSDP, weights and gradients) divided by
// dp_shard·ep; the E/ep experts' weights, gradients and moments whole.
//
// With tensor parallelism: ep is carved out of the data-parallel ranks (as DeepSpeed-MoE and
// Megatron's expert-tensor-parallel 1 do), and an MoE block keeps its router and E/ep experts whole
// on every tp rank: only the attention is split. The tp ranks of a group hold the same tokens (no
// SP), so each routes, exchanges over its own ep group (same tp coordinate) and computes the same
// rows: tp's degree of redundant expert work and all-to-all bytes, no tp collective in the MoE and
// no gradient sum over tp (every tp rank's router and expert gradients are the same). Splitting each
// expert's MLP column/row over tp (Megatron's expert-tensor-parallel > 1) would divide that work
// and the experts' memory by tp at the cost of two tp collectives per expert; not built here.
//
// With a pipeline: each stage's MoE blocks route micro-batch m of every batch rank as one MoE batch,
// the same rows in every stage; a stage's aux parts ride on its MoE outputs' backward (above) and
// its tp rank 0 reports their share of the logged loss. The pipeline's runner with this step around
// it is the composition path's (parallel/nd/expert_parallel_pipeline.h).
//
// With context parallelism: each rank holds its sequence shard's tokens (zigzag, contiguous, Ulysses'
// or the hybrid's), so one MoE batch is every token of micro-batch m over dp × cp (dp_cp, cp
// innermost). The gathered choices are put back in the serial model's token order (row by row,
// position by position: the cut's positions, passed down by parallelize.cpp) before the plan, since
// capacity keeps the earlier tokens; the plan is then read in the ranks' order. An expert's ep
// group shares the cp coordinate: its rows come from the same positions of other batch ranks. Its
// gradient is averaged over expert_dp_cp (cp included) and then summed over cp with every other
// gradient (the cut's sum), which is the sum over cp of the average over dp: what the dense weights get.
//
// Supported layouts: ep with dp_replicate under DDP, with dp_shard under ZeRO-1, ZeRO-2 or FSDP, HSDP
// (FSDP within a replica, the experts averaged over every replica too), with tp (any of those), with
// pp and cp (under DDP). parallelize_options.h refuses the rest, naming why: SP, offload, mixed
// precision, interleaved stages under DDP; train refuses distributed checkpoints with any mixture of
// experts (a checkpoint keeps one AdamW step count, which a skipped expert lags).
//
// Files, in reading order: expert_exchange.h (the differentiable all-to-all, the gradient scale, the
// attached loss), expert_parallel_moe.h (the layer), apply_expert_parallel.h (on a model part),
// expert_parallel_step.h (what a runner does around its passes: the aux weights, the unused
// experts, the experts' gathers), expert_parallel_runner.h (the micro-batch loop).
//
//   Tests: tests/parallel/expert_parallel/test_expert_parallel.cpp (the layer, f64),
//          tests/parallel/expert_parallel/test_expert_parallel_layouts.cpp (through parallelize and the Trainer),
//          tests/parallel/expert_parallel/test_expert_parallel_ledger.cpp (the all-to-all bytes, a rank's weights)
#pragma once

#include "parallel/expert_parallel/expert_exchange.h"
#include "parallel/expert_parallel/expert_parallel_moe.h"
#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "parallel/expert_parallel/expert_parallel_step.h"
#include "parallel/expert_parallel/expert_parallel_runner.h"
