// exercises/04_loss_scaling/grader.cpp — grades loss scaling over accumulated micro-batches (student.cpp).
//
// scale_loss and unscale_gradients against nn::GradScaler (the same gradients unscaled by both). The
// step against the library's own order of calls, the one parallel/train/serial_reference.cpp runs:
//   zero_grad; backward(loss_i · S) per micro-batch; GradScaler::unscale once; found: skip, else
//   nn::clip_grad_norm and AdamW::step; GradScaler::update.
// A toy model (w [4], no weight decay; m [2, 3], decayed) with micro-batch losses (Σ w²·x + Σ m·y)/M,
// an inf or NaN planted in a chosen micro-batch's x. To name a mistake the grader also runs the
// library's calls in the usual wrong orders (unscale per micro-batch, clip before unscale, an
// overflowed step that still steps) and says which one the student's weights follow.
// With -DSL_SOLUTION the library's calls stand in for the student's functions.
#include "exercises/grader.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::expect;
using MicroBatchLosses = std::vector<std::function<Tensor()>>;

namespace exercise04 {
double predicted_scale_after_six_steps();
Tensor scale_loss(double scale, const Tensor& loss);
bool unscale_gradients(double scale, const std::vector<Tensor>& grads);
std::optional<double> scaled_accumulation_step(nn::GradScaler& scaler, nn::Optimizer& optimizer,
                                               const MicroBatchLosses& micro_batch_losses, double max_norm);
}  // namespace exercise04

// The library's calls in the right order, and in three wrong ones (for the messages).
enum class Order { right, unscale_each, clip_before_unscale, step_on_overflow };
static std::optional<double> library_step(nn::GradScaler& scaler, nn::Optimizer& optimizer,
                                          const MicroBatchLosses& losses, double max_norm, Order order) {
  optimizer.zero_grad();
  auto grads = [&] {
    std::vector<Tensor> out;
    for (const Tensor& p : optimizer.params()) out.push_back(p.grad());
    return out;
  };
  bool found = false;
  for (const auto& loss : losses) {
    mul(loss(), scaler.scale()).backward();
    if (order == Order::unscale_each) found = scaler.unscale(grads()) || found;
  }
  double norm = 0;
  if (order == Order::clip_before_unscale) norm = nn::clip_grad_norm(optimizer.params(), max_norm);
  if (order != Order::unscale_each) found = scaler.unscale(grads());
  if (found && order != Order::step_on_overflow) {
    scaler.update(true);
    return std::nullopt;
  }
  if (found) {  // zeroes the gradients and steps anyway
    NoGradGuard no_grad;
    for (const Tensor& p : optimizer.params()) p.set_grad(zeros_like(p));
  } else if (order != Order::clip_before_unscale) {
    norm = nn::clip_grad_norm(optimizer.params(), max_norm);
  }
  optimizer.step();
  scaler.update(found);
  return found ? std::nullopt : std::optional<double>(norm);
}

