// Optimizers: SGD, AdamW and clipping against values worked out here, step by step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nn/optim.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

Tensor param(std::vector<double> values, Shape shape) {
  return from_vector(values, shape, TensorOptions().with_requires_grad());
}

void set_grad(const Tensor& p, std::vector<double> values) { p.set_grad(from_vector(values, p.shape())); }

// Mixed precision: a bf16 parameter's update runs on its f32 master copy, bitwise as an f32 AdamW on
// an f32 parameter holding the same values with the same (bf16-representable) gradients; the bf16
// parameter is the master rounded, and the moments and the master are f32 (12 bytes per element).
TEST(Optim, AdamWWithMasterWeightsUpdatesTheF32CopyAndRoundsIntoTheParameter) {
  const std::vector<double> start = {0.5, -0.375, 0.75, 0.125};  // exact in bf16
  Tensor low = from_vector(start, {2, 2}, TensorOptions(DType::bf16).with_requires_grad());
  Tensor full = param(start, {2, 2});
  AdamWOptions options{0.01, 0.9, 0.95, 1e-8, 0.1};
  options.master_weights = true;
  AdamW mixed({low}, options), reference({full}, options);
  ASSERT_EQ(mixed.state(0).buffers.at("master").dtype(), DType::f32);
  for (const std::vector<double>& g : {std::vector<double>{0.125, -0.25, 0.5, 0.0625}, {-0.5, 1.0, 0.0, 0.25}}) {
    low.set_grad(from_vector(g, {2, 2}, DType::bf16));
    set_grad(full, g);
    mixed.step();
    reference.step();
    EXPECT_EQ(mixed.state(0).buffers.at("master").to_vector(), full.to_vector());
    EXPECT_EQ(low.to_vector(), full.to(DType::bf16).to_vector());  // rounded from the master, once
  }
  for (const char* name : {"exp_avg", "exp_avg_sq", "master"}) EXPECT_EQ(mixed.state(0).buffers.at(name).dtype(), DType::f32);
}

TEST(Optim, AdamWRefusesA16BitParameterWithoutAMasterCopy) {
  Tensor low = from_vector({0.5}, {1}, TensorOptions(DType::bf16).with_requires_grad());
  AdamW adam({low});
  low.set_grad(from_vector({0.5}, {1}, DType::bf16));
  expect_error([&] { adam.step(); }, "AdamW keeps f32 parameters (for mixed precision, set AdamWOptions::master_weights");
}

TEST(Optim, SGDWithMomentumMatchesTheRecurrence) {
  Tensor w = param({1.0, -2.0}, {2});
  SGD sgd({w}, SGDOptions{0.1, 0.9, 0.0});
  // step 1: b = g = [1, 1];            w = [0.9, -2.1]
  // step 2: b = 0.9 [1, 1] + [2, 2];   w = [0.9 - 0.29, -2.1 - 0.29]
  set_grad(w, {1, 1});
  sgd.step();
  set_grad(w, {2, 2});
  sgd.step();
  EXPECT_NEAR(w.to_vector()[0], 0.61, 1e-6);
  EXPECT_NEAR(w.to_vector()[1], -2.39, 1e-6);
  EXPECT_NEAR(sgd.state(0).buffers.at("momentum_buffer").to_vector()[0], 2.9, 1e-6);
}

TEST(Optim, SGDWeightDecayIsL2) {
  Tensor w = param({2.0}, {1});
  SGD sgd({w}, SGDOptions{0.5, 0.0, 0.1});
  set_grad(w, {0.0});
  sgd.step();  // g = 0 + 0.1 * 2 = 0.2; w = 2 - 0.5 * 0.2
  EXPECT_NEAR(w.item(), 1.9, 1e-6);
}

