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
//   experts    rows regrouped expert by expert, MLP_e on each block, put back source by source
//   combine    ─all-to-all #2─► the outputs back in the order sent ─combine (local weights)─► [N_l, C]
//
//   Backward: the reverse of each all-to-all (the splits swapped), in the reverse order.
//
// The losses over the global batch: the load-balancing loss E·Σ f_e P_e takes f_e from the gathered
// counts (global) and P_e from this rank's tokens; the average over the R ranks of that loss (what
// data parallelism's gradient average takes) is the serial loss, since P_e is a mean over equal
// shares. The z-loss is a mean over tokens: the same argument. A per-rank capacity or per-rank f_e
// would be a different model (its drops and loss differ from the serial one): not offered.
//
// Gradients: replicated weights are averaged over the R ranks that split the batch, as DDP does.
// An expert's gradient on its owner is the sum of what every ep source sent back; the layer scales
// it by 1/R on the way (GradScale, an identity forward) and the dp replicas of the same expert (the
// ranks with the same ep coordinate) sum it: expert gradient = Σ over all R ranks' losses / R, the
// serial gradient. Averaging it over ep instead would mix different experts.
//
// Bytes per layer and step (one all-to-all, f32 rows of C): a rank sends the rows of its kept
// assignments that live on other ranks, tokens·k·C·bytes·(ep−1)/ep when the load is uniform and
// nothing drops; dispatch and combine forward, and their reverses backward: four all-to-alls.
// Memory per rank: E/ep experts (8C² weights each) plus the replicated weights.
//
//   Tests: tests/parallel/expert_parallel/test_expert_parallel.cpp
#pragma once

#include "parallel/expert_parallel/expert_exchange.h"
#include "parallel/expert_parallel/expert_parallel_moe.h"
