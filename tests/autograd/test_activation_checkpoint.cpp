// Activation recomputation (autograd/checkpoint.h, GPTConfig::recompute): gradients bitwise equal to
// keeping the activations, in f32 and bf16, with dropout on; the dropout generator is rewound for the
// rerun and put back after; zero-bubble's B/W split through a checkpoint; and the activation bytes
// a GPT layer keeps under none, selective and full, from Korthikanti et al.'s formulas.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <optional>
#include <tuple>

#include "autograd/checkpoint.h"
#include "autograd/deferred_grad.h"
#include "autograd/grad_mode.h"
#include "nn/gpt.h"
#include "tensor/ledger.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// y = dropout(gelu(x @ w^T), 0.3) @ w: two uses of w, a random mask, a nonlinearity.
TensorList mlp_like(const TensorList& in) {
  Tensor h = dropout(gelu(matmul(in[0], in[1], false, true)), 0.3, true);
  return {matmul(h, in[1])};
}

struct Grads {
  Tensor y, dx, dw;
  uint64_t generator_after = 0;
};

Grads run_mlp_like(DType dtype, bool recompute, bool rewind = true) {
  Generator data(5);
  Tensor x = cast(randn({6, 8}, {}, &data), dtype).set_requires_grad();
  Tensor w = cast(randn({16, 8}, {}, &data), dtype).set_requires_grad();
  manual_seed(77);
  Tensor y = recompute ? checkpoint(mlp_like, {x, w})[0] : mlp_like({x, w})[0];
  if (!rewind) default_generator().set_offset(default_generator().offset() + 1000);  // see the planted bug below
  y.backward(cast(randn(y.shape(), {}, &data), dtype));
  return {y.detach(), x.grad(), w.grad(), default_generator().offset()};
}

TEST(Checkpoint, GradientsAreBitwiseThoseOfKeepingTheActivations) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Grads kept = run_mlp_like(dtype, false), rerun = run_mlp_like(dtype, true);
    EXPECT_TRUE(bitwise_equal(kept.y, rerun.y));
    EXPECT_TRUE(bitwise_equal(kept.dx, rerun.dx));
    EXPECT_TRUE(bitwise_equal(kept.dw, rerun.dw));
    // The rerun drew the forward's counters again and put the generator back: later draws are unchanged.
    EXPECT_EQ(kept.generator_after, rerun.generator_after);
  }
}

TEST(Checkpoint, TheRerunDrawsTheForwardsDropoutMaskNotTheGeneratorsNext) {
  // Between forward and backward other code draws (the next micro-batch's dropout): the rerun must
  // still see the first run's mask. A checkpoint that reran from the generator as it stands would
  // give another mask, and gradients of another function.
  Grads kept = run_mlp_like(DType::f32, false, /*rewind=*/false);
  Grads rerun = run_mlp_like(DType::f32, true, /*rewind=*/false);
  EXPECT_TRUE(bitwise_equal(kept.dx, rerun.dx));
  EXPECT_TRUE(bitwise_equal(kept.dw, rerun.dw));
}

TEST(Checkpoint, KeepsOnlyItsInputs) {
  Generator data(3);
  Tensor x = randn({64, 32}, {}, &data).set_requires_grad();
  Tensor w = randn({128, 32}, {}, &data).set_requires_grad();
  auto held_by = [&](bool recompute) {
    MemoryScope scope(MemoryCategory::activations);
    const int64_t before = MemoryLedger::instance().current(Device::cpu(0), MemoryCategory::activations);
    Tensor y = recompute ? checkpoint(mlp_like, {x, w})[0] : mlp_like({x, w})[0];
    return MemoryLedger::instance().current(Device::cpu(0), MemoryCategory::activations) - before;
  };
  // Kept: x @ wᵀ [64, 128] (gelu's input), dropout's mask (f32) and its output [64, 128] (the second
  // matmul's input), and y [64, 32]. Checkpointed: only y; its inputs x and w are the caller's own.
  const int64_t y_bytes = 64 * 32 * 4;
  EXPECT_EQ(held_by(true), y_bytes);
  EXPECT_EQ(held_by(false), y_bytes + 3 * 64 * 128 * 4);
}

