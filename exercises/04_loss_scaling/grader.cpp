// exercises/04_loss_scaling/grader.cpp — grades dynamic loss scaling by hand (student.cpp).
//
// Reference: nn::GradScaler (nn/grad_scaler.h), step by step: the same gradients unscaled by both,
// the same overflow flags fed to both, the scale and the counters compared after every step.
// With -DSL_SOLUTION an adapter over nn::GradScaler stands in for the student's functions.
#include "exercises/grader.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/04_loss_scaling/loss_scale_state.h"
#include "nn/grad_scaler.h"
#include "tensor/ops.h"

using namespace sl;
using exercise04::LossScaleState;
using exercises::expect;

namespace exercise04 {
double predicted_scale_after_nine_steps();
Tensor scale_loss(const LossScaleState& state, const Tensor& loss);
bool unscale_gradients(const LossScaleState& state, const std::vector<Tensor>& grads);
void update_scale(LossScaleState& state, bool found_inf);
}  // namespace exercise04

#ifdef SL_SOLUTION
// nn::GradScaler holding a state's scale, interval and counters.
static nn::GradScaler library_scaler(const LossScaleState& state) {
  nn::GradScaler scaler({.init_scale = state.scale, .growth_interval = state.growth_interval});
  scaler.restore(state.scale, state.clean_steps, state.skipped_steps);
  return scaler;
}

