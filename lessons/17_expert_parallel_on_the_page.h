// 17_expert_parallel_on_the_page.h — lesson 17, section 4: expert parallelism written out. Included
// once, by lessons/17_mixture_of_experts.cpp (header-only, so the lesson's main file stays one story).
//
//   ep ranks, E experts: rank r holds experts [r·E/ep, (r+1)·E/ep) and a replica of the router. Each
//   rank routes its own N/ep tokens; the tokens travel to their experts and back:
//
//     rank r: x_r [N/ep, C] ─router─► choices [N/ep, k] ─all-gather─► every rank's choices [N, k]
//             the plan: plan_dispatch over all N tokens, capacity ceil(factor · N · k / E): the
//             serial model's drops, computed the same on every rank (no one needs to ask)
//             rows for rank d ─dispatch all-to-all─► rows for my experts ─MLP_e─► their outputs
//             ─combine all-to-all─► back where they came from ─· weight, index_add─► out_r [N/ep, C]
//
//   Bytes per all-to-all and rank, uniform load, no drops: of the N/ep·k rows a rank sends, (ep-1)/ep
//   go to other ranks, each C elements of 4 bytes:  N/ep · k · C · 4 · (ep-1)/ep.
//   Backward runs both all-to-alls again in reverse (the gradient of a row goes back where it came from).
//
//   expert_parallel_by_hand returns what a rank computed (output, gradients, bytes), so another
//   implementation of the layer can be held to it and to the serial model in a few lines.
#pragma once
#include <algorithm>
#include <cstdio>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "nn/moe.h"
#include "parallel/comm/launch.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "tensor/ops.h"

namespace lesson17 {

using namespace sl;
using parallel::CommOp;
using parallel::CommStats;
using parallel::ProcessGroup;

struct Breaks {
  bool local_capacity = false;    // capacity counted over the rank's own tokens
  bool detached_weights = false;  // the combine's weights detached from the router
};

// rows [S, C] -> [R, C]: send_counts[d] rows go to rank d, recv_counts[s] rows come from rank s.
// Backward: the same exchange reversed (the gradient of each row returns to the rank that sent it).
struct AllToAllFn : Function<AllToAllFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& rows, ProcessGroup* group, std::vector<int64_t> send_counts,
                        std::vector<int64_t> recv_counts) {
    ctx.set("group", group), ctx.set("send", send_counts), ctx.set("recv", recv_counts);
    const int64_t R = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    Tensor out = zeros({R, rows.size(1)}, TensorOptions(rows.dtype(), rows.device()));
    group->all_to_all(out, rows, recv_counts, send_counts);
    return out;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const auto& send = ctx.get<std::vector<int64_t>>("send");
    const int64_t S = std::accumulate(send.begin(), send.end(), int64_t{0});
    Tensor back = zeros({S, grads[0].size(1)}, TensorOptions(grads[0].dtype(), grads[0].device()));
    ctx.get<ProcessGroup*>("group")->all_to_all(back, grads[0], send, ctx.get<std::vector<int64_t>>("recv"));
    return {back};
  }
};

// One kept assignment of the global batch: global token n, its entry n·k + j, the expert.
struct Assignment {
  int64_t token, choice, expert;
};

// The kept assignments, in the plan's order (expert by expert, each in service order).
static std::vector<Assignment> kept_of(const nn::DispatchPlan& plan, int64_t token_offset, int64_t choice_offset) {
  const std::vector<double> token = plan.token.to_vector(), choice = plan.choice.to_vector();
  std::vector<Assignment> kept;
  size_t i = 0;
  for (size_t e = 0; e < plan.kept.size(); ++e)
    for (int64_t c = 0; c < plan.kept[e]; ++c, ++i)
      kept.push_back({static_cast<int64_t>(token[i]) + token_offset, static_cast<int64_t>(choice[i]) + choice_offset,
                      static_cast<int64_t>(e)});
  return kept;
}

// Every rank's choices [N, k] -> the kept assignments. Capacity over the N tokens of the global batch,
// as the serial layer counts it. (Broken: each rank's N/ep tokens planned alone, with the capacity of
// N/ep tokens: an expert busy with rank 0's tokens still takes rank 1's, and the drops differ.)
static std::vector<Assignment> plan_globally(const Tensor& choices, const nn::GPTConfig& config, int ep, bool per_rank) {
  const int64_t N = choices.size(0), k = choices.size(1), E = config.moe_experts;
  if (!per_rank)
    return kept_of(nn::plan_dispatch(choices, E, nn::expert_capacity(config.moe_capacity_factor, N, k, E), Device::cpu()), 0, 0);
  std::vector<Assignment> kept;
  const int64_t Nl = N / ep;
  for (int s = 0; s < ep; ++s) {
    const int64_t capacity = nn::expert_capacity(config.moe_capacity_factor, Nl, k, E);
    const auto part = kept_of(nn::plan_dispatch(choices.narrow(0, s * Nl, Nl), E, capacity, Device::cpu()), s * Nl, s * Nl * k);
    kept.insert(kept.end(), part.begin(), part.end());
  }
  return kept;
}

