// expert_parallel_moe.cpp — see expert_parallel_moe.h and, for the steps, expert_parallel.h.
#include "parallel/expert_parallel/expert_parallel_moe.h"

#include "parallel/comm/flatten.h"
#include "parallel/expert_parallel/expert_exchange.h"
#include "parallel/runner/fault_sites.h"

namespace sl::parallel {

namespace {

std::vector<int64_t> host_ids(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : t.to(Device::cpu()).to_vector()) out.push_back(static_cast<int64_t>(v));
  return out;
}

// A planted mistake (fault_sites.h's local_capacity, lesson 17's --break-local-capacity): each of
// the R batch ranks' N_l tokens capped on their own, with capacity ceil(cf·N_l·k/E), the R plans
// merged expert by expert (each expert's rows source by source) in the global plan's form. The same
// on every rank; a different model from the serial one wherever some rank's tokens overflow it.
nn::DispatchPlan plan_per_rank(const Tensor& all, int64_t E, double capacity_factor, int R, int64_t n_local, int64_t k) {
  const int64_t capacity = nn::expert_capacity(capacity_factor, n_local, k, E);
  std::vector<nn::DispatchPlan> plans;
  std::vector<std::vector<int64_t>> tokens, choices;  // [R] each plan's, expert by expert
  for (int s = 0; s < R; ++s) {
    plans.push_back(nn::plan_dispatch(all.narrow(0, s * n_local, n_local), E, capacity, Device::cpu()));
    tokens.push_back(host_ids(plans.back().token)), choices.push_back(host_ids(plans.back().choice));
  }
  nn::DispatchPlan merged;
  merged.routed.assign(static_cast<size_t>(E), 0), merged.kept.assign(static_cast<size_t>(E), 0);
  merged.capacity = capacity;
  std::vector<double> token, choice;
  std::vector<size_t> next(static_cast<size_t>(R), 0);  // source s's first row of expert e in its plan
  for (size_t e = 0; e < static_cast<size_t>(E); ++e)
    for (size_t s = 0; s < static_cast<size_t>(R); ++s) {
      const int64_t kept = plans[s].kept[e], first_token = static_cast<int64_t>(s) * n_local;
      for (int64_t i = 0; i < kept; ++i, ++next[s]) {
        token.push_back(static_cast<double>(tokens[s][next[s]] + first_token));
        choice.push_back(static_cast<double>(choices[s][next[s]] + first_token * k));
      }
      merged.routed[e] += plans[s].routed[e];
      merged.kept[e] += kept;
    }
  const TensorOptions ids(DType::i64, Device::cpu());
  merged.token = from_vector(token, {static_cast<int64_t>(token.size())}, ids);
  merged.choice = from_vector(choice, {static_cast<int64_t>(choice.size())}, ids);
  return merged;
}

// The global plan cut for the ep group: what this rank sends, and what each source sends to it.
struct Traffic {
  nn::DispatchPlan mine;                      // this rank's tokens' kept assignments, by expert (so by owner)
  std::vector<int64_t> send, receive;         // [ep] rows to / from each ep rank
  std::vector<std::vector<int64_t>> from;     // [ep][local experts] rows of each source for each of my experts
  std::vector<std::vector<int>> sources;      // [local experts] the source of each of its rows, in the plan's order
};

// Where a batch rank sits in the batch group: ranks of dp (d, ep rank r) × cp (c), cp innermost,
// g = (d·ep + r)·cp + c. Its ep peers share d and c.
struct BatchRank {
  int64_t d, r, c;
  static BatchRank of(int64_t g, int ep, int cp) { return {g / (cp * ep), (g / cp) % ep, g % cp}; }
  bool ep_peer_of(const BatchRank& o) const { return d == o.d && c == o.c; }
};

// `global`'s tokens in gathered numbering (rank g's token i is g·N_l + i) cut for this rank's ep group.
Traffic cut_plan(const nn::DispatchPlan& global, int64_t n_local, int64_t k, int64_t per_rank, int ep, int cp,
                 int batch_rank, Device device) {
  Traffic t;
  t.send.assign(static_cast<size_t>(ep), 0);
  t.receive.assign(static_cast<size_t>(ep), 0);
  t.from.assign(static_cast<size_t>(ep), std::vector<int64_t>(static_cast<size_t>(per_rank), 0));
  t.sources.resize(static_cast<size_t>(per_rank));
  const std::vector<int64_t> token = host_ids(global.token), choice = host_ids(global.choice);
  const BatchRank me = BatchRank::of(batch_rank, ep, cp);
  std::vector<double> my_token, my_choice;
  size_t m = 0;
  for (size_t e = 0; e < global.kept.size(); ++e) {
    const int owner = static_cast<int>(static_cast<int64_t>(e) / per_rank);
    for (int64_t i = 0; i < global.kept[e]; ++i, ++m) {
      const BatchRank from = BatchRank::of(token[m] / n_local, ep, cp);
      if (token[m] / n_local == batch_rank) {
        my_token.push_back(static_cast<double>(token[m] - batch_rank * n_local));
        my_choice.push_back(static_cast<double>(choice[m] - batch_rank * n_local * k));
        ++t.send[static_cast<size_t>(owner)];
      }
      if (owner == me.r && from.ep_peer_of(me)) {
        ++t.receive[static_cast<size_t>(from.r)];
        ++t.from[static_cast<size_t>(from.r)][static_cast<size_t>(static_cast<int64_t>(e) % per_rank)];
        t.sources[static_cast<size_t>(static_cast<int64_t>(e) % per_rank)].push_back(static_cast<int>(from.r));
      }
    }
  }
  const TensorOptions ids(DType::i64, device);
  t.mine.token = from_vector(my_token, {static_cast<int64_t>(my_token.size())}, ids);
  t.mine.choice = from_vector(my_choice, {static_cast<int64_t>(my_choice.size())}, ids);
  return t;
}

// Under cp the gathered tokens (rank by rank, each rank's rows of its sequence shard) are not in the
// serial model's order (row by row, position by position), in which capacity keeps tokens. Returns
// serial[s] = the gathered index of serial token s of the MoE batch; empty when they agree (cp 1).
std::vector<int64_t> serial_order(const ExpertGroups& groups, int64_t n_local, int64_t t_local) {
  if (groups.cp == 1) return {};
  const int cp = groups.cp;
  const int64_t R = groups.batch->size(), rows = n_local / t_local, T = t_local * cp;
  std::vector<std::vector<int64_t>> positions;  // [cp][t_local]: each cp rank's global positions
  for (int c = 0; c < cp; ++c) positions.push_back(groups.positions(c, T));
  std::vector<int64_t> serial(static_cast<size_t>(R * n_local));
  for (int64_t g = 0; g < R; ++g)
    for (int64_t i = 0; i < n_local; ++i) {
      const int64_t row = (g / cp) * rows + i / t_local, position = positions[static_cast<size_t>(g % cp)][static_cast<size_t>(i % t_local)];
      serial[static_cast<size_t>(row * T + position)] = g * n_local + i;
    }
  return serial;
}

// The plan over the serial order's choices, its tokens renumbered into gathered order.
nn::DispatchPlan plan_in_gathered_order(const Tensor& all, const std::vector<int64_t>& serial, int64_t E,
                                        int64_t capacity, int64_t k) {
  if (serial.empty()) return nn::plan_dispatch(all, E, capacity, Device::cpu());
  std::vector<double> order(serial.begin(), serial.end());
  const TensorOptions ids(DType::i64, Device::cpu());
  nn::DispatchPlan plan = nn::plan_dispatch(index_select(all, from_vector(order, {static_cast<int64_t>(order.size())}, ids)),
                                            E, capacity, Device::cpu());
  std::vector<double> token, choice;
  for (int64_t s : host_ids(plan.token)) token.push_back(static_cast<double>(serial[static_cast<size_t>(s)]));
  for (int64_t s : host_ids(plan.choice))
    choice.push_back(static_cast<double>(serial[static_cast<size_t>(s / k)] * k + s % k));
  plan.token = from_vector(token, {static_cast<int64_t>(token.size())}, ids);
  plan.choice = from_vector(choice, {static_cast<int64_t>(choice.size())}, ids);
  return plan;
}

// The received rows (source by source, each source's by expert) put expert by expert, each expert's
// in the global plan's order: the rows, and their order, that expert computes in the serial model
// (the same GEMM, so the same bits, when one replica serves the whole batch).
std::vector<double> expert_major(const Traffic& t, int64_t per_rank) {
  const size_t ep = t.from.size();
  std::vector<int64_t> start(ep, 0);  // where each source's block (and its expert e's rows) begins
  for (size_t s = 1; s < ep; ++s) start[s] = start[s - 1] + t.receive[s - 1];
  std::vector<double> order;
  for (int64_t e = 0; e < per_rank; ++e) {
    std::vector<int64_t> next = start;
    for (int source : t.sources[static_cast<size_t>(e)]) order.push_back(static_cast<double>(next[static_cast<size_t>(source)]++));
    for (size_t s = 0; s < ep; ++s) start[s] += t.from[s][static_cast<size_t>(e)];
  }
  return order;
}

}  // namespace

