// The GPT with mixture-of-experts blocks (GPTConfig's moe_ fields): which blocks, their names, the
// Philox counters (a part still equals the whole model's slice), the loss with the aux losses, learning.
#include <gtest/gtest.h>

#include <cstring>

#include "nn/moe.h"
#include "nn/optim.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

GPTConfig moe_gpt(int64_t every) {
  GPTConfig config{64, 16, 4, 2, 16, 0.0};  // V, block_size, n_layer, n_head, n_embd
  config.moe_experts = 4;
  config.moe_top_k = 2;
  config.moe_every = every;
  return config;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

Tensor tokens(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return cast(mul(rand(shape, {}, &gen), 64.0), DType::i64);
}

TEST(GPTMoE, EveryNthBlockHoldsTheExpertsUnderMlp) {
  GPT model(moe_gpt(2), 1);
  EXPECT_FALSE(model.block(0).moe);
  EXPECT_TRUE(model.block(1).moe);
  EXPECT_FALSE(model.block(2).moe);
  EXPECT_TRUE(model.block(3).moe);
  const StateDict state = model.state_dict();
  EXPECT_EQ(state.count("h.0.mlp.c_fc.weight"), 1u);
  EXPECT_EQ(state.at("h.1.mlp.router.weight").shape(), (Shape{4, 16}));
  EXPECT_EQ(state.at("h.1.mlp.experts.3.c_proj.weight").shape(), (Shape{16, 64}));
  EXPECT_EQ(state.count("h.1.mlp.c_fc.weight"), 0u);
  GPT all(moe_gpt(0), 1);
  for (int64_t layer = 0; layer < 4; ++layer) EXPECT_TRUE(all.block(layer).moe) << "layer " << layer;
}

// The counters: layers after an MoE block start where the whole model draws them, and a dense
// block of an MoE model draws what the dense model's does at the same counter.
TEST(GPTMoE, APartEqualsTheWholeModelsSliceBitwise) {
  GPT whole(moe_gpt(2), 7);
  GPT part(moe_gpt(2), 7, GPTShardSpec::layers(2, 4));
  const StateDict reference = whole.state_dict();
  for (const auto& [name, value] : part.state_dict()) {
    if (name.rfind("h.", 0) != 0) continue;  // the part's wte/wpe or head
    EXPECT_TRUE(bitwise_equal(value, reference.at(name))) << name;
  }
  GPTConfig dense = moe_gpt(2);
  dense.moe_experts = 0;
  GPT plain(dense, 7);
  EXPECT_TRUE(bitwise_equal(plain.state_dict().at("h.0.mlp.c_fc.weight"), reference.at("h.0.mlp.c_fc.weight")));
}

TEST(GPTMoE, TheLossAddsEveryMoEBlocksWeightedAuxLosses) {
  GPT model(moe_gpt(2), 3);
  Tensor idx = tokens({2, 8}, 1), targets = tokens({2, 8}, 2);
  const double loss = model.loss(idx, targets).item();
  const double aux = model.block(1).moe->aux_loss().item() + model.block(3).moe->aux_loss().item();
  EXPECT_GT(aux, 0.0);
  EXPECT_NEAR(model.moe_loss().item(), aux, 1e-7);
  EXPECT_NEAR(loss, cross_entropy(model.forward(idx), targets).item() + aux, 1e-5);
  EXPECT_EQ(model.block(1).moe->stats().tokens, 16);
}

TEST(GPTMoE, LearnsAFixedBatch) {
  GPT model(moe_gpt(1), 5);
  AdamW optimizer(model.parameters(), AdamWOptions{1e-2});
  Tensor idx = tokens({4, 12}, 3), targets = tokens({4, 12}, 4);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    for (Tensor& p : model.parameters()) p.set_grad(Tensor());
    Tensor loss = model.loss(idx, targets);
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(GPTMoE, BadConfigsAreErrors) {
  GPTConfig config = moe_gpt(1);
  config.moe_top_k = 5;
  EXPECT_EQ(message_of([&] { GPT model(config); }), "GPTConfig: moe_top_k (5) must be in [1, moe_experts = 4]");
  config = moe_gpt(1);
  config.recompute = Recompute::full;
  EXPECT_EQ(message_of([&] { GPT model(config); }),
            "GPTConfig: a mixture of experts does not run under recompute full (its auxiliary losses are recorded "
            "in forward, which full recomputation reruns without a graph)");
  EXPECT_EQ(message_of([] { parse_moe_router("top1"); }),
            "moe router: 'top1' is not one of softmax-topk, topk-softmax");
}

}  // namespace
}  // namespace sl::nn
