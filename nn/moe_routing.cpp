// moe_routing.cpp — see moe_routing.h.
#include "nn/moe_routing.h"

#include <cmath>

namespace sl::nn {

const char* moe_router_name(MoERouter router) {
  switch (router) {
    case MoERouter::softmax_topk: return "softmax-topk";
    case MoERouter::topk_softmax: return "topk-softmax";
  }
  return "?";
}

MoERouter parse_moe_router(const std::string& name) {
  for (MoERouter r : {MoERouter::softmax_topk, MoERouter::topk_softmax})
    if (name == moe_router_name(r)) return r;
  throw Error("moe router: '" + name + "' is not one of softmax-topk, topk-softmax");
}

Routing route(const Tensor& logits, int64_t k, MoERouter router) {
  SL_CHECK(logits.dim() == 2 && k >= 1 && k <= logits.size(1), "route: logits must be [N, E] with 1 <= k <= E, got ",
           logits.shape(), " and k ", k);
  Routing out;
  out.probs = softmax(logits);  // [N, E]
  if (router == MoERouter::softmax_topk) {
    TopK top = topk(out.probs, k);  // [N, k]: the chosen probabilities, as they are
    out.experts = top.indices;
    out.weights = top.values;
  } else {
    TopK top = topk(logits, k);  // [N, k]: the chosen logits, then softmax over them
    out.experts = top.indices;
    out.weights = softmax(top.values);
  }
  return out;
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t k, int64_t experts) {
  SL_CHECK(capacity_factor >= 0 && tokens >= 0 && k >= 1 && experts >= 1, "expert_capacity: capacity factor ",
           capacity_factor, ", tokens ", tokens, ", k ", k, ", experts ", experts, " do not make a capacity");
  if (capacity_factor == 0) return -1;
  return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens * k) / static_cast<double>(experts)));
}

int64_t DispatchPlan::dropped() const {
  int64_t total = 0;
  for (size_t e = 0; e < routed.size(); ++e) total += routed[e] - kept[e];
  return total;
}

DispatchPlan plan_dispatch(const Tensor& experts, int64_t num_experts, int64_t capacity, Device device) {
  SL_CHECK(experts.dim() == 2 && is_integer(experts.dtype()), "plan_dispatch: experts must be [N, k] integers, got ",
           dtype_name(experts.dtype()), " ", experts.shape());
  const int64_t N = experts.size(0), k = experts.size(1);
  const std::vector<double> chosen = experts.to(Device::cpu()).to_vector();
  DispatchPlan plan;
  plan.capacity = capacity;
  plan.routed.assign(static_cast<size_t>(num_experts), 0);
  plan.kept.assign(static_cast<size_t>(num_experts), 0);
  std::vector<std::vector<double>> tokens(static_cast<size_t>(num_experts)), choices(tokens.size());
  for (int64_t j = 0; j < k; ++j) {    // every token's first choice before any token's second
    for (int64_t n = 0; n < N; ++n) {  // then in token order
      const auto e = static_cast<int64_t>(chosen[static_cast<size_t>(n * k + j)]);
      SL_CHECK(e >= 0 && e < num_experts, "plan_dispatch: token ", n, " chose expert ", e, " of ", num_experts);
      const auto slot = static_cast<size_t>(e);
      ++plan.routed[slot];
      if (capacity >= 0 && plan.kept[slot] >= capacity) continue;  // over capacity: dropped
      ++plan.kept[slot];
      tokens[slot].push_back(static_cast<double>(n));
      choices[slot].push_back(static_cast<double>(n * k + j));
    }
  }
  std::vector<double> token, choice;  // expert by expert
  for (size_t e = 0; e < tokens.size(); ++e) {
    token.insert(token.end(), tokens[e].begin(), tokens[e].end());
    choice.insert(choice.end(), choices[e].begin(), choices[e].end());
  }
  const TensorOptions ids(DType::i64, device);
  const auto M = static_cast<int64_t>(token.size());
  plan.token = from_vector(token, {M}, ids);
  plan.choice = from_vector(choice, {M}, ids);
  return plan;
}

Tensor dispatch(const Tensor& x, const DispatchPlan& plan) {
  SL_CHECK(x.dim() == 2, "dispatch: x must be [N, C], got ", x.shape());
  return index_select(x, plan.token);  // [M, C]
}

Tensor combine(const Tensor& y, const Tensor& weights, const DispatchPlan& plan) {
  SL_CHECK(weights.dim() == 2 && y.dim() == 2 && y.size(0) == plan.token.numel(), "combine: y must be [M=",
           plan.token.numel(), ", C] and weights [N, k], got ", y.shape(), " and ", weights.shape());
  const int64_t N = weights.size(0), C = y.size(1);
  Tensor w = index_select(weights.reshape({weights.numel(), 1}), plan.choice);  // [M, 1]
  return index_add(zeros({N, C}, y.options()), plan.token, mul(y, w));          // [N, C]
}

Tensor load_balancing_loss(const Tensor& probs, const std::vector<int64_t>& routed, int64_t k) {
  const int64_t N = probs.size(0), E = probs.size(1);
  SL_CHECK(static_cast<int64_t>(routed.size()) == E, "load_balancing_loss: ", routed.size(), " counts for ", E,
           " experts");
  std::vector<double> fraction(routed.size());
  for (size_t e = 0; e < routed.size(); ++e)
    fraction[e] = N == 0 ? 0.0 : static_cast<double>(routed[e]) / static_cast<double>(N * k);
  Tensor f = from_vector(fraction, {E}, probs.options().with_requires_grad(false));  // no gradient
  Tensor P = mean(probs, 0);                                                         // [E]
  return mul(sum(mul(f, P)), static_cast<double>(E));
}

Tensor router_z_loss(const Tensor& logits) {
  Tensor m = max(logits, 1, true).detach();                     // [N, 1], for a stable exp
  Tensor lse = add(log(sum(exp(sub(logits, m)), 1, true)), m);  // [N, 1]
  return mean(mul(lse, lse));
}

}  // namespace sl::nn