// This rank's experts of `serial`, in a list named from the first one's global index.
static std::shared_ptr<nn::ModuleList> rank_experts(const nn::MoE& serial, int ep, int ep_rank) {
  const int64_t E = serial.num_experts();
  if (E % ep != 0)
    throw Error("expert parallel: " + std::to_string(E) + " experts do not split over ep " + std::to_string(ep) +
                " (E % ep = " + std::to_string(E % ep) + ")");
  const int64_t per_rank = E / ep, first = ep_rank * per_rank;
  auto list = std::make_shared<nn::ModuleList>(first);
  for (int64_t e = first; e < first + per_rank; ++e) list->push_back(serial.experts->children().at(static_cast<size_t>(e)).second);
  return list;
}

ExpertParallelMoE::ExpertParallelMoE(const nn::MoE& serial, ExpertGroups groups)
    : nn::MoE(serial, serial.router, rank_experts(serial, groups.ep ? groups.ep->size() : 1, groups.ep ? groups.ep->rank() : 0)),
      groups_(std::move(groups)),
      num_experts_(serial.num_experts()) {
  SL_CHECK(groups_.ep && groups_.batch && groups_.replicas, "ExpertParallelMoE: every group must be set");
  const int ep = groups_.ep->size(), cp = groups_.cp, replica = groups_.replicas->rank();
  SL_CHECK(cp >= 1 && (cp == 1 || groups_.positions) && groups_.replicas->size() % cp == 0,
           "ExpertParallelMoE: cp ", cp, " needs each cp rank's token positions and replicas (",
           groups_.replicas->size(), ") that hold cp");
  SL_CHECK(groups_.batch->size() == ep * groups_.replicas->size() &&
               groups_.batch->rank() == ((replica / cp) * ep + groups_.ep->rank()) * cp + replica % cp,
           "ExpertParallelMoE: the batch group (rank ", groups_.batch->rank(), " of ", groups_.batch->size(),
           ") is not dp x ep x cp, cp innermost");
  first_ = experts->first_index();
  served_.assign(static_cast<size_t>(local_experts()), 0);
}