#ifdef SL_SOLUTION
namespace solution {
Tensor scale_loss(double scale, const Tensor& loss) { return mul(loss, scale); }
bool unscale_gradients(double scale, const std::vector<Tensor>& grads) {
  return nn::GradScaler({.init_scale = scale}).unscale(grads);
}
std::optional<double> scaled_accumulation_step(nn::GradScaler& scaler, nn::Optimizer& optimizer,
                                               const MicroBatchLosses& losses, double max_norm) {
  return library_step(scaler, optimizer, losses, max_norm, Order::right);
}
// An overflow in any micro-batch skips the whole step and halves S once: step 1 (its micro-batch 3)
// and step 3 (micro-batches 1 and 2) do. 65536 → 32768 (step 1); step 2 clean (count 1); step 3
// → 16384 (count 0); steps 4, 5 clean: count 2 = growth_interval → 32768 (count 0); step 6: count 1.
double predicted_scale_after_six_steps() { return 65536.0 * 0.5 * 0.5 * 2; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise04;
#endif

static std::string num(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9g", v);
  return buffer;
}

static bool same(const std::vector<double>& a, const std::vector<double>& b, double rtol = 0) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= rtol * std::abs(b[i]) || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// ---- scale_loss and unscale_gradients ----------------------------------------------------------

static std::vector<Tensor> gradients(double scale, DType dtype = DType::f32) {
  return {from_vector({1.5 * scale, -0.25 * scale, 3.0 * scale, 0.125 * scale}, Shape({4}), TensorOptions(dtype)),
          from_vector({2, -4, 6, 0.5, 1, -1}, Shape({2, 3}), TensorOptions(dtype)).mul_(scale)};
}

static std::string diagnose_unscale(double scale, const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return "the gradient changed its size";
  if (same(got, {1.5 * scale, -0.25 * scale, 3.0 * scale, 0.125 * scale}))
    return "the gradients still hold S·g after unscale_gradients: divide them in place (g.mul_(1 / S)), not a copy";
  if (std::abs(got[0] - 1.5 * scale * scale) < 1e-3 * scale * scale)
    return "the gradients were multiplied by S: unscaling divides (mul_ by 1 / S)";
  return "grads[0] holds " + num(got[0]) + ", " + num(got[1]) + ", ... where nn::GradScaler leaves " + num(want[0]) +
         ", " + num(want[1]) + ", ...";
}

static void check_scale_loss() {
  Tensor w = from_vector({1, 2, 3}, Shape({3}));
  w.set_requires_grad(true);
  const Tensor loss = mul(sum(mul(w, from_vector({0.5, -2, 0.25}, Shape({3})))), 0.5);
  const Tensor scaled = impl::scale_loss(4096.0, loss);
  const double value = scaled.to_vector().at(0), want = loss.to_vector()[0] * 4096.0;
  expect(value != loss.to_vector()[0] / 4096.0, "scale_loss divided the loss by S: multiply it");
  expect(value == want, "scale_loss returned " + num(value) + ", loss · S is " + num(want));
  expect(scaled.requires_grad(), "the scaled loss is off the tape (no gradient can flow through it): build it "
                                 "with sl::mul(loss, S), not from its value");
  scaled.backward();
  expect(same(w.grad().to_vector(), {0.25 * 4096, -1.0 * 4096, 0.125 * 4096}),
         "backward of the scaled loss should give S · g = 1024, -4096, 512; got " + num(w.grad().to_vector()[0]) +
             ", ...");
}

static void check_unscale(double scale, DType dtype) {
  const std::vector<Tensor> mine = gradients(scale, dtype), reference = gradients(scale, dtype);
  const bool found = impl::unscale_gradients(scale, mine);
  nn::GradScaler({.init_scale = scale}).unscale(reference);
  for (size_t i = 0; i < mine.size(); ++i) {
    expect(mine[i].dtype() == dtype, "the gradient's dtype changed: unscale in place, in its own dtype");
    expect(same(mine[i].to_vector(), reference[i].to_vector()),
           diagnose_unscale(scale, mine[i].to_vector(), reference[i].to_vector()));
  }
  expect(!found, "unscale_gradients reported an inf or NaN in finite gradients");
}

static void check_unscale_planted() {
  const double inf = std::numeric_limits<double>::infinity(), planted[] = {inf, -inf, std::nan("")};
  const char* names[] = {"inf", "-inf", "NaN"};
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> grads = gradients(1024.0);
    std::vector<double> values = grads[1].to_vector();
    values[4] = planted[k];
    grads[1] = from_vector(values, Shape({2, 3}));
    grads.insert(grads.begin() + 1, Tensor());  // a parameter backward never reached
    expect(impl::unscale_gradients(1024.0, grads),
           std::string("a ") + names[k] + " planted in the last gradient was not found" +
               (k == 2 ? ": NaN compares unequal to everything, itself included; use std::isfinite" : "") +
               " (look at every element of every gradient)");
  }
  expect(!impl::unscale_gradients(1024.0, {Tensor(), gradients(1024.0)[0]}),
         "an undefined gradient next to a clean one was reported as an overflow: skip undefined tensors");
}

static void check_fp16_flush() {
  // The gradient of Σ w·x is x: tiny values, stored in fp16 (smallest subnormal 6e-8) as fp16 training does.
  std::vector<double> x;
  for (int i = 0; i < 8; ++i) x.push_back(1e-8 * (1 + 0.1 * i));
  auto fp16_gradient = [&](double scale) {
    Tensor w = zeros({8});
    w.set_requires_grad(true);
    impl::scale_loss(scale, sum(mul(w, from_vector(x, Shape({8}))))).backward();
    Tensor g = w.grad().to(DType::f16).to(DType::f32);  // through fp16, unscaled in f32
    expect(!impl::unscale_gradients(scale, {g}), "no overflow here, yet unscale_gradients reported one");
    return g.to_vector();
  };
  const std::vector<double> plain = fp16_gradient(1.0), scaled = fp16_gradient(65536.0);
  for (size_t i = 0; i < x.size(); ++i) {
    expect(plain[i] == 0, "at scale 1, fp16(" + num(x[i]) + ") should flush to 0 but reads " + num(plain[i]));
    expect(std::abs(scaled[i] - x[i]) < 1e-3 * x[i],
           "scaled by 2^16, the gradient " + num(x[i]) + " should survive fp16 within 0.1% but reads " + num(scaled[i]));
  }
}

// ---- the accumulated step ----------------------------------------------------------------------

// Steps of M micro-batches; plants[t][i]: the value planted in step t's micro-batch i (0: none).
struct Run {
  double scale = 1024.0;
  int64_t growth_interval = 2000;
  std::vector<std::vector<double>> plants;
};
struct Trace {
  std::vector<std::vector<double>> weights;  // after each step: w then m
  std::vector<double> norms, scales;         // the returned norm (NaN: skipped), S after each step
};
using Stepper = std::function<std::optional<double>(nn::GradScaler&, nn::Optimizer&, const MicroBatchLosses&, double)>;

static Trace trace_of(const Run& run, const Stepper& step) {
  Tensor w = from_vector({0.5, -1.0, 2.0, 0.25}, Shape({4})), m = from_vector({1, -2, 0.5, 3, -1, 2}, Shape({2, 3}));
  w.set_requires_grad(true);
  m.set_requires_grad(true);
  nn::AdamW optimizer({w, m}, {.lr = 0.1, .weight_decay = 0.1});
  nn::GradScaler scaler({.init_scale = run.scale, .growth_interval = run.growth_interval});
  Trace trace;
  for (size_t t = 0; t < run.plants.size(); ++t) {
    MicroBatchLosses losses;
    const double M = static_cast<double>(run.plants[t].size());
    for (size_t i = 0; i < run.plants[t].size(); ++i) {
      std::vector<double> x = {1.0 + t, -0.5 * (i + 1), 0.25 * t + i, 2.0};
      if (run.plants[t][i] != 0) x[i % 4] = run.plants[t][i];
      const std::vector<double> y = {0.5 * i, -1.0, 2.0, 0.25 * t, 1.0, -0.5};
      losses.push_back([w, m, x, y, M] {
        return mul(add(sum(mul(mul(w, w), from_vector(x, Shape({4})))), sum(mul(m, from_vector(y, Shape({2, 3}))))),
                   1.0 / M);
      });
    }
    const std::optional<double> norm = step(scaler, optimizer, losses, 0.5);
    std::vector<double> now = w.to_vector(), mv = m.to_vector();
    now.insert(now.end(), mv.begin(), mv.end());
    trace.weights.push_back(now);
    trace.norms.push_back(norm ? *norm : std::nan(""));
    trace.scales.push_back(scaler.scale());
  }
  return trace;
}

static Stepper library(Order order) {
  return [order](nn::GradScaler& s, nn::Optimizer& o, const MicroBatchLosses& l, double max_norm) {
    return library_step(s, o, l, max_norm, order);
  };
}

// Runs the student's step over `run` beside the library's; fails at the first step they differ,
// naming the wrong order of calls the student's weights follow, if any.
static void expect_library_trace(const Run& run, const std::string& what) {
  const Trace mine = trace_of(run, impl::scaled_accumulation_step), want = trace_of(run, library(Order::right));
  for (size_t t = 0; t < run.plants.size(); ++t) {
    bool planted = false;
    for (double p : run.plants[t]) planted = planted || p != 0;
    const std::string at = what + ", step " + std::to_string(t + 1) + (planted ? " (an overflow)" : " (clean)") + ": ";
    const double got = mine.norms[t], norm = want.norms[t];
    const bool weights_ok = same(mine.weights[t], want.weights[t], 1e-9), norm_ok = same({got}, {norm}, 1e-9);
    if (!weights_ok || !norm_ok) {  // a wrong order of the library's calls that gives these weights and norm?
      const std::pair<Order, const char*> orders[] = {
          {Order::unscale_each, "your weights follow gradients unscaled after EVERY micro-batch: the earlier "
                                "micro-batches' part was divided by S again and again; unscale ONCE, after the "
                                "last micro-batch's backward (.grad then holds S · the batch's gradient)"},
          {Order::clip_before_unscale, "your weights follow gradients clipped while still SCALED: clip saw a norm "
                                       "S x too large and cut S x too much; unscale first, then clip_grad_norm"},
          {Order::step_on_overflow, "the weights moved in a step that overflowed: skip optimizer.step() entirely "
                                    "(AdamW moves the weights with zero gradients too: its momentum and weight "
                                    "decay), and leave the gradients alone"}};
      for (const auto& [order, message] : orders) {
        const Trace wrong = trace_of(run, library(order));
        if (same(mine.weights[t], wrong.weights[t], 1e-9) && same({got}, {wrong.norms[t]}, 1e-9))
          expect(false, at + message);
      }
    }
    expect(weights_ok, at + "your weights differ from the library's (zero_grad; backward(loss_i · S) per "
                            "micro-batch; unscale once; an inf or NaN skips the step; else clip, step; update)");
    if (std::isnan(norm))
      expect(std::isnan(got), at + "the step overflowed, so return std::nullopt (no norm: nothing was clipped)");
    else if (!(std::abs(got - norm) <= 1e-9 * norm))
      expect(false, at + "you returned the norm " + num(got) + ", the unscaled gradient's is " + num(norm) +
                        (std::abs(got - run.scale * norm) < 1e-6 * run.scale * norm
                             ? ": yours is S x larger, the SCALED gradient's; clip and measure after unscaling"
                             : std::isnan(got) ? ": a clean step returns the norm clip_grad_norm measured" : ""));
    expect(mine.scales[t] == want.scales[t],
           at + "the scale is " + num(mine.scales[t]) + " after the step, nn::GradScaler's " + num(want.scales[t]) +
               ": call scaler.update(found_inf) once per step, after the last micro-batch (not per micro-batch)");
  }
}

static double measured_scale_after_six_steps() {
  const double inf = std::numeric_limits<double>::infinity();
  const Run run{.scale = 65536.0, .growth_interval = 2,
                .plants = {{0, 0, inf}, {0, 0, 0}, {inf, inf, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}};
  return trace_of(run, library(Order::right)).scales.back();
}

int main() {
  exercises::Grader grader("04_loss_scaling");
  grader.predict("S after 6 steps of 3 micro-batches from 65536 at growth_interval 2, overflows in micro-batch 3 "
                 "of step 1 and micro-batches 1 and 2 of step 3",
                 impl::predicted_scale_after_six_steps, measured_scale_after_six_steps, 0, "(scale)");
  grader.check("scale_loss: loss · S, on the tape: backward hands S · g to the weights", check_scale_loss);
  grader.check("unscale_gradients: clean f32 gradients divided by S in place, exactly, and no overflow reported",
               [] { check_unscale(65536.0, DType::f32); });
  grader.check("unscale_gradients: a planted inf, -inf or NaN anywhere is found; undefined gradients are skipped",
               check_unscale_planted);
  grader.check("unscale_gradients: f16 gradients unscaled in their own dtype, equal to nn::GradScaler's",
               [] { check_unscale(512.0, DType::f16); });
  grader.check("fp16: 1e-8 gradients flush unscaled and survive scaled by 2^16", check_fp16_flush);
  const double inf = std::numeric_limits<double>::infinity();
  grader.check("the step: 4 clean steps of 3 micro-batches at S = 1024, max_norm 0.5: weights, norms and S equal "
               "the library's (unscale once, clip after)",
               [] { expect_library_trace({.plants = std::vector<std::vector<double>>(4, {0, 0, 0})}, "clean run"); });
  grader.check("the step: an inf in micro-batch 2 of step 2 skips the whole step (weights and AdamW unchanged), "
               "halves S, and the steps after equal the library's",
               [&] { expect_library_trace({.plants = {{0, 0, 0}, {0, inf, 0}, {0, 0, 0}, {0, 0, 0}}}, "inf in step 2"); });
  grader.check("the step: a NaN in micro-batch 1 and a -inf in micro-batch 4 of another step, growth_interval 1: "
               "every step's weights and S equal the library's",
               [&] {
                 expect_library_trace({.growth_interval = 1,
                                       .plants = {{0, 0, 0, 0}, {std::nan(""), 0, 0, 0}, {0, 0, 0, 0},
                                                  {0, 0, 0, -inf}, {0, 0, 0, 0}, {0, 0, 0, 0}}},
                                      "NaN in step 2, -inf in step 4");
               });
  return grader.finish();
}
