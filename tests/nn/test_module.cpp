// nn::Module and the layers: names, state dicts, strict loading, train/eval, to(device).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/gpt.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

TEST(Module, GPTParameterNamesFollowGPT2) {
  GPT model(GPTConfig{32, 8, 2, 2, 16, 0.0});
  std::vector<std::string> names;
  for (auto& [name, _] : model.named_parameters()) names.push_back(name);
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* suffix : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
                               "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      expected.push_back("h." + std::to_string(i) + "." + suffix);
  expected.push_back("ln_f.weight");
  expected.push_back("ln_f.bias");
  EXPECT_EQ(names, expected);
  // Linear weights are [out, in]; the head is tied to wte, so there is no separate lm_head.
  StateDict state = model.state_dict();
  EXPECT_EQ(state.at("h.0.attn.c_attn.weight").shape(), (Shape{48, 16}));
  EXPECT_EQ(state.at("h.1.mlp.c_proj.weight").shape(), (Shape{16, 64}));
  // 12 C^2 + 13 C per block, V C + T C for embeddings, 2 C for ln_f.
  EXPECT_EQ(model.num_parameters(), 2 * (12 * 16 * 16 + 13 * 16) + 32 * 16 + 8 * 16 + 2 * 16);
}

TEST(Module, InitialisationFollowsGPT2) {
  GPT model(GPTConfig{256, 64, 4, 4, 128, 0.0}, /*seed=*/3);
  auto stddev = [](const Tensor& t) {
    std::vector<double> v = t.to_vector();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / v.size());
  };
  StateDict state = model.state_dict();
  EXPECT_NEAR(stddev(state.at("wte.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(state.at("h.0.mlp.c_fc.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(state.at("h.0.attn.c_proj.weight")), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(state.at("h.0.attn.c_attn.bias").to_vector(), std::vector<double>(384, 0.0));
  EXPECT_EQ(state.at("ln_f.weight").to_vector(), std::vector<double>(128, 1.0));
}

TEST(Module, StateDictRoundTrip) {
  GPT a(GPTConfig{32, 8, 2, 2, 16, 0.0}, 1), b(GPTConfig{32, 8, 2, 2, 16, 0.0}, 2);
  EXPECT_FALSE(allclose(a.wte->weight, b.wte->weight));
  b.load_state_dict(a.state_dict());
  for (auto& [name, tensor] : a.state_dict())
    EXPECT_EQ(tensor.to_vector(), b.state_dict().at(name).to_vector()) << name;
  // The copy is deep: changing a afterwards leaves b alone.
  {
    NoGradGuard no_grad;
    a.wte->weight.fill_(0.0);
  }
  EXPECT_NE(b.wte->weight.to_vector()[0], 0.0);
}

TEST(Module, StrictLoadNamesMissingUnexpectedAndMismatchedKeys) {
  GPT model(GPTConfig{32, 8, 1, 2, 16, 0.0});
  StateDict state = model.state_dict();
  state.erase("ln_f.bias");
  state.emplace("lm_head.weight", zeros({32, 16}));
  std::string message = message_of([&] { model.load_state_dict(state); });
  EXPECT_NE(message.find("missing keys: ln_f.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("unexpected keys: lm_head.weight"), std::string::npos) << message;
  model.load_state_dict(state, /*strict=*/false);  // non-strict: loads what matches

  StateDict wrong = model.state_dict();
  wrong["wpe.weight"] = zeros({4, 16});
  message = message_of([&] { model.load_state_dict(wrong); });
  EXPECT_NE(message.find("wpe.weight (checkpoint [4, 16], model [8, 16])"), std::string::npos) << message;

  // Off in every way at once: one message names all three kinds of problem.
  wrong.erase("ln_f.bias");
  wrong.emplace("lm_head.weight", zeros({32, 16}));
  message = message_of([&] { model.load_state_dict(wrong); });
  EXPECT_NE(message.find("shape mismatch for wpe.weight (checkpoint [4, 16], model [8, 16])"), std::string::npos)
      << message;
  EXPECT_NE(message.find("missing keys: ln_f.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("unexpected keys: lm_head.weight"), std::string::npos) << message;
  // Non-strict still refuses the mismatch, and names only it.
  message = message_of([&] { model.load_state_dict(wrong, /*strict=*/false); });
  EXPECT_NE(message.find("shape mismatch for wpe.weight"), std::string::npos) << message;
  EXPECT_EQ(message.find("missing keys"), std::string::npos) << message;
}

TEST(Module, TrainEvalReachesEveryChildAndDropoutObeysIt) {
  Sequential net({std::make_shared<Linear>(4, 4), std::make_shared<Dropout>(0.5)});
  Tensor x = ones({2, 4});
  net.eval();
  EXPECT_FALSE(net.children()[1].second->is_training());
  Tensor a = net(x), b = net(x);
  EXPECT_EQ(a.to_vector(), b.to_vector());  // no dropout in eval
  net.train();
  EXPECT_TRUE(net.children()[1].second->is_training());
}

TEST(Module, ZeroGradDropsGradients) {
  Linear layer(3, 2);
  sum(layer(ones({1, 3}))).backward();
  EXPECT_TRUE(layer.weight.grad().defined());
  layer.zero_grad();
  EXPECT_FALSE(layer.weight.grad().defined());
}

TEST(Module, ToMovesParametersInPlaceAndChargesTheNewDevice) {
  Linear layer(8, 4);          // 32 + 4 floats
  Tensor held = layer.weight;  // a handle taken before the move
  layer.to(Device::cpu(120));
  EXPECT_EQ(held.device(), Device::cpu(120));
  EXPECT_EQ(MemoryLedger::instance().current(Device::cpu(120), MemoryCategory::weights), 36 * 4);
  DeviceGuard on(Device::cpu(120));
  EXPECT_EQ(layer(ones({1, 8})).device(), Device::cpu(120));
}

TEST(Module, LinearChecksItsInput) {
  Linear layer(3, 2);
  std::string message = message_of([&] { layer(ones({2, 4})); });
  EXPECT_NE(message.find("[2, 4] does not end in 3 features"), std::string::npos) << message;
}

TEST(Module, GPTConfigErrorsNameTheValues) {
  std::string message = message_of([] { GPT(GPTConfig{32, 8, 1, 3, 16, 0.0}); });
  EXPECT_NE(message.find("n_embd (16) is not divisible by n_head (3)"), std::string::npos) << message;
  GPT model(GPTConfig{32, 8, 1, 2, 16, 0.0});
  message = message_of([&] { model.forward(zeros({1, 9}, DType::i64)); });
  EXPECT_NE(message.find("sequence length 9 is longer than block_size 8"), std::string::npos) << message;
  message = message_of([&] { model.forward(full({1, 4}, 40, DType::i64)); });
  EXPECT_NE(message.find("40"), std::string::npos) << message;
}

}  // namespace
}  // namespace sl::nn
