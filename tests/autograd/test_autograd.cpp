// Autograd: the tape, the engine, grad mode, hooks and the Function API.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "autograd/deferred_grad.h"
#include "autograd/function.h"
#include "autograd/gradcheck.h"
#include "nn/gpt.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

Tensor leaf(std::vector<double> values, Shape shape) {
  return from_vector(values, shape, TensorOptions{}.with_requires_grad());
}

TEST(Autograd, ChainRuleThroughATensorUsedTwice) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = mul(x, x);          // x used twice: dy/dx = 2x
  Tensor loss = sum(add(y, x));  // d/dx = 2x + 1
  loss.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 5, 7}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(loss.is_leaf());
  EXPECT_EQ(loss.grad_fn()->name(), "SumBackward");
}

TEST(Autograd, LeafGradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2}, {2});
  sum(mul(x, 3.0)).backward();
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{6, 6}));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, BackwardWithAnExplicitGradient) {
  // A pipeline stage receives dL/d(output) from the next stage and calls output.backward(grad).
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = mul(x, x);
  y.backward(from_vector({1, 0, 0, 10}, {2, 2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 0, 0, 80}));
}

TEST(Autograd, NonScalarBackwardWithoutGradientIsAnError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, 2.0);
  std::string message = message_of([&] { y.backward(); });
  EXPECT_NE(message.find("only for a tensor with one element"), std::string::npos) << message;
  EXPECT_NE(message.find("[2]"), std::string::npos) << message;
  message = message_of([&] { y.backward(ones({3})); });
  EXPECT_NE(message.find("gradient has shape [3] but the tensor has shape [2]"), std::string::npos) << message;
}

TEST(Autograd, BackwardOfATensorThatNeedsNoGradIsAnError) {
  std::string message = message_of([] { sum(ones({2})).backward(); });
  EXPECT_NE(message.find("does not require grad"), std::string::npos) << message;
}

TEST(Autograd, NoGradGuardRecordsNothingAndIsPerThread) {
  Tensor x = leaf({1}, {1});
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(mul(x, 2.0).requires_grad());
    // Another thread (another rank) still records.
    std::thread other([&] {
      EXPECT_TRUE(GradMode::is_enabled());
      EXPECT_TRUE(mul(x, 2.0).requires_grad());
    });
    other.join();
    EnableGradGuard enable;
    EXPECT_TRUE(mul(x, 2.0).requires_grad());
  }
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(Autograd, DetachCutsTheGraphButSharesData) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.raw_data(), y.raw_data());
  sum(mul(d, x)).backward();  // only the x factor carries gradient
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 4}));
}

TEST(Autograd, PostAccumulateGradHookSeesTheFinalGradientOncePerBackward) {
  Tensor w = leaf({1, 1}, {2});
  int calls = 0;
  std::vector<double> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& param) {
    calls++;
    seen = param.grad().to_vector();
  });
  // w is used three times: the hook must fire once, after all three contributions are summed.
  sum(add(add(mul(w, 1.0), mul(w, 2.0)), mul(w, 3.0))).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{6, 6}));
}

TEST(Autograd, HooksFireLastLayerFirst) {
  // DDP relies on this: gradients of later layers are ready (and can be communicated) first.
  Tensor w1 = leaf({2}, {1}), w2 = leaf({3}, {1});
  std::vector<std::string> order;
  w1.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back("w1"); });
  w2.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back("w2"); });
  Tensor x = ones({1});
  sum(mul(mul(x, w1), w2)).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"w2", "w1"}));
}

TEST(Autograd, SavedTensorsAreFreedAfterBackwardUnlessRetained) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();  // works: the graph was retained
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{4, 8}));
}

TEST(Autograd, BackwardTwiceThroughFreedSavedTensorsIsAnError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, x);
  y.backward(ones({2}));
  std::string message = message_of([&] { y.backward(ones({2})); });
  EXPECT_NE(message.find("backward: trying to backward through the graph a second time"), std::string::npos) << message;
  EXPECT_NE(message.find("MulBackward"), std::string::npos) << message;
  EXPECT_NE(message.find("retain_graph=true"), std::string::npos) << message;
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 4}));  // the refused pass added nothing

  // Through a node that saved only values (SumBackward keeps the input's shape), not tensors.
  Tensor s = sum(x);
  s.backward();
  message = message_of([&] { s.backward(); });
  EXPECT_NE(message.find("SumBackward"), std::string::npos) << message;
}