// Rank r's share of the plan: what it sends to each rank (its local tokens and choice entries, grouped
// by destination) and, for each row it receives, which of its experts computes it.
struct Exchange {
  std::vector<int64_t> send_counts, recv_counts;  // [ep]
  std::vector<double> send_token, send_choice;    // local row n - r·Nl and entry, in send order
  std::vector<int64_t> recv_expert;               // in arrival order: [from rank 0 | from rank 1 | ...]
};
static Exchange exchange_of(const std::vector<Assignment>& kept, int r, int ep, int64_t Nl, int64_t k, int64_t experts_per_rank) {
  Exchange x{std::vector<int64_t>(ep, 0), std::vector<int64_t>(ep, 0), {}, {}, {}};
  for (int d = 0; d < ep; ++d)  // to rank d: my tokens' assignments to d's experts, in plan order
    for (const Assignment& a : kept)
      if (a.token / Nl == r && a.expert / experts_per_rank == d) {
        x.send_token.push_back(static_cast<double>(a.token - r * Nl));
        x.send_choice.push_back(static_cast<double>(a.choice - r * Nl * k));
        ++x.send_counts[d];
      }
  for (int s = 0; s < ep; ++s)  // from rank s: its tokens' assignments to my experts, in the same order
    for (const Assignment& a : kept)
      if (a.token / Nl == s && a.expert / experts_per_rank == r) x.recv_expert.push_back(a.expert), ++x.recv_counts[s];
  return x;
}

struct EpResult {
  Tensor out;                       // [N/ep, C] this rank's tokens' MoE output
  int64_t dropped = 0;              // assignments dropped in the global batch (as planned)
  int64_t dispatch_bytes = 0, combine_bytes = 0;  // sent by this rank, forward
};

// One rank: moe holds the same weights on every rank (only experts [r·E/ep, (r+1)·E/ep) are used).
// x [N/ep, C]. The router's weights live on every rank: their gradients are summed by the caller.
static EpResult expert_parallel_by_hand(parallel::RankContext& ctx, nn::MoE& moe, const nn::GPTConfig& config,
                                        const Tensor& x, const Breaks& breaks) {
  ProcessGroup& group = *ctx.world;
  const int ep = group.size(), r = group.rank();
  const int64_t Nl = x.size(0), C = x.size(1), k = moe.top_k, per_rank = moe.num_experts() / ep;
  SL_CHECK(moe.num_experts() % ep == 0, "expert parallelism: ", moe.num_experts(), " experts do not split over ep ", ep);
  const nn::Routing routing = nn::route((*moe.router)(x), k, moe.order);  // [Nl, k]
  Tensor all_choices = zeros({ep * Nl, k}, TensorOptions(DType::i64, ctx.device));
  group.all_gather(all_choices, routing.experts);  // [N, k]: every rank's choices
  const std::vector<Assignment> kept = plan_globally(all_choices, config, ep, breaks.local_capacity);
  const Exchange plan = exchange_of(kept, r, ep, Nl, k, per_rank);
  EpResult result;
  result.dropped = all_choices.numel() - static_cast<int64_t>(kept.size());

  CommStats before = group.ledger()[CommOp::all_to_all];
  const TensorOptions ids(DType::i64, ctx.device);
  const Tensor send_token = from_vector(plan.send_token, {static_cast<int64_t>(plan.send_token.size())}, ids);
  const Tensor received = AllToAllFn::apply(index_select(x, send_token), &group, plan.send_counts, plan.recv_counts);
  result.dispatch_bytes = group.ledger()[CommOp::all_to_all].bytes_sent - before.bytes_sent;

  // [R, C] in arrival order, zeros to start with; made from `received` so that it is on the tape on
  // every rank, also one whose experts got no row: every rank then runs both backward exchanges.
  Tensor computed = mul(received, 0.0);
  for (int64_t e = r * per_rank; e < (r + 1) * per_rank; ++e) {
    std::vector<double> rows;
    for (size_t i = 0; i < plan.recv_expert.size(); ++i)
      if (plan.recv_expert[i] == e) rows.push_back(static_cast<double>(i));
    if (rows.empty()) continue;
    const Tensor at = from_vector(rows, {static_cast<int64_t>(rows.size())}, ids);
    computed = index_add(computed, at, moe.expert(e)(index_select(received, at)));
  }
  before = group.ledger()[CommOp::all_to_all];
  const Tensor back = AllToAllFn::apply(computed, &group, plan.recv_counts, plan.send_counts);  // [S, C], send order
  result.combine_bytes = group.ledger()[CommOp::all_to_all].bytes_sent - before.bytes_sent;

  const Tensor weights = breaks.detached_weights ? routing.weights.detach() : routing.weights;
  const Tensor send_choice = from_vector(plan.send_choice, {static_cast<int64_t>(plan.send_choice.size())}, ids);
  const Tensor w = index_select(weights.reshape({Nl * k, 1}), send_choice);  // [S, 1]
  result.out = index_add(zeros({Nl, C}, TensorOptions(x.dtype(), ctx.device)), send_token, mul(back, w));
  return result;
}

