// The GPT: loss at initialisation, learning, determinism, greedy generation; and three checks that
// do not trust the model's own code: causality (bitwise), a 1-layer forward composed by hand from
// primitive ops, and f64 gradchecks of a Block and of a whole tiny GPT.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "autograd/grad_mode.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

const GPTConfig kTiny{64, 16, 2, 2, 32, 0.0};
// SL_TEST_DEVICE=cuda runs the tests that open with SL_TEST_ON_DEVICE() on cuda:0 (tests/support/parallel.h):
// the shapes, the loss at initialisation, learning, generation and the tied head. The bitwise and
// by-hand checks, and the f64 gradchecks, stay on the CPU.

Tensor random_tokens(const Shape& shape, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return cast(mul(rand(shape, {}, &gen), static_cast<double>(vocab)), DType::i64);
}

TEST(GPT, ForwardShapes) {
  SL_TEST_ON_DEVICE();  // SL_TEST_DEVICE=cuda: on cuda:0
  GPT model(kTiny);
  Tensor logits = model.forward(random_tokens({3, 10}, 64, 1));
  EXPECT_EQ(logits.shape(), (Shape{3, 10, 64}));
}

TEST(GPT, LossAtInitialisationIsNearLogV) {
  SL_TEST_ON_DEVICE();  // SL_TEST_DEVICE=cuda: on cuda:0
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
    const std::vector<double> values = p.to_vector();  // f32 values, exact as doubles; from a GPU too
    flat.insert(flat.end(), values.begin(), values.end());
  }
  return flat;
}

TEST(GPT, FiftyStepsAtLeastHalveTheLoss) {
  SL_TEST_ON_DEVICE();  // SL_TEST_DEVICE=cuda: on cuda:0
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
  SL_TEST_ON_DEVICE();  // SL_TEST_DEVICE=cuda: on cuda:0
  GPT model(kTiny, 1);
  Tensor prompt = random_tokens({2, 5}, 64, 3);
  Tensor out = model.generate(prompt, 3);
  EXPECT_EQ(out.shape(), (Shape{2, 8}));
  EXPECT_EQ(out.narrow(1, 0, 5).to_vector(), prompt.to_vector());
  Tensor first = argmax(model.forward(prompt).narrow(1, 4, 1), 2);  // [2, 1]
  EXPECT_EQ(out.narrow(1, 5, 1).to_vector(), first.to_vector());
}

TEST(GPT, TheHeadIsTiedToTheTokenEmbedding) {
  SL_TEST_ON_DEVICE();  // SL_TEST_DEVICE=cuda: on cuda:0
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

// ---- independent checks ---------------------------------------------------------------------------

// Changing token t+1 must leave the logits at positions 0..t bitwise unchanged: the causal mask
// gives the future exactly zero weight, and 0 * v adds exactly nothing.
TEST(GPT, ChangingTokenTPlusOneLeavesEarlierLogitsBitwiseUnchanged) {
  GPT model(kTiny, 3);
  model.eval();
  const int64_t B = 2, T = 10, V = kTiny.vocab_size;
  Tensor tokens = random_tokens({B, T}, V, 4);
  const std::vector<double> base = model.forward(tokens).to_vector();  // [B, T, V]
  for (int64_t t = 0; t + 1 < T; ++t) {
    std::vector<double> changed_ids = tokens.to_vector();
    for (int64_t b = 0; b < B; ++b) changed_ids[b * T + t + 1] = std::fmod(changed_ids[b * T + t + 1] + 1, V);
    const std::vector<double> changed = model.forward(from_vector(changed_ids, {B, T}, DType::i64)).to_vector();
    bool later_differs = false;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < T; ++p)
        for (int64_t v = 0; v < V; ++v) {
          const int64_t i = (b * T + p) * V + v;
          if (p <= t) {
            ASSERT_EQ(changed[i], base[i]) << "token " << t + 1 << " changed the logit at position " << p;
          } else {
            later_differs = later_differs || changed[i] != base[i];
          }
        }
    EXPECT_TRUE(later_differs) << "changing token " << t + 1 << " changed nothing at all";
  }
}