namespace solution {
Tensor scale_loss(const LossScaleState& state, const Tensor& loss) { return mul(loss, library_scaler(state).scale()); }
bool unscale_gradients(const LossScaleState& state, const std::vector<Tensor>& grads) {
  return library_scaler(state).unscale(grads);
}
void update_scale(LossScaleState& state, bool found_inf) {
  nn::GradScaler scaler = library_scaler(state);
  scaler.update(found_inf);
  state.scale = scaler.scale();
  state.clean_steps = scaler.clean_steps();
  state.skipped_steps = scaler.skipped_steps();
}
// Two overflows halve it twice (16384); clean steps 3-5 double it (32768, count restarts), 6-8 double it
// again (65536); step 9 is one clean step of the next three: back where it started.
double predicted_scale_after_nine_steps() { return 65536.0 * 0.5 * 0.5 * 2 * 2; }
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

static bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// Gradients [4] and [2, 3] of known values; `plant` (if finite is false) goes into grads[1] at index 4.
static std::vector<Tensor> gradients(double scale, DType dtype = DType::f32) {
  return {from_vector({1.5 * scale, -0.25 * scale, 3.0 * scale, 0.125 * scale}, Shape({4}), TensorOptions(dtype)),
          from_vector({2, -4, 6, 0.5, 1, -1}, Shape({2, 3}), TensorOptions(dtype)).mul_(scale)};
}

// Says what a wrong unscale looks like, from the student's first gradient [1.5 S, ...] after it.
static std::string diagnose_unscale(double scale, const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return "the gradient changed its size";
  if (same(got, std::vector<double>({1.5 * scale, -0.25 * scale, 3.0 * scale, 0.125 * scale})))
    return "the gradients still hold S·g after unscale_gradients: divide them in place (g.mul_(1 / S)), not a copy";
  if (std::abs(got[0] - 1.5 * scale * scale) < 1e-3 * scale * scale)
    return "the gradients were multiplied by S: unscaling divides (mul_ by 1 / S)";
  return "grads[0] holds " + num(got[0]) + ", " + num(got[1]) + ", ... where nn::GradScaler leaves " + num(want[0]) +
         ", " + num(want[1]) + ", ...";
}

// Runs update_scale and nn::GradScaler over the same overflow flags; fails at the first step they differ.
static void expect_same_history(const std::vector<bool>& overflows, int64_t interval, const std::string& what) {
  LossScaleState state{.scale = 65536.0, .growth_interval = interval};
  nn::GradScaler library({.init_scale = 65536.0, .growth_interval = interval});
  for (size_t step = 0; step < overflows.size(); ++step) {
    const double before = state.scale;
    impl::update_scale(state, overflows[step]);
    library.update(overflows[step]);
    const std::string at =
        what + ", step " + std::to_string(step) + (overflows[step] ? " (an overflow)" : " (clean)") + ": ";
    if (state.scale != library.scale()) {
      std::string why = "your scale is " + num(state.scale) + ", nn::GradScaler's " + num(library.scale());
      if (overflows[step] && state.scale == before) why += ": an overflow halves the scale";
      if (!overflows[step] && state.scale == 2 * library.scale())
        why += ": you grew a step early; grow when the clean count reaches growth_interval (then reset it to 0)";
      if (!overflows[step] && 2 * state.scale == library.scale())
        why += ": you grew a step late, or an overflow did not restart the clean count at 0";
      if (!overflows[step] && state.scale < before) why += ": a clean step never shrinks the scale";
      expect(false, at + why);
    }
    expect(state.skipped_steps == library.skipped_steps(),
           at + "skipped_steps is " + std::to_string(state.skipped_steps) + ", nn::GradScaler counted " +
               std::to_string(library.skipped_steps()) + ": each overflow skips one step");
    expect(state.clean_steps == library.clean_steps(),
           at + "clean_steps is " + std::to_string(state.clean_steps) + ", nn::GradScaler's " +
               std::to_string(library.clean_steps()) +
               ": count clean steps since the scale last changed (0 after a "
               "growth and after an overflow)");
  }
}

// One SGD step per x_t on w [4], loss = Σ w·x_t / 4, scaled: the weights, scales and skips of every step.
struct LoopTrace {
  std::vector<double> scales, weights;
  int64_t skipped = 0;
};
static LoopTrace sgd_loop(const std::vector<std::vector<double>>& xs, bool by_student) {
  LossScaleState state{.scale = 1024.0, .growth_interval = 3};
  nn::GradScaler library({.init_scale = 1024.0, .growth_interval = 3});
  Tensor w = from_vector({0.5, -1.0, 2.0, 0.25}, Shape({4}));
  w.set_requires_grad(true);
  LoopTrace trace;
  for (const std::vector<double>& x : xs) {
    const Tensor loss = mul(sum(mul(w, from_vector(x, Shape({4})))), 0.25);
    w.set_grad(Tensor());
    bool found = false;
    if (by_student) {
      impl::scale_loss(state, loss).backward();
      found = impl::unscale_gradients(state, {w.grad()});
    } else {
      mul(loss, library.scale()).backward();
      found = library.unscale({w.grad()});
    }
    if (!found) {
      NoGradGuard no_grad;
      w.add_(mul(w.grad(), -0.1));
    }
    if (by_student)
      impl::update_scale(state, found);
    else
      library.update(found);
    trace.scales.push_back(by_student ? state.scale : library.scale());
    for (double v : w.to_vector()) trace.weights.push_back(v);
  }
  trace.skipped = by_student ? state.skipped_steps : library.skipped_steps();
  return trace;
}

static void check_scale_loss() {
  const LossScaleState state{.scale = 4096.0};
  Tensor w = from_vector({1, 2, 3}, Shape({3}));
  w.set_requires_grad(true);
  const Tensor loss = mul(sum(mul(w, from_vector({0.5, -2, 0.25}, Shape({3})))), 0.5);  // 0.5·(0.5 - 4 + 0.75)
  const Tensor scaled = impl::scale_loss(state, loss);
  const double value = scaled.to_vector().at(0), want = loss.to_vector()[0] * 4096.0;
  expect(value != loss.to_vector()[0], "scale_loss returned the loss unchanged: multiply it by state.scale");
  expect(value != loss.to_vector()[0] / 4096.0, "scale_loss divided the loss by S: multiply it");
  expect(value == want, "scale_loss returned " + num(value) + ", loss · S is " + num(want));
  expect(scaled.requires_grad(),
         "the scaled loss is off the tape (no gradient can flow through it): build it with "
         "sl::mul(loss, S), not from its value");
  scaled.backward();
  expect(same(w.grad().to_vector(), {0.25 * 4096, -1.0 * 4096, 0.125 * 4096}),
         "backward of the scaled loss should give S · g = 1024, -4096, 512; got " + num(w.grad().to_vector()[0]) +
             ", ...");
}

static void check_unscale_f32() {
  const LossScaleState state{.scale = 65536.0};
  const std::vector<Tensor> mine = gradients(65536.0), reference = gradients(65536.0);
  const bool found = impl::unscale_gradients(state, mine);
  nn::GradScaler({.init_scale = 65536.0}).unscale(reference);
  for (size_t i = 0; i < mine.size(); ++i)
    expect(same(mine[i].to_vector(), reference[i].to_vector()),
           diagnose_unscale(65536.0, mine[i].to_vector(), reference[i].to_vector()));
  expect(!found, "unscale_gradients reported an inf or NaN in finite gradients");
}

static void check_unscale_planted() {
  const double planted[] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                            std::nan("")};
  const char* names[] = {"inf", "-inf", "NaN"};
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> grads = gradients(1024.0);
    std::vector<double> values = grads[1].to_vector();
    values[4] = planted[k];
    grads[1] = from_vector(values, Shape({2, 3}));
    grads.insert(grads.begin() + 1, Tensor());  // a parameter backward never reached
    const bool found = impl::unscale_gradients({.scale = 1024.0}, grads);
    expect(found, std::string("a ") + names[k] + " planted in the last gradient was not found" +
                      (k == 2 ? ": NaN compares unequal to everything, itself included; use std::isfinite" : "") +
                      " (look at every element of every gradient)");
  }
  const bool clean = impl::unscale_gradients({.scale = 1024.0}, {Tensor(), gradients(1024.0)[0]});
  expect(!clean, "an undefined gradient next to a clean one was reported as an overflow: skip undefined tensors");
}

