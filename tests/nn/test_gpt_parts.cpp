// The GPT cut into parts: shard specs (layer ranges), embed/blocks/head, forward hooks, placements.
//
// A part must equal the same part of the whole model bitwise (weights, activations, gradients), because
// every later chapter (pipelines, tensor and context parallelism) builds its ranks from parts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "nn/gpt.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

const GPTConfig kFourLayers{64, 16, 4, 2, 32, 0.0};  // V, block_size, n_layer, n_head, n_embd
constexpr uint64_t kSeed = 11;

Tensor random_tokens(const Shape& shape, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return cast(mul(rand(shape, {}, &gen), static_cast<double>(vocab)), DType::i64);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;  // tensors are contiguous
}

// ---- every layer range is the matching slice of the whole model -------------------------------------------

struct Range {
  int64_t begin, end;
};
class GPTPartWeights : public ::testing::TestWithParam<Range> {};

TEST_P(GPTPartWeights, EqualTheWholeModelsWeightsBitwise) {
  GPT whole(kFourLayers, kSeed);
  GPT part(kFourLayers, kSeed, GPTShardSpec::layers(GetParam().begin, GetParam().end));
  StateDict reference = whole.state_dict();
  int64_t expected_count = 0;  // derived from the range, not from the part
  expected_count += 4 * (GetParam().end - GetParam().begin) * 3;  // 4 Linears x (weight, bias) + 2 LayerNorms x 2 = 12
  expected_count += GetParam().begin == 0 ? 2 : 0;                                       // wte, wpe
  expected_count += GetParam().end == 4 ? 2 + (GetParam().begin == 0 ? 0 : 1) : 0;       // ln_f (+ tied wte copy)
  EXPECT_EQ(static_cast<int64_t>(part.named_parameters().size()), expected_count);
  for (auto& [name, value] : part.named_parameters()) {
    ASSERT_TRUE(reference.count(name)) << name << " is not a parameter of the whole model";
    EXPECT_TRUE(bitwise_equal(value, reference.at(name))) << name << " differs from the whole model's";
  }
}

std::vector<Range> every_range() {
  std::vector<Range> out;
  for (int64_t begin = 0; begin <= 4; ++begin)
    for (int64_t end = begin; end <= 4; ++end)
      if (begin < end || begin == 0 || end == 4) out.push_back({begin, end});
  return out;
}
INSTANTIATE_TEST_SUITE_P(EveryRangeOfFourLayers, GPTPartWeights, ::testing::ValuesIn(every_range()),
                         [](const auto& info) {
                           return "layers_" + std::to_string(info.param.begin) + "_" + std::to_string(info.param.end);
                         });

// The counters the parts use are only right if the whole model draws its weights one after the other in
// registration order. Redraw them here with a fresh sequential generator, independently of GPT::block_counter.
TEST(GPTParts, TheWholeModelDrawsEveryWeightInRegistrationOrder) {
  GPT whole(kFourLayers, kSeed);
  Generator sequential(kSeed);
  const double residual_std = 0.02 / std::sqrt(2.0 * kFourLayers.n_layer);
  int drawn = 0;
  for (auto& [name, value] : whole.named_parameters()) {
    bool is_layer_norm = name.find("ln_") != std::string::npos, is_bias = name.ends_with(".bias");
    if (is_layer_norm || is_bias) continue;  // constants: no draw
    double std = name.ends_with("c_proj.weight") ? residual_std : 0.02;
    Tensor expected = mul(randn(value.shape(), {}, &sequential), std);
    EXPECT_TRUE(bitwise_equal(value, expected)) << name;
    ++drawn;
  }
  EXPECT_EQ(drawn, 2 + 4 * 4);  // wte, wpe, and four weights per block
}

// ---- the parts compose to the whole forward and backward ---------------------------------------------------

TEST(GPTParts, ChainedPartsComputeTheWholeModelsLogitsAndGradients) {
  GPT whole(kFourLayers, kSeed);
  std::vector<std::unique_ptr<GPT>> parts;
  for (Range r : {Range{0, 1}, Range{1, 3}, Range{3, 4}})
    parts.push_back(std::make_unique<GPT>(kFourLayers, kSeed, GPTShardSpec::layers(r.begin, r.end)));
  Tensor idx = random_tokens({2, 12}, 64, 3), targets = random_tokens({2, 12}, 64, 4);

  Tensor expected_logits = whole.forward(idx);
  cross_entropy(expected_logits, targets).backward();
  Tensor x = idx;
  for (auto& part : parts) x = part->forward_part(x);
  EXPECT_TRUE(bitwise_equal(x, expected_logits));
  cross_entropy(x, targets).backward();

  StateDict reference = whole.state_dict();
  for (auto& part : parts)
    for (auto& [name, value] : part->named_parameters()) {
      if (name == "wte.weight") continue;  // split between the first and the last part: checked below
      ASSERT_TRUE(value.grad().defined()) << name;
      EXPECT_TRUE(bitwise_equal(value.grad(), reference.at(name).grad())) << name;
    }
  // wte's gradient is the embedding's plus the head's; each part holds one of the two terms.
  Tensor summed = add(parts.front()->wte->weight.grad(), parts.back()->wte->weight.grad());
  EXPECT_TRUE(bitwise_equal(summed, reference.at("wte.weight").grad()));
  EXPECT_EQ(parts.back()->placement("wte.weight"), Placement::tied("wte"));
  EXPECT_EQ(parts.front()->placement("wte.weight"), Placement::replicated());
}

