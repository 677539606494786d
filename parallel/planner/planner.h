// planner.h — the planner chapter: which layout should train this model on this cluster, and why.
//
//   The chapters each teach one way to cut a model; their closing pages say "which strategy when" in
//   sentences (the model fits: DDP or ZeRO; a layer does not fit: TP; fast links inside a node: TP
//   there; slow links between nodes: PP across them; long sequences: CP). The planner turns those
//   sentences into numbers: for every layout a cluster can run, what one rank holds, what each group
//   sends, and how long a step takes, without running anything, then it ranks them.
//
//   model + batch ──▶ enumerate (pp, dp_replicate, dp_shard, ep, cp, tp, ZeRO stage, schedule, m)
//                         │ drop what train cannot run (TrainPlan::validate and train's MoE refusals:
//                         │ check_trainable; heads % tp, layers % pp, T % cp, experts % ep, batch)
//                         ▼
//                     estimate_memory  (cost_model.h: weights, grads, optimizer, activations per rank)
//                     estimate_traffic (cost_model.h: per group and op, calls and bytes, members)
//                         │
//                         ▼
//                     step time = stage time × (1 + bubble) + exposed data-parallel communication
//                       stage time = FLOPs / (FLOP/s) + TP + all-to-alls + exposed CP + pipeline sends
//                       a ring all-reduce of S bytes over n ranks: 2(n-1) × (latency + S/n / bandwidth)
//                       of its slowest hop; all-gather, reduce-scatter: n-1 steps
//                         │
//                         ▼
//                     rank the layouts that fit (memory ≤ GPU memory) by step time; say why the
//                     first one won, with the numbers of the ones it beat
//
//   The papers' closed forms sit beside it (formulas.h) so the tests can hold the planner to the
//   published numbers: ZeRO's model states per rank (2 + 2 + 12 bytes per parameter, sharded by
//   stage), Narayanan et al.'s parameters 12lh²(1 + 13/(12h) + (V+s)/(12lh)) and FLOPs
//   96Bslh²(1 + s/(6h) + V/(16lh)) with the training time 8TP/(nX) (GPT-3 on 1024 A100s: ~34 days),
//   Korthikanti et al.'s activations sbh(34 + 5as/h) and its TP/SP/recompute variants, and the
//   bubbles (p-1)/m, (p-1)/(v·m) and ZB-H1's (p-1)/(3m).
//
//   Mixtures of experts (mixtral-8x7b, deepseek-v3): ep, expert parallelism, joins the search for a
//   model with experts, carved from the data-parallel ranks (dp × ep read other rows). What it costs
//   and saves, from the expert-parallel chapter's rules, as the library runs them:
//     memory    E/ep experts per rank (weights, gradients, Adam state), the rest whole; an MoE block
//               whole on every tp rank; ZeRO/FSDP shard the rest over dp_shard × ep and keep the
//               experts whole, outside their buffers and units
//     traffic   per MoE layer and micro-batch 4 all-to-alls on the ep group (dispatch, combine and
//               their reverses), tokens·k·C·bytes·(ep-1)/ep each, in the stage time, the same on
//               every tp rank; the routing choices all-gathered over dp_cp; expert gradients averaged
//               over expert_dp_cp (DDP's buckets, or one all-reduce per expert tensor under ZeRO/FSDP)
//     compute   the active weights: the router and the k routed + shared experts a token runs, the
//               experts' repeated on every tp rank
//
//   Read in this order:
//     presets.h     the models by name: GPT-2 sizes, ZeRO's 7.5B, Megatron's 175B/530B/1T, Llama-like,
//                   Mixtral-like and DeepSeek-V3-like mixtures of experts
//     model_shape.h the GPT plus an expert's width, shared experts and leading dense layers; parameters
//     formulas.h    the papers' formulas, and a schedule's bubble from its action lists
//     cluster.h     nodes, GPUs, memory, FLOP/s and links (comm/topology.h)
//     cost_model.h  memory and traffic of one rank of a layout, from the chapters' rules
//     step_time.h   one layout's step: compute, collectives on links, overlap, bubble (its assumptions)
//     search.h      every layout, checked and ranked
//     report.h      the table, the JSON and the recommendation in words
//     plan_request.h build/bin/plan's options resolved, evaluated or searched (train's layout flags as
//                   train maps them: parallel/train/plan_of_options.h)
//
//   Tool: build/bin/plan (tools/plan.cpp)   Tests: tests/parallel/planner/test_planner.cpp (the papers),
//   tests/parallel/planner/test_planner_ledger.cpp (shardlab's own ledgers; test_planner_ledger_experts.cpp
//   for ep layouts),
//   tests/parallel/planner/test_planner_experts.cpp (the MoE presets, all-to-all bytes, expert memory)
#pragma once
#include "parallel/planner/cluster.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/formulas.h"
#include "parallel/planner/presets.h"
#include "parallel/planner/report.h"
#include "parallel/planner/search.h"
#include "parallel/planner/step_time.h"