static void check_unscale_f16() {
  const std::vector<Tensor> mine = gradients(512.0, DType::f16), reference = gradients(512.0, DType::f16);
  const bool found = impl::unscale_gradients({.scale = 512.0}, mine);
  nn::GradScaler({.init_scale = 512.0}).unscale(reference);
  for (size_t i = 0; i < mine.size(); ++i) {
    expect(mine[i].dtype() == DType::f16, "the gradient's dtype changed: unscale in place, in its own dtype");
    expect(same(mine[i].to_vector(), reference[i].to_vector()),
           diagnose_unscale(512.0, mine[i].to_vector(), reference[i].to_vector()));
  }
  expect(!found, "unscale_gradients reported an overflow in finite f16 gradients");
}

static void check_growth() { expect_same_history(std::vector<bool>(7, false), 3, "clean run"); }

static void check_overflows() {
  expect_same_history({false, false, true, false, true, true, false, false, false, false, true, false, false, false}, 3,
                      "overflows at steps 2, 4, 5, 10");
}

static void check_sgd_loop() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> xs;
  for (int t = 0; t < 10; ++t) xs.push_back({1.0 + t, -0.5, 0.25 * t, 2.0});
  xs[2][1] = inf, xs[5][3] = std::nan(""), xs[6][0] = -inf;
  const LoopTrace mine = sgd_loop(xs, true), reference = sgd_loop(xs, false);
  for (size_t t = 0; t < xs.size(); ++t) {
    expect(
        mine.scales[t] == reference.scales[t],
        "step " + std::to_string(t) + ": your scale " + num(mine.scales[t]) + ", nn::GradScaler's " +
            num(reference.scales[t]) +
            (mine.scales[t] == 2 * reference.scales[t] ? ": grown too early (does an overflow restart the clean count?)"
                                                       : ""));
    for (size_t i = 0; i < 4; ++i)
      expect(mine.weights[4 * t + i] == reference.weights[4 * t + i],
             "step " + std::to_string(t) + ": w[" + std::to_string(i) + "] is " + num(mine.weights[4 * t + i]) +
                 ", with nn::GradScaler " + num(reference.weights[4 * t + i]) +
                 (std::isfinite(mine.weights[4 * t + i]) ? "" : ": an overflow reached the weights (skip that step)"));
  }
  expect(mine.skipped == 3, "3 steps carry an inf or NaN, you skipped " + std::to_string(mine.skipped));
}