TEST(Autograd, RetainedGraphIsFreedByTheLastBackward) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();  // retained: runs, and now frees
  EXPECT_THROW(y.backward(), Error);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{4, 8}));
}

TEST(Autograd, NodesThatSavedNothingCanRunAgain) {
  // As in PyTorch: only a node whose saved state was freed refuses; neg needs nothing saved.
  Tensor x = leaf({1, 2}, {2});
  Tensor y = neg(x);
  y.backward(ones({2}));
  y.backward(ones({2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{-2, -2}));
}

TEST(Autograd, BackwardGradientOnAnotherDeviceIsAnError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, 3.0);
  std::string message = message_of([&] { y.backward(ones({2}, TensorOptions{}.with_device(Device::cpu(1)))); });
  EXPECT_NE(message.find("backward: the gradient is on cpu:1 but the tensor (shape [2]) is on cpu:0"),
            std::string::npos)
      << message;
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, BackwardGradientMustBeFloatingAndIsConvertedToTheTensorsDtype) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, x);
  std::string message = message_of([&] { y.backward(ones({2}, TensorOptions{DType::i64})); });
  EXPECT_NE(message.find("backward: the gradient is i64 but the tensor (shape [2]) is f32"), std::string::npos)
      << message;
  EXPECT_FALSE(x.grad().defined());
  // Another floating dtype is accepted and converted: f64 into an f32 graph.
  y.backward(from_vector({1, 10}, {2}, TensorOptions{DType::f64}));
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 40}));
  // Also when the root is a leaf: its gradient is stored in its own dtype.
  Tensor w = leaf({1, 2}, {2});
  w.backward(from_vector({0.5, 0.25}, {2}, TensorOptions{DType::bf16}));
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{0.5, 0.25}));
}

// A custom differentiable op written with the Function API: y = x^3, dy/dx = 3x^2.
struct Cube : Function<Cube> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return mul(mul(x, x), x);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& x = ctx.saved()[0];
    return {mul(grads[0], mul(mul(x, x), 3.0))};
  }
};

TEST(Autograd, CustomFunction) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = Cube::apply(x);
  EXPECT_EQ(y.grad_fn()->name(), "CubeBackward");
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 12}));
  Tensor x64 = randn({5}, TensorOptions{DType::f64}.with_requires_grad());
  expect_gradcheck([](const TensorList& in) { return Cube::apply(in[0]); }, {x64}, 5);
}

// Megatron's f: identity in forward, a (here: doubled, to be visible) gradient in backward.
// Returning the input itself must not disturb the input's own history.
struct IdentityForwardDoubleBackward : Function<IdentityForwardDoubleBackward> {
  static Tensor forward(FunctionCtx&, const Tensor& x) { return x; }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {mul(grads[0], 2.0)}; }
};

TEST(Autograd, FunctionReturningItsInputGetsItsOwnHistory) {
  Tensor x = leaf({1, 2}, {2});
  Tensor h = mul(x, 1.0);
  Tensor y = IdentityForwardDoubleBackward::apply(h);
  EXPECT_FALSE(y.is_same(h));
  EXPECT_EQ(h.grad_fn()->name(), "MulBackward");
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 2}));
}

// Two outputs; only one used: the other's gradient arrives undefined.
struct SplitHalves : Function<SplitHalves> {
  static TensorList forward(FunctionCtx&, const Tensor& x) { return {mul(x, 1.0), mul(x, 10.0)}; }
  static TensorList backward(FunctionCtx&, const TensorList& grads) {
    Tensor total = zeros(grads[0].defined() ? grads[0].shape() : grads[1].shape(), TensorOptions{DType::f32});
    if (grads[0].defined()) total = add(total, grads[0]);
    if (grads[1].defined()) total = add(total, mul(grads[1], 10.0));
    return {total};
  }
};

TEST(Autograd, MultiOutputFunctionWithAnUnusedOutput) {
  Tensor x = leaf({1, 2}, {2});
  TensorList parts = SplitHalves::apply(x);
  ASSERT_EQ(parts.size(), 2u);
  sum(parts[1]).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{10, 10}));
}