TEST(GPTParts, ASequenceShardEmbedsItsGlobalPositions) {
  GPT whole(kFourLayers, kSeed);
  Tensor idx = random_tokens({2, 12}, 64, 5);
  NoGradGuard no_grad;
  Tensor full = whole.embed(idx);
  Tensor second_half = whole.embed(idx.narrow(1, 6, 6), arange(6, 12, 1, TensorOptions(DType::i64)));
  EXPECT_TRUE(bitwise_equal(second_half, full.narrow(1, 6, 6)));
  Tensor wrong = whole.embed(idx.narrow(1, 6, 6));  // positions 0..5: not the shard's
  EXPECT_FALSE(bitwise_equal(wrong, full.narrow(1, 6, 6)));
}

TEST(GPTParts, ModuleListNamesKeepTheGlobalLayerIndex) {
  GPT part(kFourLayers, kSeed, GPTShardSpec::layers(2, 4));
  EXPECT_EQ(part.named_parameters().at(1).first, "h.2.ln_1.weight");  // after the tied wte copy
  EXPECT_EQ(&part.block(3), &part.h->at<Block>(1));
}

// ---- errors ------------------------------------------------------------------------------------------------

TEST(GPTParts, ARangeThatDoesNotFitIsRefusedNamingTheValues) {
  expect_error([] { GPT(kFourLayers, kSeed, GPTShardSpec::layers(3, 2)); }, "layers [3, 2) do not fit a model of n_layer 4");
  expect_error([] { GPT(kFourLayers, kSeed, GPTShardSpec::layers(0, 5)); }, "layers [0, 5) do not fit");
  expect_error([] { GPT(kFourLayers, kSeed, GPTShardSpec::layers(2, 2)); }, "layers [2, 2) holds nothing");
}

TEST(GPTParts, APartRefusesWhatItDoesNotHold) {
  GPT middle(kFourLayers, kSeed, GPTShardSpec::layers(1, 3));
  Tensor idx = random_tokens({1, 4}, 64, 6);
  expect_error([&] { middle.forward(idx); }, "holds only layers [1, 3) of 4 layers");
  expect_error([&] { middle.embed(idx); }, "does not hold the embedding");
  expect_error([&] { middle.head(zeros({1, 4, 32})); }, "does not hold the head");
  expect_error([&] { middle.block(0); }, "layer 0 is not in this part (layers [1, 3))");
  GPT whole(kFourLayers, kSeed);
  expect_error([&] { whole.embed(idx, arange(3, TensorOptions(DType::i64))); }, "positions must be [T] = [4]");
  expect_error([&] { whole.blocks(zeros({1, 4, 16}), 0, 1); }, "x must be [B, T, C=32]");
}

// ---- hooks ---------------------------------------------------------------------------------------------------

TEST(ModuleHooks, PreAndPostHooksRunAroundForwardAndCanReplaceTheOutput) {
  GPT model(kFourLayers, kSeed);
  std::vector<std::string> calls;
  Block& block = model.block(1);
  int pre = block.register_forward_pre_hook([&](Module&, const Tensor& input) {
    calls.push_back("pre " + input.shape().str());
  });
  int post = block.register_forward_hook([&](Module&, const Tensor&, const Tensor& output) {
    calls.push_back("post");
    return mul(output, 0.0);  // replaces the block's output
  });
  NoGradGuard no_grad;
  Tensor idx = random_tokens({1, 5}, 64, 7);
  Tensor x = model.blocks(model.embed(idx), 0, 2);
  EXPECT_EQ(calls, (std::vector<std::string>{"pre [1, 5, 32]", "post"}));
  EXPECT_EQ(max_abs_diff(x, zeros_like(x)), 0.0);  // the replaced output flowed on
  block.remove_hook(pre);
  block.remove_hook(post);
  model.blocks(model.embed(idx), 0, 2);
  EXPECT_EQ(calls.size(), 2u);
  expect_error([&] { block.remove_hook(pre); }, "no hook with id");
}

TEST(ModuleHooks, APartsHooksSeeItsInputAndOutput) {
  GPT part(kFourLayers, kSeed, GPTShardSpec::layers(0, 2));
  Shape seen_in, seen_out;
  part.register_forward_hook([&](Module&, const Tensor& input, const Tensor& output) {
    seen_in = input.shape();
    seen_out = output.shape();
    return Tensor();  // keep the output
  });
  NoGradGuard no_grad;
  part.forward_part(random_tokens({2, 3}, 64, 8));
  EXPECT_EQ(seen_in, (Shape{2, 3}));
  EXPECT_EQ(seen_out, (Shape{2, 3, 32}));
}

TEST(Placements, DescribeThemselvesAndAreSetByName) {
  GPT model(kFourLayers, kSeed);
  for (auto& [name, placement] : model.named_placements()) EXPECT_EQ(placement, Placement::replicated()) << name;
  model.set_placement("h.0.mlp.c_fc.weight", Placement::sharded(0, "tp"));
  EXPECT_EQ(model.placement("h.0.mlp.c_fc.weight").str(), "sharded(dim 0 over tp)");
  EXPECT_EQ(Placement::replicated().with_partial_grad("tp").str(), "replicated +partial grad over tp");
  EXPECT_EQ(Placement::tied("wte").str(), "tied(wte)");
  expect_error([&] { model.placement("h.9.mlp.c_fc.weight"); }, "no parameter named 'h.9.mlp.c_fc.weight'");
  expect_error([] { Placement::sharded(0, "tp").with_partial_grad("tp"); }, "cannot also have partial gradients");
}

}  // namespace
}  // namespace sl::nn