// This rank's part of the group's auxiliary losses: Switch's balance E·Σ_e f_e·P_e with f_e from the
// group's counts and P_e's sum over this rank's tokens only, and the z-loss's sum over them, both
// divided by the group's N tokens. Summed over the batch ranks: the serial model's loss of the group.
void ExpertParallelMoE::record_losses(const Tensor& probs, const Tensor& logits, const std::vector<int64_t>& routed,
                                      int64_t group_tokens) {
  const int64_t E = num_experts_;
  std::vector<double> fraction(routed.size());
  for (size_t e = 0; e < routed.size(); ++e)
    fraction[e] = static_cast<double>(routed[e]) / static_cast<double>(group_tokens * top_k);
  Tensor f = from_vector(fraction, {E}, probs.options().with_requires_grad(false));     // [E], no gradient
  Tensor P = div(sum(probs, 0), static_cast<double>(group_tokens));                      // [E], this rank's part
  balance_ = mul(sum(mul(f, P)), static_cast<double>(E));
  Tensor m = max(logits, 1, true).detach();                                              // [N_l, 1]
  Tensor lse = add(log(sum(exp(sub(logits, m)), 1, true)), m);                           // [N_l, 1]
  z_ = div(sum(mul(lse, lse)), static_cast<double>(group_tokens));
}