// A 1-layer GPT's logits [B, T, V], composed in the test from primitive ops: no Module::forward, no
// fused op (Linear = matmul + add, attention = masked_fill + softmax, LayerNorm and GELU by formula).
Tensor hand_forward(const GPT& model, const Tensor& idx) {
  const StateDict p = model.state_dict();
  const GPTConfig& c = model.config();
  const int64_t B = idx.size(0), T = idx.size(1), C = c.n_embd, NH = c.n_head, HS = C / NH;
  auto layer_norm_ = [&](const Tensor& x, const std::string& name) {  // over C, eps 1e-5
    Tensor centered = sub(x, mean(x, 2, true));
    Tensor variance = mean(mul(centered, centered), 2, true);
    return add(mul(mul(centered, rsqrt(add(variance, 1e-5))), p.at(name + ".weight")), p.at(name + ".bias"));
  };
  auto linear_ = [&](const Tensor& x, const std::string& name) {  // x [B, T, in] @ W[out, in]^T + b
    return add(matmul(x, p.at(name + ".weight"), false, true), p.at(name + ".bias"));
  };
  auto gelu_ = [](const Tensor& x) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    Tensor inner = mul(add(x, mul(pow(x, 3.0), 0.044715)), std::sqrt(2.0 / std::numbers::pi));
    return mul(mul(x, 0.5), add(tanh(inner), 1.0));
  };
  auto heads = [&](const Tensor& t) { return permute(reshape(t, {B, T, NH, HS}), {0, 2, 1, 3}); };  // [B,NH,T,HS]

  Tensor positions = arange(T, TensorOptions(DType::i64));
  Tensor x = add(embedding(p.at("wte.weight"), idx), embedding(p.at("wpe.weight"), positions));  // [B, T, C]
  Tensor qkv = linear_(layer_norm_(x, "h.0.ln_1"), "h.0.attn.c_attn");                           // [B, T, 3C]
  Tensor q = heads(narrow(qkv, 2, 0, C)), k = heads(narrow(qkv, 2, C, C)), v = heads(narrow(qkv, 2, 2 * C, C));
  Tensor scores = mul(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(HS)));  // [B, NH, T, T]
  Tensor att = softmax(masked_fill(scores, causal_mask(T), -std::numeric_limits<double>::infinity()));
  Tensor y = reshape(permute(matmul(att, v), {0, 2, 1, 3}), {B, T, C});
  x = add(x, linear_(y, "h.0.attn.c_proj"));
  x = add(x, linear_(gelu_(linear_(layer_norm_(x, "h.0.ln_2"), "h.0.mlp.c_fc")), "h.0.mlp.c_proj"));
  x = layer_norm_(x, "ln_f");
  return matmul(x, p.at("wte.weight"), false, true);  // the head is tied to wte: [B, T, V]
}

TEST(GPT, OneLayerLogitsEqualAForwardComposedByHand) {
  const GPTConfig config{64, 16, 1, 4, 32, 0.0};
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    GPT model(config, 9);
    model.to(dtype);
    // Weights of N(0, 0.02) leave every block nearly the identity: in f64, scale them up (x 20) so
    // attention and the MLP change the logits by O(1) and a wrong sign or a missing term cannot hide.
    // (In f32 those peaked softmaxes amplify rounding to ~1e-3: f32 is checked at GPT's own init.)
    NoGradGuard no_grad;
    if (dtype == DType::f64)
      for (const Tensor& param : model.parameters()) param.copy_(mul(param.detach(), 20.0));
    Tensor idx = random_tokens({3, 12}, config.vocab_size, 5);
    std::vector<double> got = model.forward(idx).to_vector(), want = hand_forward(model, idx).to_vector();
    ASSERT_EQ(got.size(), want.size());
    // f32: the fused ops sum in another order (~1e-6 relative); f64: only rounding.
    const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-10;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << "logit " << i;
  }
}

TEST(GPTGradcheck, Block) {
  const GPTConfig config{16, 8, 2, 2, 8, 0.0};
  Generator generator(21);
  InitOptions init{0.3, &generator, DType::f32};  // larger than GPT's 0.02 so every path matters
  Block block(config, init);
  block.to(DType::f64);
  Tensor x = randn({2, 3, 8}, TensorOptions(DType::f64).with_requires_grad(), &generator);
  TensorList inputs{x};
  for (const Tensor& param : block.parameters()) inputs.push_back(param);
  // x, then every parameter of the block: gradcheck perturbs them in place, the block reads them.
  const int64_t C = 8,
                block_numel = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  expect_gradcheck([&](const TensorList& in) { return block.forward(in[0]); }, inputs, 2 * 3 * C + block_numel);
}

TEST(GPTGradcheck, WholeTinyGPT) {
  const GPTConfig config{7, 4, 2, 2, 4, 0.0};
  GPT model(config, 13);
  model.to(DType::f64);
  Generator generator(22);
  {
    NoGradGuard no_grad;
    for (const Tensor& param : model.parameters())  // N(0, 0.02) -> N(0, 0.3): see the Block's check
      param.copy_(mul(randn(param.shape(), TensorOptions(DType::f64), &generator), 0.3));
  }
  Tensor idx = from_vector({1, 6, 0, 3, 5, 5, 2, 4}, {2, 4}, DType::i64);
  Tensor targets = from_vector({6, 0, 3, -100, 5, 2, 4, 1}, {2, 4}, DType::i64);
  const int64_t V = 7, T = 4, C = 4;
  const int64_t block_numel = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  const int64_t gpt_numel = V * C + T * C + 2 * block_numel + 2 * C;  // wte (also the head), wpe, blocks, ln_f
  // The logits, and the loss (the tied head and the embedding both feed wte's gradient).
  expect_gradcheck([&](const TensorList&) { return model.forward(idx); }, model.parameters(), gpt_numel);
  expect_gradcheck([&](const TensorList&) { return model.loss(idx, targets); }, model.parameters(), gpt_numel);
}

}  // namespace
}  // namespace sl::nn