TEST(Autograd, InPlaceOnALeafThatRequiresGradIsAnError) {
  Tensor x = leaf({1}, {1});
  std::string message = message_of([&] { x.add_(ones({1})); });
  EXPECT_NE(message.find("NoGradGuard"), std::string::npos) << message;
  NoGradGuard no_grad;
  x.add_(ones({1}), 0.5);  // an optimizer step
  EXPECT_EQ(x.item(), 1.5);
}

TEST(Autograd, IntegerTensorsCannotRequireGrad) {
  std::string message = message_of([] { zeros({2}, TensorOptions{DType::i64}).set_requires_grad(); });
  EXPECT_NE(message.find("i64"), std::string::npos) << message;
}

TEST(Autograd, GradcheckCatchesAWrongBackward) {
  struct WrongSquare : Function<WrongSquare> {
    static Tensor forward(FunctionCtx& ctx, const Tensor& x) {
      ctx.save_for_backward({x});
      return mul(x, x);
    }
    static TensorList backward(FunctionCtx& ctx, const TensorList& g) { return {mul(g[0], ctx.saved()[0])}; }
  };
  Tensor x = randn({4}, TensorOptions{DType::f64}.with_requires_grad());
  GradcheckResult result = gradcheck([](const TensorList& in) { return WrongSquare::apply(in[0]); }, {x});
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.message.find("finite differences"), std::string::npos);
}

// |NaN - x| <= tol is false and |NaN - x| > tol is false too: a gradcheck that only asks the second
// question passes every element of a function that returns NaN. Both sides must be finite.
TEST(Autograd, GradcheckFailsOnNonFiniteGradients) {
  Tensor x = randn({3}, TensorOptions{DType::f64}.with_requires_grad());
  // The finite differences see NaN: the function is NaN away from the point it is checked at.
  const double x0 = x.to_vector()[0];
  GradcheckResult numerical_nan = gradcheck(
      [&](const TensorList& in) {
        const bool moved = in[0].to_vector()[0] != x0;
        return moved ? full({3}, std::nan(""), TensorOptions{DType::f64}) : mul(in[0], 1.0);
      },
      {x});
  EXPECT_FALSE(numerical_nan.ok);
  EXPECT_NE(numerical_nan.message.find("not finite"), std::string::npos) << numerical_nan.message;
  // backward gives NaN, the finite differences 1.
  struct NaNBackward : Function<NaNBackward> {
    static Tensor forward(FunctionCtx&, const Tensor& x) { return mul(x, 1.0); }
    static TensorList backward(FunctionCtx&, const TensorList& g) { return {mul(g[0], std::nan(""))}; }
  };
  GradcheckResult analytic_nan = gradcheck([](const TensorList& in) { return NaNBackward::apply(in[0]); }, {x});
  EXPECT_FALSE(analytic_nan.ok);
  EXPECT_NE(analytic_nan.message.find("not finite"), std::string::npos) << analytic_nan.message;
}

}  // namespace
}  // namespace sl

