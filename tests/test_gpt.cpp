// The GPT: loss at initialisation, learning, determinism, greedy generation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "nn/gpt.h"
#include "nn/optim.h"

namespace sl::nn {
namespace {

const GPTConfig kTiny{64, 16, 2, 2, 32, 0.0};

Tensor random_tokens(const Shape& shape, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return cast(mul(rand(shape, {}, &gen), static_cast<double>(vocab)), DType::i64);
}

TEST(GPT, ForwardShapes) {
  GPT model(kTiny);
  Tensor logits = model.forward(random_tokens({3, 10}, 64, 1));
  EXPECT_EQ(logits.shape(), (Shape{3, 10, 64}));
}

TEST(GPT, LossAtInitialisationIsNearLogV) {
  GPTConfig config{256, 64, 4, 4, 128, 0.0};
  GPT model(config, 7);
  Tensor tokens = random_tokens({4, 65}, 256, 2);
  double loss = model.loss(tokens.narrow(1, 0, 64), tokens.narrow(1, 1, 64)).item();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

// Rows of "count up by one": tokens[r][t] = (7 r + t) mod V, a pattern a tiny model learns fast.
Tensor counting_tokens(int64_t rows, int64_t length, int64_t vocab) {
  std::vector<double> values;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < length; ++t) values.push_back(static_cast<double>((7 * r + t) % vocab));
  return from_vector(values, {rows, length}, DType::i64);
}

std::vector<float> train_steps(uint64_t seed, int steps, std::vector<double>* losses = nullptr) {
  GPT model(kTiny, seed);
  AdamW optimizer(model.parameters(), AdamWOptions{3e-3});
  Tensor tokens = counting_tokens(8, 17, kTiny.vocab_size);
  Tensor inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    Tensor loss = model.loss(inputs, targets);
    loss.backward();
    clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    if (losses) losses->push_back(loss.item());
  }
  std::vector<float> flat;
  for (const Tensor& p : model.parameters()) {
    const float* data = p.data<float>();
    flat.insert(flat.end(), data, data + p.numel());
  }
  return flat;
}

TEST(GPT, FiftyStepsAtLeastHalveTheLoss) {
  std::vector<double> losses;
  train_steps(0, 50, &losses);
  EXPECT_LT(losses.back(), losses.front() / 2) << "first " << losses.front() << " last " << losses.back();
}

TEST(GPT, SameSeedGivesByteIdenticalParametersAfterTenSteps) {
  std::vector<float> a = train_steps(5, 10), b = train_steps(5, 10), c = train_steps(6, 10);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
}

TEST(GPT, GreedyGenerationAppendsTheArgmax) {
  GPT model(kTiny, 1);
  Tensor prompt = random_tokens({2, 5}, 64, 3);
  Tensor out = model.generate(prompt, 3);
  EXPECT_EQ(out.shape(), (Shape{2, 8}));
  EXPECT_EQ(out.narrow(1, 0, 5).to_vector(), prompt.to_vector());
  Tensor first = argmax(model.forward(prompt).narrow(1, 4, 1), 2);  // [2, 1]
  EXPECT_EQ(out.narrow(1, 5, 1).to_vector(), first.to_vector());
}

TEST(GPT, TheHeadIsTiedToTheTokenEmbedding) {
  GPT model(kTiny, 1);
  model.loss(random_tokens({1, 4}, 64, 1), random_tokens({1, 4}, 64, 2)).backward();
  // wte gets gradient from both the embedding lookup (4 rows) and the head (every row).
  std::vector<double> g = model.wte->weight.grad().to_vector();
  int nonzero_rows = 0;
  for (int64_t row = 0; row < 64; ++row) {
    double s = 0;
    for (int64_t c = 0; c < 32; ++c) s += std::abs(g[row * 32 + c]);
    nonzero_rows += s > 0;
  }
  EXPECT_EQ(nonzero_rows, 64);
}

}  // namespace
}  // namespace sl::nn