TEST(Checkpoint, WithoutAnInputThatNeedsGradItRunsOnTheTapeSoParametersStillLearn) {
  Generator data(3);
  Tensor x = randn({4, 8}, {}, &data);  // data: needs no gradient
  Tensor w = randn({16, 8}, {}, &data).set_requires_grad();
  Tensor y = checkpoint([w](const TensorList& in) { return TensorList{matmul(in[0], w, false, true)}; }, {x})[0];
  sum(y).backward();
  ASSERT_TRUE(w.grad().defined());
  Tensor expected = w.grad();
  w.set_grad(Tensor());
  sum(matmul(x, w, false, true)).backward();
  EXPECT_TRUE(bitwise_equal(w.grad(), expected));
}

TEST(Checkpoint, ASecondBackwardIsRefused) {
  Tensor x = randn({4, 8}).set_requires_grad();
  Tensor y = checkpoint([](const TensorList& in) { return TensorList{mul(in[0], in[0])}; }, {x})[0];
  sum(y).backward();
  expect_error([&] { sum(y).backward(); }, "backward through the graph a second time");
}

TEST(Checkpoint, ZeroBubblesSplitDefersTheRerunsWeightGradients) {
  auto grads = [](bool defer) {
    Generator data(5);
    Tensor x = randn({6, 8}, {}, &data).set_requires_grad();
    Tensor w = randn({16, 8}, {}, &data).set_requires_grad();
    manual_seed(77);
    Tensor y = checkpoint(mlp_like, {x, w})[0];
    Tensor dy = randn(y.shape(), {}, &data);
    DeferredGrads later;
    {
      std::optional<DeferGradsGuard> guard;
      if (defer) guard.emplace(later, TensorList{w});
      y.backward(dy);
    }
    const bool w_waited = !w.grad().defined();
    later.run();
    return std::tuple{x.grad(), w.grad(), w_waited};
  };
  auto [dx, dw, fused_waited] = grads(false);
  auto [split_dx, split_dw, split_waited] = grads(true);
  EXPECT_FALSE(fused_waited);
  EXPECT_TRUE(split_waited);  // B gave dx only; W filled dw
  EXPECT_TRUE(bitwise_equal(dx, split_dx));
  EXPECT_TRUE(bitwise_equal(dw, split_dw));
}

}  // namespace
}  // namespace sl

namespace sl::nn {
namespace {

Tensor token_rows(int64_t rows, int64_t length, int64_t vocab) {
  std::vector<double> values;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < length; ++t) values.push_back(static_cast<double>((7 * r + 3 * t) % vocab));
  return from_vector(values, {rows, length}, DType::i64);
}

// Two micro-batches of loss, backward each (dropout on): the losses and every parameter's gradient.
std::pair<std::vector<double>, TensorList> gpt_grads(Recompute recompute) {
  GPTConfig config{64, 16, 2, 2, 32, 0.2, recompute};
  GPT model(config, 3);
  manual_seed(11);
  std::vector<double> losses;
  for (int micro = 0; micro < 2; ++micro) {
    Tensor tokens = token_rows(3, 17, 64).narrow(0, 0, 3);
    Tensor loss = model.loss(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16));
    loss.backward();
    losses.push_back(loss.item());
  }
  TensorList grads;
  for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
  return {losses, grads};
}

TEST(GPTRecompute, SelectiveAndFullGiveBitwiseTheGradientsOfKeepingEverything) {
  auto [losses, grads] = gpt_grads(Recompute::none);
  for (Recompute mode : {Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(recompute_name(mode));
    auto [mode_losses, mode_grads] = gpt_grads(mode);
    EXPECT_EQ(mode_losses, losses);
    ASSERT_EQ(mode_grads.size(), grads.size());
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bitwise_equal(mode_grads[i], grads[i])) << "parameter " << i;
  }
}

TEST(GPTRecompute, UnknownModesAreRefusedNamingTheAllowedOnes) {
  expect_error([] { parse_recompute("partial"); }, "'partial' is not one of none, selective, full");
}

// The activation bytes one layer keeps from its forward to its backward: the difference between
// an (L+1)-layer and an L-layer model's held activations after forward.
int64_t layer_activation_bytes(Recompute recompute, int64_t B, int64_t T, int64_t C, int64_t NH,
                               DType dtype = DType::f32) {
  auto held = [&](int64_t layers) {
    GPTConfig config{64, T, layers, NH, C, 0.1, recompute};
    config.param_dtype = dtype;
    GPT model(config, 1);
    Tensor tokens = token_rows(B, T + 1, 64);
    const int64_t before = MemoryLedger::instance().current(Device::cpu(0), MemoryCategory::activations);
    Tensor loss = model.loss(tokens.narrow(1, 0, T), tokens.narrow(1, 1, T));
    return MemoryLedger::instance().current(Device::cpu(0), MemoryCategory::activations) - before;
  };
  return held(2) - held(1);
}