Tensor ExpertParallelMoE::forward(const Tensor& x) {
  SL_CHECK(x.dim() >= 2, "ExpertParallelMoE: x must be [..., C], got ", x.shape());
  const int64_t C = x.size(-1), N = x.numel() / C, E = num_experts_, k = top_k, per_rank = local_experts();
  const int ep = groups_.ep->size(), R = groups_.batch->size();
  Tensor tokens = x.reshape({N, C});                   // [N_l, C]
  Tensor logits = (*router)(tokens);                   // [N_l, E]
  nn::Routing routing = nn::route(logits, k, order);   // local choices and weights [N_l, k]

  // 1. The group's choices, in global token order, and the serial model's plan over them.
  Tensor all = Tensor::empty({R * N, k}, routing.experts.options());  // [R·N_l, k]
  groups_.batch->all_gather(all, routing.experts);
  SL_CHECK(groups_.cp == 1 || x.dim() == 3, "ExpertParallelMoE: under cp ", groups_.cp, " x must be [B_l, T_l, C] ",
           "(its rows' positions place the tokens in the serial order), got ", x.shape());
  const FaultSites* faults = FaultSites::here();  // a fault the divergence finder planted; none otherwise
  const bool capped_per_rank = faults && faults->breaks(FaultSites::Mistake::local_capacity);
  const int64_t capacity = nn::expert_capacity(capacity_factor, R * N, k, E);
  const nn::DispatchPlan global =
      capped_per_rank ? plan_per_rank(all, E, capacity_factor, R, N, k)
                      : plan_in_gathered_order(all.to(Device::cpu()), serial_order(groups_, N, x.dim() == 3 ? x.size(1) : N), E, capacity, k);
  record({global.routed, global.kept, R * N, global.capacity});
  record_losses(routing.probs, logits, global.routed, R * N);
  Traffic t = cut_plan(global, N, k, per_rank, ep, groups_.cp, groups_.batch->rank(), x.device());

  // 2. Dispatch: my rows to their experts' ranks.
  Tensor received = exchange_rows(nn::dispatch(tokens, t.mine), groups_.ep, t.receive, t.send);
  // 3. The experts, each on its rows from every source. The 1/ep on their gradient: see the header.
  const Tensor order_in = from_vector(expert_major(t, per_rank), {received.size(0)}, TensorOptions(DType::i64, x.device()));
  Tensor rows = scale_gradient(index_select(received, order_in), static_cast<double>(ep));
  std::vector<Tensor> outputs;
  int64_t first = 0;
  for (int64_t e = 0; e < per_rank; ++e) {
    const auto count = static_cast<int64_t>(t.sources[static_cast<size_t>(e)].size());
    // With replicas every expert runs, on no rows too: its gradient (zeros) must reach the replicas'
    // reduction on every rank, or a replica that got rows would wait for one that got none.
    if (count > 0 || groups_.replicas->size() > 1) outputs.push_back(expert(e)(rows.narrow(0, first, count)));
    first += count;
  }
  Tensor y = outputs.empty() ? rows : outputs.size() == 1 ? outputs[0] : cat(outputs, 0);
  std::vector<double> inverse(static_cast<size_t>(order_in.numel()));
  const std::vector<double> forward_order = order_in.to(Device::cpu()).to_vector();
  for (size_t i = 0; i < forward_order.size(); ++i) inverse[static_cast<size_t>(forward_order[i])] = static_cast<double>(i);
  y = index_select(scale_gradient(y, 1.0 / ep), from_vector(inverse, {y.size(0)}, order_in.options()));  // source by source
  // 4. Combine: the outputs back to their tokens' ranks, weighted there.
  Tensor back = exchange_rows(y, groups_.ep, t.send, t.receive);  // [M_l, C], in the order sent
  const bool detached = faults && faults->breaks(FaultSites::Mistake::detached_combine_weights);
  for (int64_t j = 0; j < per_rank; ++j) served_[static_cast<size_t>(j)] += global.kept[static_cast<size_t>(first_ + j)];
  return attach_aux(nn::combine(back, detached ? routing.weights.detach() : routing.weights, t.mine).reshape(x.shape()));
}

void ExpertParallelMoE::begin_step(std::vector<AuxWeight> weights) {
  step_weights_ = std::move(weights);
  forwards_ = 0;
  aux_share_ = 0;
  served_.assign(static_cast<size_t>(local_experts()), 0);
}

double ExpertParallelMoE::end_step() {
  step_weights_.clear();
  // The last forward's losses keep their values but let go of their graph, which reaches back to
  // the layer's input: on a pipeline stage that is the received activation, whose gradient would
  // stay alive until the next step.
  balance_ = balance_.detach(), z_ = z_.detach();
  return aux_share_;
}

Tensor ExpertParallelMoE::attach_aux(const Tensor& out) {
  if (step_weights_.empty()) return out;  // outside a step: the caller adds aux_loss()
  SL_CHECK(forwards_ < step_weights_.size(), "ExpertParallelMoE: forward ", forwards_ + 1, " in a step given ",
           step_weights_.size(), " MoE batches' weights");
  const AuxWeight weight = step_weights_[forwards_++];
  const Tensor aux = aux_loss();  // this rank's part of the MoE batch's weighted auxiliary losses
  aux_share_ += aux.item() * weight.share;
  return attach_loss(out, aux, weight.gradient);
}

}  // namespace sl::parallel
