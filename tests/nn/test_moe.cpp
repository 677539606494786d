// The mixture-of-experts layer (nn/moe.h, nn/moe_routing.h): against a token-by-token reference
// written here in plain doubles, the drop order, dropless, the counts, and gradchecks in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "nn/moe.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

constexpr int64_t kC = 4, kE = 4;

GPTConfig moe_config(int64_t k, MoERouter router, double capacity_factor) {
  GPTConfig config;
  config.n_embd = kC;
  config.n_head = 1;
  config.n_layer = 1;
  config.moe_experts = kE;
  config.moe_top_k = k;
  config.moe_router = router;
  config.moe_capacity_factor = capacity_factor;
  config.moe_aux_weight = 0.3;
  config.moe_z_weight = 0.2;
  return config;
}

// f64 weights of std 0.5, so that the router's logits differ by far more than gradcheck's eps.
std::shared_ptr<MoE> make_moe(const GPTConfig& config, uint64_t seed = 3) {
  Generator generator(seed);
  return std::make_shared<MoE>(config, InitOptions{0.5, &generator, DType::f64});
}

// ---- the reference: one token at a time, no code shared with the layer ----------------------------------

struct Reference {
  std::vector<double> out;  // [N, C]
  std::vector<int64_t> routed, kept;
  double balance = 0, z = 0;
};

// y = W x + b, W [rows, cols] row-major.
std::vector<double> affine(const std::vector<double>& W, const std::vector<double>& b, const double* x, int64_t rows,
                           int64_t cols) {
  std::vector<double> y(rows);
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = b.empty() ? 0.0 : b[r];
    for (int64_t c = 0; c < cols; ++c) y[r] += W[r * cols + c] * x[c];
  }
  return y;
}

Reference reference(MoE& moe, const std::vector<double>& x, int64_t N, int64_t capacity) {
  const int64_t E = moe.num_experts(), k = moe.top_k, H = 4 * kC;
  const std::vector<double> router = moe.router->weight.to_vector();
  Reference ref;
  ref.out.assign(N * kC, 0.0);
  ref.routed.assign(E, 0);
  ref.kept.assign(E, 0);
  std::vector<std::vector<int64_t>> chosen(N);
  std::vector<std::vector<double>> weight(N), probs(N);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> logits = affine(router, {}, &x[n * kC], E, kC);
    double top = *std::max_element(logits.begin(), logits.end()), total = 0;
    for (double l : logits) total += std::exp(l - top);
    const double lse = top + std::log(total);
    ref.z += lse * lse / static_cast<double>(N);
    for (double l : logits) probs[n].push_back(std::exp(l - lse));
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    chosen[n].assign(order.begin(), order.begin() + k);
    double chosen_total = 0;
    for (int64_t e : chosen[n]) chosen_total += probs[n][e];
    for (int64_t e : chosen[n])  // Mixtral: renormalised over the k; Switch: as they are
      weight[n].push_back(moe.order == MoERouter::topk_softmax ? probs[n][e] / chosen_total : probs[n][e]);
  }
  for (int64_t j = 0; j < k; ++j)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t e = chosen[n][j];
      ++ref.routed[e];
      if (capacity >= 0 && ref.kept[e] == capacity) continue;
      ++ref.kept[e];
      MLP& mlp = moe.expert(e);
      std::vector<double> h = affine(mlp.c_fc->weight.to_vector(), mlp.c_fc->bias.to_vector(), &x[n * kC], H, kC);
      for (double& v : h) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      std::vector<double> y = affine(mlp.c_proj->weight.to_vector(), mlp.c_proj->bias.to_vector(), h.data(), kC, H);
      for (int64_t c = 0; c < kC; ++c) ref.out[n * kC + c] += weight[n][j] * y[c];
    }
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t n = 0; n < N; ++n) P += probs[n][e] / static_cast<double>(N);
    ref.balance += static_cast<double>(E) * static_cast<double>(ref.routed[e]) / static_cast<double>(N * k) * P;
  }
  return ref;
}

void expect_near_all(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << "element " << i;
}

// ---- forward against the reference -------------------------------------------------------------------------

TEST(MoE, ForwardAndLossesMatchATokenByTokenReference) {
  for (MoERouter router : {MoERouter::softmax_topk, MoERouter::topk_softmax})
    for (int64_t k : {1, 2})
      for (double factor : {0.0, 0.5, 1.0}) {
        SCOPED_TRACE(std::string(moe_router_name(router)) + " k " + std::to_string(k) + " factor " +
                     std::to_string(factor));
        auto moe = make_moe(moe_config(k, router, factor));
        Generator generator(11);
        Tensor x = randn({2, 6, kC}, DType::f64, &generator);  // N = 12 tokens
        Tensor out = (*moe)(x);
        EXPECT_EQ(out.shape(), x.shape());
        const int64_t capacity = expert_capacity(factor, 12, k, kE);
        Reference ref = reference(*moe, x.to_vector(), 12, capacity);
        expect_near_all(out.to_vector(), ref.out, 1e-12);
        EXPECT_NEAR(moe->load_balancing_loss().item(), ref.balance, 1e-12);
        EXPECT_NEAR(moe->z_loss().item(), ref.z, 1e-12);
        EXPECT_NEAR(moe->aux_loss().item(), 0.3 * ref.balance + 0.2 * ref.z, 1e-12);
        EXPECT_EQ(moe->stats().routed, ref.routed);
        EXPECT_EQ(moe->stats().kept, ref.kept);
        EXPECT_EQ(moe->stats().capacity, capacity);
        EXPECT_EQ(moe->stats().tokens, 12);
      }
}