// ---- the check against the serial layer ----------------------------------------------------------------
static Tensor grad_or_zeros(const Tensor& p) { return p.grad().defined() ? p.grad() : zeros_like(p); }

struct EpCase {
  double out_err = 0, router_err = 0, expert_err = 0, input_err = 0;
  double library_err = 0;  // the library's layer (parallel/expert_parallel) against the page's, forward
  int64_t serial_dropped = 0, ep_dropped = 0, dispatch_bytes = 0, combine_bytes = 0;  // bytes: rank 0
};

// The serial nn::MoE on the global batch x [N, C] against ep ranks by hand; loss = Σ out · dout.
// uniform: router and tokens set so that token n chooses experts n mod E and n+1 mod E.
static EpCase run_case(const nn::GPTConfig& config, int ep, const Breaks& breaks, int64_t N, bool uniform) {
  const int64_t C = config.n_embd, E = config.moe_experts;
  Generator g(11);
  Tensor x = randn({N, C}, DType::f32, &g);
  const Tensor dout = randn({N, C}, DType::f32, &g);
  auto make = [&](Generator& init) {
    auto moe = std::make_shared<nn::MoE>(config, nn::InitOptions{0.3, &init});
    if (uniform) {
      NoGradGuard no_grad;
      float* w = moe->router->weight.data<float>();  // [E, C]: expert e reads channel e
      for (int64_t i = 0; i < E * C; ++i) w[i] = i % C == i / C ? 4.0f : 0.0f;
    }
    return moe;
  };
  if (uniform) {
    std::vector<double> v(static_cast<size_t>(N * C), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < config.moe_top_k; ++j) v[n * C + (n + j) % E] = 1.0 - 0.25 * static_cast<double>(j);
    x = from_vector(v, {N, C});
  }
  Generator serial_init(5);
  auto serial = make(serial_init);
  x.set_requires_grad();
  const Tensor out = (*serial)(x);
  sum(mul(out, dout)).backward();
  EpCase result;
  result.serial_dropped = serial->stats().dropped();
  std::mutex mutex;
  parallel::launch(ep, [&](parallel::RankContext& ctx) {
    Generator init(5);
    auto moe = make(init);  // the same draw: the same router and experts as the serial layer
    const int64_t Nl = N / ep;
    const Tensor mine = x.detach().narrow(0, ctx.rank * Nl, Nl).to(ctx.device).set_requires_grad();
    auto here = [&](const Tensor& t) { return t.narrow(0, ctx.rank * Nl, Nl).to(ctx.device); };
    const EpResult got = expert_parallel_by_hand(ctx, *moe, config, mine, breaks);
    sum(mul(got.out, here(dout))).backward();
    Tensor library_out;
    {  // The library's chapter on the same rows: ep = the world, every rank's rows one MoE batch.
      NoGradGuard no_grad;
      Generator library_init(5);
      auto weights = make(library_init);
      const parallel::ProcessGroupPtr alone = ctx.world->split(ctx.rank, 0);
      parallel::ExpertParallelMoE library(*weights, {.ep = ctx.world, .batch = ctx.world, .replicas = alone});
      library_out = library(mine.detach());
    }
    Tensor router_grad = grad_or_zeros(moe->router->weight).clone();
    ctx.world->all_reduce(router_grad);  // a replica's gradient: summed over the ranks that used it
    std::lock_guard lock(mutex);
    result.out_err = std::max(result.out_err, max_abs_diff(got.out, here(out.detach())));
    result.library_err = std::max(result.library_err, max_abs_diff(library_out, got.out.detach()));
    result.input_err = std::max(result.input_err, max_abs_diff(mine.grad(), here(x.grad())));
    result.router_err = std::max(result.router_err, max_abs_diff(router_grad, grad_or_zeros(serial->router->weight).to(ctx.device)));
    for (int64_t e = ctx.rank * (E / ep); e < (ctx.rank + 1) * (E / ep); ++e) {
      const auto mine_p = moe->expert(e).parameters(), serial_p = serial->expert(e).parameters();
      for (size_t i = 0; i < mine_p.size(); ++i)
        result.expert_err = std::max(result.expert_err, max_abs_diff(grad_or_zeros(mine_p[i]), grad_or_zeros(serial_p[i]).to(ctx.device)));
    }
    result.ep_dropped = got.dropped;
    if (ctx.rank == 0) result.dispatch_bytes = got.dispatch_bytes, result.combine_bytes = got.combine_bytes;
  });
  return result;
}