static void check_fp16() {
  // The gradient of Σ w·x is x: tiny values, stored in fp16 (smallest subnormal 6e-8) as fp16 training does.
  std::vector<double> x;
  for (int i = 0; i < 8; ++i) x.push_back(1e-8 * (1 + 0.1 * i));
  auto fp16_gradient = [&](const LossScaleState& state) {
    Tensor w = zeros({8});
    w.set_requires_grad(true);
    impl::scale_loss(state, sum(mul(w, from_vector(x, Shape({8}))))).backward();
    Tensor g = w.grad().to(DType::f16).to(DType::f32);  // through fp16, unscaled in f32
    const bool found = impl::unscale_gradients(state, {g});
    return std::make_pair(g.to_vector(), found);
  };
  const auto [plain, plain_inf] = fp16_gradient({.scale = 1.0});
  const auto [scaled, scaled_inf] = fp16_gradient({.scale = 65536.0});
  for (size_t i = 0; i < x.size(); ++i) {
    expect(plain[i] == 0, "at scale 1, fp16(" + num(x[i]) + ") should flush to 0 but reads " + num(plain[i]));
    expect(
        std::abs(scaled[i] - x[i]) < 1e-3 * x[i],
        "scaled by 2^16, the gradient " + num(x[i]) + " should survive fp16 within 0.1% but reads " + num(scaled[i]));
  }
  expect(!plain_inf && !scaled_inf, "no overflow here, yet unscale_gradients reported one");
  // Gradients of 2: 2 · 2^16 and 2 · 2^15 overflow fp16 (max 65504), 2 · 2^14 fits.
  LossScaleState state{.scale = 65536.0, .growth_interval = 2000};
  std::vector<double> history;
  for (int step = 0; step < 4; ++step) {
    Tensor w = zeros({2});
    w.set_requires_grad(true);
    impl::scale_loss(state, sum(mul(w, full({2}, 2.0)))).backward();
    const bool found = impl::unscale_gradients(state, {w.grad().to(DType::f16).to(DType::f32)});
    impl::update_scale(state, found);
    history.push_back(state.scale);
  }
  expect(same(history, {32768, 16384, 16384, 16384}) && state.skipped_steps == 2,
         "gradients of 2 overflow fp16 at 2^16 and 2^15: the scale should go 2^15, 2^14, then stay (2 skipped); "
         "yours went " +
             num(history[0]) + ", " + num(history[1]) + ", " + num(history[2]) + ", " + num(history[3]) + " with " +
             std::to_string(state.skipped_steps) + " skipped");
}

// The prediction's measured value: nn::GradScaler driven through the same nine steps.
static double measured_scale_after_nine_steps() {
  nn::GradScaler scaler({.init_scale = 65536.0, .growth_interval = 3});
  for (int step = 1; step <= 9; ++step) scaler.update(/*found_inf=*/step <= 2);
  return scaler.scale();
}

int main() {
  exercises::Grader grader("04_loss_scaling");
  grader.predict("the scale after 2 overflows then 7 clean steps, from 65536 at growth_interval 3",
                 impl::predicted_scale_after_nine_steps, measured_scale_after_nine_steps, 0, "(scale)");
  grader.check("scale_loss: loss · S, on the tape: backward hands S · g to the weights", check_scale_loss);
  grader.check("unscale_gradients: clean f32 gradients divided by S in place, exactly, and no overflow reported",
               check_unscale_f32);
  grader.check("unscale_gradients: a planted inf, -inf or NaN anywhere is found; undefined gradients are skipped",
               check_unscale_planted);
  grader.check("unscale_gradients: f16 gradients unscaled in their own dtype, equal to nn::GradScaler's",
               check_unscale_f16);
  grader.check("update_scale: 7 clean steps at growth_interval 3 grow the scale twice, as nn::GradScaler",
               check_growth);
  grader.check("update_scale: planted overflows halve the scale, count as skipped and restart the clean count",
               check_overflows);
  grader.check("a whole SGD loop with planted infs and a NaN: weights, scales and skips equal nn::GradScaler's",
               check_sgd_loop);
  grader.check("fp16: 1e-8 gradients flush unscaled, survive scaled by 2^16; too large a scale halves until it fits",
               check_fp16);
  return grader.finish();
}