TEST(MoE, CapacityIsCeilOfFactorTimesTokensTimesKOverE) {
  EXPECT_EQ(expert_capacity(1.25, 8, 2, 4), 5);  // 1.25 · 16 / 4 = 5
  EXPECT_EQ(expert_capacity(1.0, 10, 1, 4), 3);  // ceil(2.5)
  EXPECT_EQ(expert_capacity(0.0, 10, 1, 4), -1);  // dropless
}

// Tokens 0-2 prefer expert 0 then 1, tokens 3-5 expert 1 then 0: with room for 3 each, every first
// choice is served and every second dropped. Served token by token instead, tokens 0-2's second
// choices would have taken expert 1's room before tokens 3-5's first.
TEST(MoE, DropsServeFirstChoicesBeforeSecondsThenTokenOrder) {
  Tensor experts = from_vector({0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0}, {6, 2}, DType::i64);
  DispatchPlan plan = plan_dispatch(experts, 2, 3, Device::cpu());
  EXPECT_EQ(plan.token.to_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(plan.choice.to_vector(), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(plan.routed, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(plan.kept, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(plan.dropped(), 6);
  // One more place each: the first second choices in token order, tokens 3 (for 0) and 0 (for 1).
  DispatchPlan wider = plan_dispatch(experts, 2, 4, Device::cpu());
  EXPECT_EQ(wider.token.to_vector(), (std::vector<double>{0, 1, 2, 3, 3, 4, 5, 0}));
  EXPECT_EQ(wider.choice.to_vector(), (std::vector<double>{0, 2, 4, 7, 6, 8, 10, 1}));
}

TEST(MoE, ATokenWithEveryChoiceDroppedGetsZeroSoTheResidualPassesIt) {
  auto moe = make_moe(moe_config(1, MoERouter::softmax_topk, 0.5));
  NoGradGuard no_grad;
  moe->router->weight.copy_(zeros({kE, kC}, DType::f64));  // equal logits: all to expert 0
  Tensor x = randn({1, 8, kC}, DType::f64);
  std::vector<double> out = (*moe)(x).to_vector();  // capacity ceil(0.5 · 8 / 4) = 1: token 0 only
  EXPECT_EQ(moe->stats().kept, (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(moe->stats().dropped(), 7);
  EXPECT_NE(out[0], 0.0);
  for (int64_t i = kC; i < 8 * kC; ++i) EXPECT_EQ(out[i], 0.0) << "element " << i;
}

TEST(MoE, DroplessEqualsAnUnreachableCapacity) {
  for (int64_t k : {1, 2}) {
    auto dropless = make_moe(moe_config(k, MoERouter::topk_softmax, 0.0));
    auto roomy = make_moe(moe_config(k, MoERouter::topk_softmax, static_cast<double>(kE)));  // capacity N·k
    Tensor x = randn({2, 5, kC}, DType::f64);
    EXPECT_EQ((*dropless)(x).to_vector(), (*roomy)(x).to_vector());
    EXPECT_EQ(dropless->stats().capacity, -1);
    EXPECT_EQ(dropless->stats().dropped(), 0);
    EXPECT_EQ(dropless->stats().routed, roomy->stats().kept);
    const auto& routed = dropless->stats().routed;
    EXPECT_EQ(std::accumulate(routed.begin(), routed.end(), int64_t{0}), 10 * k);
  }
}

// ---- gradients ------------------------------------------------------------------------------------------------

// out and the weighted aux losses, side by side, against every input and weight of the layer.
// Returns how many assignments the layer dropped.
int64_t expect_layer_gradcheck(int64_t k, MoERouter router, double factor) {
  auto moe = make_moe(moe_config(k, router, factor), 5);
  Generator generator(17);
  Tensor x = randn({2, 3, kC}, TensorOptions(DType::f64).with_requires_grad(), &generator);
  TensorList inputs{x};
  int64_t count = x.numel();
  for (const Tensor& p : moe->parameters()) {
    inputs.push_back(p);
    count += p.numel();
  }
  expect_gradcheck(
      [&](const TensorList& in) {
        Tensor out = (*moe)(in[0]);
        return cat({out.reshape({out.numel()}), moe->aux_loss().reshape({1})}, 0);
      },
      inputs, count);
  return moe->stats().dropped();
}

TEST(MoE, GradcheckF64BothRoutersK1AndK2Dropless) {
  for (MoERouter router : {MoERouter::softmax_topk, MoERouter::topk_softmax})
    for (int64_t k : {1, 2}) EXPECT_EQ(expect_layer_gradcheck(k, router, 0.0), 0);
}

TEST(MoE, GradcheckF64BothRoutersK1AndK2WithDrops) {
  for (MoERouter router : {MoERouter::softmax_topk, MoERouter::topk_softmax})
    for (int64_t k : {1, 2}) EXPECT_GT(expect_layer_gradcheck(k, router, 0.5), 0);  // capacity ceil(0.5·6·k/4)
}

// Top-k then softmax at k = 1 gives every token the weight 1: the choice passes no gradient, so the
// router learns only from the auxiliary losses. Switch's order passes the chosen probability's.
TEST(MoE, TheChoiceCarriesNoGradientTheChosenWeightsDo) {
  for (MoERouter router : {MoERouter::topk_softmax, MoERouter::softmax_topk}) {
    GPTConfig config = moe_config(1, router, 0.0);
    auto moe = make_moe(config);
    moe->aux_weight = moe->z_weight = 0;
    sum((*moe)(randn({2, 4, kC}, DType::f64))).backward();
    const double norm = sum(mul(moe->router->weight.grad(), moe->router->weight.grad())).item();
    if (router == MoERouter::topk_softmax)
      EXPECT_EQ(norm, 0.0);
    else
      EXPECT_GT(norm, 0.0);
  }
}

}  // namespace
}  // namespace sl::nn