// Section 4. config: the layer (E, k, capacity factor, C); check(ok, what) records a check.
inline void expert_parallel(const nn::GPTConfig& config, int ep, const Breaks& breaks,
                            const std::function<void(bool, const std::string&)>& check) {
  const int64_t E = config.moe_experts, k = config.moe_top_k, C = config.n_embd, N = 16 * ep * E;
  std::printf("\n--- 4. expert parallelism on the page: ep %d, %lld experts per rank, N %lld tokens (%lld per rank), "
              "capacity factor %g\n", ep, (long long)(E / ep), (long long)N, (long long)(N / ep), config.moe_capacity_factor);
  const EpCase random = run_case(config, ep, breaks, N, false);
  std::printf("  random routing: dropped %lld (serial) / %lld (by hand); against the serial layer: out %.2g, grads of\n"
              "  the router %.2g, the experts %.2g, the tokens %.2g\n", (long long)random.serial_dropped,
              (long long)random.ep_dropped, random.out_err, random.router_err, random.expert_err, random.input_err);
  if (breaks.local_capacity)
    std::printf("  --break-local-capacity: each rank planned its %lld tokens with capacity ceil(%g · %lld · %lld / %lld): other drops\n",
                (long long)(N / ep), config.moe_capacity_factor, (long long)(N / ep), (long long)k, (long long)E);
  if (breaks.local_capacity && random.out_err < 1e-5)
    std::printf("  (nothing was dropped either way at this capacity factor: the mistake changes nothing here)\n");
  if (breaks.detached_weights)
    std::printf("  --break-detached-weights: the router's gradient came only through the weights, and they were detached%s\n",
                k == 1 && config.moe_router == nn::MoERouter::topk_softmax
                    ? "\n  (at k = 1 topk-softmax's weight is 1 and carries no gradient anyway: the mistake changes nothing here)"
                    : "");
  check(random.ep_dropped == random.serial_dropped && random.out_err < 1e-5,
        "ep ranks by hand == the serial nn::MoE: the same drops, the same output (capacity over the global batch)");
  check(random.router_err < 1e-4 && random.expert_err < 1e-4 && random.input_err < 1e-4,
        "gradients: each expert's on its rank, the router's summed over ranks, the tokens' == the serial layer's");
  std::printf("  the library's layer (parallel::ExpertParallelMoE, what train --ep runs) on the same rows: "
              "out differs from the page's by %.2g\n", random.library_err);
  check(random.library_err < 1e-5, "the page's ranks == parallel::ExpertParallelMoE (the library's chapter), forward");

  nn::GPTConfig dropless = config;  // the formula counts every assignment: nothing dropped
  dropless.moe_capacity_factor = 0;
  const EpCase uniform = run_case(dropless, ep, {}, N, true);
  const double formula = static_cast<double>(N / ep * k * C * 4) * (ep - 1) / ep;
  std::printf("  uniform routing (token n -> experts n mod E, n+1 mod E; nothing dropped: %lld):\n", (long long)uniform.serial_dropped);
  std::printf("    rank 0 sends %lld bytes in the dispatch all-to-all and %lld in the combine; N/ep · k · C · 4 · (ep-1)/ep = %.0f\n",
              (long long)uniform.dispatch_bytes, (long long)uniform.combine_bytes, formula);
  std::printf("    random routing, rank 0: %lld and %lld bytes (the load is not uniform, and drops send nothing)\n",
              (long long)random.dispatch_bytes, (long long)random.combine_bytes);
  check(uniform.dispatch_bytes == formula && uniform.combine_bytes == formula && uniform.out_err < 1e-5,
        "uniform load: each all-to-all moves N/ep · k · C · 4 · (ep-1)/ep bytes per rank (the ledger)");
}

}  // namespace lesson17
