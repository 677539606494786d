// test_expert_parallel.cpp — the MoE layer with its experts sharded over ep
// (parallel/expert_parallel/expert_parallel.h) against an independent serial nn::MoE and nn::AdamW:
// 3 AdamW steps in f64 (to 1e-13), for ep 2 and 4, ep × dp, k 1 and 2, with and without capacity drops. Each
// step: the loss (the ranks' average), the router's and every expert's gradient, then the weights.
// The bytes and the memory: test_expert_parallel_ledger.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/optim.h"
#include "parallel/comm/flatten.h"
#include "parallel/comm/launch.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "tensor/ops.h"

namespace sl::parallel {
namespace {

struct EpCase {
  int ep, dp;
  int64_t k;
  double capacity_factor;  // 0: dropless
};

std::string case_name(const testing::TestParamInfo<EpCase>& info) {
  const EpCase& c = info.param;
  return "ep" + std::to_string(c.ep) + "_dp" + std::to_string(c.dp) + "_k" + std::to_string(c.k) +
         (c.capacity_factor > 0 ? "_drops" : "_dropless");
}

nn::GPTConfig moe_config(const EpCase& c) {
  nn::GPTConfig config;
  config.n_embd = 8;
  config.moe_experts = 4;
  config.moe_top_k = c.k;
  config.moe_capacity_factor = c.capacity_factor;
  // k 1: softmax then top-k (the weight carries the router's gradient); k 2: Mixtral's order.
  config.moe_router = c.k == 1 ? nn::MoERouter::softmax_topk : nn::MoERouter::topk_softmax;
  config.moe_aux_weight = 0.5;  // large, so that an aux loss over the wrong tokens shows
  config.moe_z_weight = 0.05;
  return config;
}

std::shared_ptr<nn::MoE> drawn(const nn::GPTConfig& config) {
  Generator g(11);
  return std::make_shared<nn::MoE>(config, nn::InitOptions{.std = 0.5, .generator = &g, .dtype = DType::f64});
}

constexpr int64_t kRows = 4, kT = 6;  // the global batch: [4, 6, 8] per step

Tensor batch(uint64_t step, int64_t C) {
  Generator g(100 + step);
  return randn({kRows, kT, C}, TensorOptions(DType::f64), &g);
}

// mean over tokens of |y - x|², plus the aux losses when given.
Tensor objective(const Tensor& y, const Tensor& x, const Tensor& aux) {
  Tensor d = sub(y, mul(x, 0.5));
  Tensor m = mean(sum(mul(d, d), -1));
  return aux.defined() ? add(m, aux) : m;
}

void average_over(const std::vector<Tensor>& params, ProcessGroup& group) {
  sum_gradients_over(params, group);
  for (const Tensor& p : params) p.grad().mul_(1.0 / group.size());
}

nn::AdamWOptions adamw() { return {.lr = 0.05, .weight_decay = 0.5}; }

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> a = got.to_vector(), b = want.to_vector();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-13 * (1 + std::fabs(b[i]))) << what << " [" << i << "]";
}

class ExpertParallelParity : public testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallelParity, ThreeAdamWStepsEqualTheSerialMoE) {
  const EpCase c = GetParam();
  const nn::GPTConfig config = moe_config(c);
  const int world = c.ep * c.dp;
  ASSERT_EQ(kRows % world, 0);
  launch(world, [&](RankContext& ctx) {
    ProcessGroupPtr all = ctx.world;
    const int rank = all->rank(), ep_rank = rank % c.ep, dp_rank = rank / c.ep;  // ep innermost
    ExpertGroups groups{.ep = all->split(dp_rank, rank), .batch = all, .replicas = all->split(ep_rank, rank)};
    auto serial = drawn(config);  // the independent reference, whole, on every rank
    nn::AdamW serial_adamw(serial->parameters(), adamw());
    ExpertParallelMoE moe(*drawn(config), groups);
    nn::AdamW adamw_ep(moe.parameters(), adamw());
    int64_t dropped = 0;
    for (uint64_t step = 0; step < 3; ++step) {
      const Tensor x = batch(step, config.n_embd);
      serial->zero_grad();
      const Tensor serial_y = (*serial)(x);  // before aux_loss(): it reads this forward's
      Tensor serial_loss = objective(serial_y, x, serial->aux_loss());
      serial_loss.backward();

      const int64_t rows = kRows / world;
      const Tensor mine = x.narrow(0, rank * rows, rows);
      moe.zero_grad();
      const Tensor y = moe(mine);
      expect_close(y, serial_y.narrow(0, rank * rows, rows), "y");
      // This rank's share of the serial objective: its rows' mean / R plus its part of the aux losses,
      // backpropagated R times over, as data parallelism weights it before its average.
      Tensor loss = add(div(objective(y, mine, Tensor()), static_cast<double>(world)), moe.aux_loss());
      mul(loss, static_cast<double>(world)).backward();
      average_over(moe.router->parameters(), *groups.batch);  // DDP's average over the batch ranks
      average_over(moe.experts->parameters(), *groups.replicas);  // the experts' over their replicas
      Tensor total = loss.detach().clone();
      all->all_reduce(total, ReduceOp::sum);

      const std::string at = "step " + std::to_string(step) + " rank " + std::to_string(rank);
      EXPECT_EQ(moe.stats().kept, serial->stats().kept) << at;
      dropped += serial->stats().dropped();
      expect_close(total, serial_loss, "loss, " + at);
      expect_close(moe.router->weight.grad(), serial->router->weight.grad(), "router grad, " + at);
      const nn::StateDict want = serial->state_dict();
      for (const auto& [name, p] : moe.named_parameters()) expect_close(p.grad(), want.at(name).grad(), name + " grad, " + at);
      serial_adamw.step();
      adamw_ep.step();
      for (const auto& [name, p] : moe.named_parameters()) expect_close(p, want.at(name), name + ", " + at);
    }
    if (c.capacity_factor > 0) {
      EXPECT_GT(dropped, 0) << "the case must drop tokens";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertParallelParity,
                         testing::Values(EpCase{2, 1, 1, 0}, EpCase{2, 1, 2, 0}, EpCase{2, 1, 2, 1.0},
                                         EpCase{4, 1, 1, 0}, EpCase{4, 1, 2, 1.0}, EpCase{2, 2, 2, 0},
                                         EpCase{2, 2, 2, 1.0}, EpCase{2, 2, 1, 1.0}),
                         case_name);

}  // namespace
}  // namespace sl::parallel