// Korthikanti et al. 2022, Table 2, count bytes per layer with 2-byte activations and 1-byte dropout
// masks (s = T, b = B, h = C, a = NH):  none sbh(34 + 5as/h), selective 34sbh, full 2sbh. In
// elements that is 16 sbh activations + 2 sbh masks, and 2 as² b + 1 as² b mask: the attention's
// scores, probabilities and their dropout mask, all [b, a, s, s]. shardlab keeps every one of those
// 16 sbh in f32 (4 bytes), with three differences:
//   - its masks are f32 too (4 bytes, not 1): the mask is the dropout's scaled keep/drop factor;
//   - it drops out once in the attention output (before c_proj), not after the MLP: 1 sbh mask, not 2;
//   - LayerNorm keeps its mean and 1/std per row: 2 LNs x 2 floats x sb (Korthikanti leave them out).
// and one that removes the 5as/h term: the attention core is blockwise (causal_attention_packed,
// FlashAttention). It keeps c_attn's output q | k | v [b, s, 3h] (the 12 sbh bytes the formula's
// q kᵀ and · v keep anyway), its output out [b, s, h] (the heads side by side; with dropout 0 that
// is c_proj's own input, kept once) and the rows' log-sum-exp lse [b, a, s], and no [s, s] matrix
// at all: the probabilities and the dropout mask are recomputed from lse and the Philox counters in
// backward. So, in f32 bytes, with dropout on:
//   none       68 sbh + 16 sb + (4 sbh + 4 asb)   (out and lse)
//   selective  68 sbh + 16 sb                     (the rerun core keeps only its input q | k | v)
//   full       4 sbh                              (the block's input)
// Selective recomputation has nothing quadratic left to save in attention: what it drops is out and
// lse, linear in s like every other term, for the price of a second attention forward. It was worth
// it only while the core kept its T×T matrices.
// In bf16 (mixed precision) every activation and mask is 2 bytes, LayerNorm's mean and 1/std stay
// f32 (16 sb), and the blockwise core keeps out in bf16 (2 sbh) and lse in f32 (4 asb):
//   none       34 sbh + 16 sb + (2 sbh + 4 asb)   selective  34 sbh + 16 sb   full  2 sbh
// 34 sbh is the paper's own: one 2-byte mask weighs what its two 1-byte masks do. No as²b term.
TEST(GPTRecompute, ActivationBytesPerLayerFollowKorthikantisTable) {
  for (auto [B, T, C, NH] : {std::array<int64_t, 4>{2, 8, 32, 2}, {3, 16, 48, 4}}) {
    SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C));
    const int64_t sbh = T * B * C, sb = T * B, asb = NH * T * B, HS = C / NH;
    const int64_t out_bytes = 4 * B * T * NH * HS, lse_bytes = 4 * B * NH * T;  // [B, T, NH·HS], [B, NH, T]
    EXPECT_EQ(out_bytes + lse_bytes, 4 * sbh + 4 * asb);
    EXPECT_EQ(layer_activation_bytes(Recompute::none, B, T, C, NH), 68 * sbh + 16 * sb + out_bytes + lse_bytes);
    EXPECT_EQ(layer_activation_bytes(Recompute::selective, B, T, C, NH), 68 * sbh + 16 * sb);
    EXPECT_EQ(layer_activation_bytes(Recompute::full, B, T, C, NH), 4 * sbh);
    EXPECT_EQ(layer_activation_bytes(Recompute::none, B, T, C, NH, DType::bf16), 34 * sbh + 16 * sb + 2 * sbh + 4 * asb);
    EXPECT_EQ(layer_activation_bytes(Recompute::selective, B, T, C, NH, DType::bf16), 34 * sbh + 16 * sb);
    EXPECT_EQ(layer_activation_bytes(Recompute::full, B, T, C, NH, DType::bf16), 2 * sbh);
  }
}

}  // namespace
}  // namespace sl::nn