TEST(Optim, AdamWMatchesAReferenceLoopOverThreeSteps) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Tensor matrix = param({0.5, -0.3, 0.8, 0.1}, {2, 2});  // rank 2: decayed
  Tensor bias = param({0.2, -0.4}, {2});                 // rank 1: not decayed
  AdamW adam({matrix, bias}, AdamWOptions{lr, b1, b2, eps, wd});
  std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3, 0.05}, {-0.1, 0.4, 0.0, 0.2}, {0.3, 0.1, -0.2, 0.1}};

  std::vector<double> w = {0.5, -0.3, 0.8, 0.1}, m(4, 0.0), v(4, 0.0);
  std::vector<double> bw = {0.2, -0.4}, bm(2, 0.0), bv(2, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double>& g = grads[t - 1];
    set_grad(matrix, g);
    set_grad(bias, {g[0], g[1]});
    adam.step();
    double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (int j = 0; j < 4; ++j) {
      m[j] = b1 * m[j] + (1 - b1) * g[j];
      v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j];
      w[j] = w[j] * (1 - lr * wd) - lr / bc1 * m[j] / (std::sqrt(v[j]) / std::sqrt(bc2) + eps);
    }
    for (int j = 0; j < 2; ++j) {
      bm[j] = b1 * bm[j] + (1 - b1) * g[j];
      bv[j] = b2 * bv[j] + (1 - b2) * g[j] * g[j];
      bw[j] = bw[j] - lr / bc1 * bm[j] / (std::sqrt(bv[j]) / std::sqrt(bc2) + eps);
    }
  }
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(matrix.to_vector()[j], w[j], 1e-6) << j;
  for (int j = 0; j < 2; ++j) EXPECT_NEAR(bias.to_vector()[j], bw[j], 1e-6) << j;
  EXPECT_EQ(adam.state(0).step, 3);
}

TEST(Optim, AdamWDefaultsAreThoseOfGPTTraining) {
  AdamWOptions defaults;
  EXPECT_EQ(defaults.beta1, 0.9);
  EXPECT_EQ(defaults.beta2, 0.95);
  EXPECT_EQ(defaults.eps, 1e-8);
  EXPECT_EQ(defaults.weight_decay, 0.1);
}

TEST(Optim, ParametersWithoutGradientsAreSkipped) {
  Tensor a = param({1.0}, {1}), b = param({1.0}, {1});
  AdamW adam({a, b});
  set_grad(a, {1.0});
  adam.step();
  EXPECT_NE(a.item(), 1.0);
  EXPECT_EQ(b.item(), 1.0);
  EXPECT_EQ(adam.state(1).step, 0);
}

TEST(Optim, StateIsChargedToTheOptimizerCategoryAndRoundTrips) {
  Device dev = Device::cpu(121);
  DeviceGuard on(dev);
  Tensor w = param(std::vector<double>(100, 1.0), {10, 10});
  AdamW adam({w});
  set_grad(w, std::vector<double>(100, 0.5));
  adam.step();
  EXPECT_EQ(MemoryLedger::instance().current(dev, MemoryCategory::optimizer), 8 * 100);  // m and v, f32

  StateDict saved = adam.state_dict();
  EXPECT_EQ(saved.size(), 3u);  // state.0.step, state.0.exp_avg, state.0.exp_avg_sq
  Tensor w2 = param(std::vector<double>(100, 1.0), {10, 10});
  AdamW resumed({w2});
  resumed.load_state_dict(saved);
  EXPECT_EQ(resumed.state(0).step, 1);
  EXPECT_EQ(resumed.state(0).buffers.at("exp_avg").to_vector(), adam.state(0).buffers.at("exp_avg").to_vector());
  EXPECT_THROW(resumed.load_state_dict({{"state.7.exp_avg", zeros({10, 10})}}), Error);
}

// A key whose index is not a number is an sl::Error naming the key (not std::stoul's exception).
TEST(Optim, LoadStateDictRejectsABadParameterIndexNamingTheKey) {
  Tensor w = param(std::vector<double>(4, 1.0), {2, 2});
  AdamW adam({w});
  for (const std::string key : {"state.x.exp_avg", "state..exp_avg", "state.-1.exp_avg", "state.0x.exp_avg",
                                "state.99999999999999999999999.exp_avg"}) {
    SCOPED_TRACE(key);
    try {
      adam.load_state_dict({{key, zeros({2, 2})}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad key '" + key + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(adam.state(0).step, 0);  // nothing was loaded
}

TEST(Optim, ClipGradNormFollowsPyTorchsRule) {
  Tensor a = param({0, 0}, {2}), b = param({0}, {1});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});  // global norm 5
  double norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-9);
  double scale = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(a.grad().to_vector()[0], 3.0 * scale, 1e-6);
  EXPECT_NEAR(b.grad().item(), 4.0 * scale, 1e-6);
  // Below the threshold nothing changes.
  set_grad(b, {0.5});
  a.set_grad(Tensor());
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 0.5, 1e-9);
  EXPECT_EQ(b.grad().item(), 0.5);
  EXPECT_THROW(clip_grad_norm({a, b}, 0.0), Error);
}

}  // namespace
}  // namespace sl::nn