// ---- DeferredGrads (autograd/deferred_grad.h): B now, W later, the fused backward's bits. ----
namespace sl {
namespace {
namespace deferred {

// A GPT: the split touches Linear (with and without bias), LayerNorm, Embedding and the tied head.
struct Model {
  nn::GPT gpt{nn::GPTConfig{.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16}, 3};
  Tensor idx = Tensor::empty({2, 8}, TensorOptions(DType::i64)), targets = Tensor::empty({2, 8}, TensorOptions(DType::i64));
  Model() {
    for (int64_t i = 0; i < 16; ++i) {
      idx.data<int64_t>()[i] = (i * 7 + 3) % 32;
      targets.data<int64_t>()[i] = (i * 5 + 1) % 32;
    }
  }
  // A micro-batch's loss through blocks that take an input leaf (the pipeline stage's received x).
  Tensor loss(const Tensor& x) { return cross_entropy(gpt.head(gpt.blocks(x, 0, 2)), targets); }
  Tensor input(int micro) {
    NoGradGuard no_grad;
    Tensor x = add(gpt.embed(idx), static_cast<double>(micro) * 0.25);
    x.set_requires_grad(true);
    return x;
  }
  std::vector<std::vector<float>> grads() {
    std::vector<std::vector<float>> out;
    for (const Tensor& p : gpt.parameters()) out.push_back(p.grad().defined() ? p.grad().values<float>() : std::vector<float>{});
    return out;
  }
};

TEST(DeferredGrads, OneLinearInputGradientNowWeightGradientLater) {
  Tensor x = randn({4, 3}), w = randn({5, 3}), b = randn({5}), dy = randn({4, 5});
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  linear(x, w, b).backward(dy);  // fused
  const auto dx = x.grad().values<float>(), dw = w.grad().values<float>(), db = b.grad().values<float>();
  for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
  DeferredGrads later;
  {
    DeferGradsGuard defer(later, {w, b});
    linear(x, w, b).backward(dy);  // B
  }
  EXPECT_EQ(x.grad().values<float>(), dx);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(later.size(), 1u);
  later.run();  // W
  EXPECT_TRUE(later.empty());
  EXPECT_EQ(w.grad().values<float>(), dw);
  EXPECT_EQ(b.grad().values<float>(), db);
}

// Two micro-batches, B1 B2 W1 W2 (zero-bubble's order), against the fused b1 b2: bitwise.
TEST(DeferredGrads, ThenRunEqualsTheFusedBackwardBitwiseOnAGPT) {
  Model fused, split;
  std::vector<std::vector<float>> fused_dx, split_dx;
  for (int micro = 0; micro < 2; ++micro) {
    Tensor x = fused.input(micro);
    fused.loss(x).backward();
    fused_dx.push_back(x.grad().values<float>());
  }
  std::vector<DeferredGrads> w(2);
  for (int micro = 0; micro < 2; ++micro) {
    Tensor x = split.input(micro);
    {
      DeferGradsGuard defer(w[micro], split.gpt.parameters());
      split.loss(x).backward();
    }
    split_dx.push_back(x.grad().values<float>());
    for (const Tensor& p : split.gpt.parameters()) EXPECT_FALSE(p.grad().defined()) << "a weight gradient in B";
  }
  EXPECT_EQ(split_dx, fused_dx) << "B's input gradients";
  for (DeferredGrads& d : w) {
    EXPECT_FALSE(d.empty());
    d.run();
  }
  EXPECT_EQ(split.grads(), fused.grads()) << "W's weight gradients";
}

TEST(DeferredGrads, WithoutAGuardBackwardIsUnchangedAndTheGuardIsPerThread) {
  Model plain, other_thread_guarded;
  Tensor x = plain.input(0);
  plain.loss(x).backward();
  DeferredGrads elsewhere;
  Tensor y = other_thread_guarded.input(0);
  DeferGradsGuard defer_here(elsewhere, plain.gpt.parameters());  // this thread: not the model below
  std::thread([&] { other_thread_guarded.loss(y).backward(); }).join();  // no guard on that thread
  EXPECT_TRUE(elsewhere.empty());
  EXPECT_EQ(other_thread_guarded.grads(), plain.grads());
  EXPECT_EQ(y.grad().values<float>(), x.grad().values<float>());
  EXPECT_NE(DeferGradsGuard::current(), nullptr);  // still open here, where nothing ran backward
}

// DDP and ZeRO hang on the weights' hooks: with the split they fire in W, once, with the sum.
TEST(DeferredGrads, HooksFireInWOnceWithTheSummedGradient) {
  Tensor w = from_vector({1, 2}, {2}, TensorOptions{}.with_requires_grad());
  Tensor x = from_vector({1, 2}, {2}, TensorOptions{}.with_requires_grad());
  int calls = 0;
  std::vector<double> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& param) {
    calls++;
    seen = param.grad().to_vector();
  });
  DeferredGrads later;
  {
    DeferGradsGuard defer(later, {w});
    sum(add(mul(w, x), mul(w, 3.0))).backward();
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{1, 2}));
  later.run();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{4, 5}));
}

// W reads what B kept: a second run (or a backward through the freed nodes) is refused, not garbage.
TEST(DeferredGrads, WFreesWhatItKept) {
  Tensor x = randn({4, 3}), w = randn({5, 3});
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor y = linear(x, w);
  DeferredGrads later;
  {
    DeferGradsGuard defer(later, {w});
    y.backward(ones({4, 5}));
  }
  later.run();
  EXPECT_THROW(y.backward(ones({4, 5})), Error);
}

}  // namespace deferred
}  // namespace
}  // namespace sl
