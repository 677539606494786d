// moe_routing.h — a mixture of experts' routing, step by step: route, plan, dispatch, combine, and
// the router's two auxiliary losses. nn/moe.h puts them together around E expert MLPs.
//
//   x [N, C] ──router──► logits [N, E] ──route──► experts [N, k] (the choice, no gradient)
//                                                 weights [N, k] (differentiable)
//   plan_dispatch(experts, capacity) ──► which (token, choice) pairs each expert takes, in order
//   dispatch:  x [N, C] ──index_select──► rows grouped by expert [M, C]     (M = kept assignments)
//   experts:   rows of expert e ──MLP_e──► [kept_e, C]
//   combine:   y [M, C] · its weight ──index_add──► out [N, C]      (a dropped choice adds nothing)
//
// N = B·T tokens, E experts, k choices per token. Dispatch and combine are the only steps that move
// tokens: expert parallelism replaces each with an all-to-all and keeps everything else.
//
// The two router orders (their weights differ; the chosen experts are the same):
//   softmax_topk   p = softmax(logits) over all E, the k largest p as they are (Switch at k = 1,
//                  GShard): the weights sum to less than 1, and every logit gets gradient.
//   topk_softmax   the k largest logits, then softmax over those k (Mixtral): the weights sum to 1.
//                  This equals softmax over all E, top-k, renormalised over the k; only the chosen
//                  logits get gradient (at k = 1 the weight is 1, so only the losses below train it).
//
// Capacity: each expert computes at most `capacity` assignments; the others are dropped. Order:
// choice by choice (every token's first choice before any token's second), and within a choice in
// token order n = b·T + t. An expert takes the first `capacity` it is served. A token whose every
// choice is dropped gets a zero output, so the block's residual passes it through unchanged.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace sl::nn {

enum class MoERouter : uint8_t { softmax_topk, topk_softmax };
const char* moe_router_name(MoERouter router);      // "softmax-topk", "topk-softmax"
MoERouter parse_moe_router(const std::string& name);  // throws sl::Error naming the allowed values

struct Routing {
  Tensor probs;    // [N, E] softmax of the logits over all experts (the load-balancing loss's P)
  Tensor experts;  // [N, k] i64 chosen experts, best first; equal logits: the lower expert
  Tensor weights;  // [N, k] their combine weights (gradient flows to the chosen entries)
};
Routing route(const Tensor& logits, int64_t k, MoERouter router);  // logits [N, E]

// ceil(capacity_factor · tokens · k / E); factor 0 means dropless: returns -1 (no limit).
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t k, int64_t experts);

// Which assignments each expert computes, grouped by expert (expert 0's first), in service order.
struct DispatchPlan {
  Tensor token;                 // [M] i64: the token (row of x) of each kept assignment
  Tensor choice;                // [M] i64: its entry n·k + j of weights [N·k]
  std::vector<int64_t> routed;  // [E] assignments routed to each expert (before the capacity cut)
  std::vector<int64_t> kept;    // [E] those it computes: min(routed, capacity)
  int64_t capacity = -1;        // -1: dropless
  int64_t dropped() const;      // Σ routed - Σ kept
};
// experts [N, k] (any device; read on the host). Tensors of the plan go to `device`.
DispatchPlan plan_dispatch(const Tensor& experts, int64_t num_experts, int64_t capacity, Device device);

// x [N, C] -> the kept assignments' rows [M, C], expert by expert (the all-to-all's input).
Tensor dispatch(const Tensor& x, const DispatchPlan& plan);
// y [M, C] (each expert's outputs, in the plan's order), weights [N, k] -> out [N, C] =
// Σ over each token's kept choices of weight · y. Gradient flows to y and to the weights.
Tensor combine(const Tensor& y, const Tensor& weights, const DispatchPlan& plan);

// Switch's load-balancing loss: E · Σ_e f_e · P_e, f_e = routed_e / (N·k) (the fraction of
// assignments routed to e, no gradient), P_e = the mean router probability of e over the N tokens.
// 1 when both are uniform; larger when the probabilities and the load pile onto the same experts.
Tensor load_balancing_loss(const Tensor& probs, const std::vector<int64_t>& routed, int64_t k);
// ST-MoE's router z-loss: mean over tokens of logsumexp(logits)², keeping the logits small.
Tensor router_z_loss(const Tensor& logits);

}  // namespace sl::nn
