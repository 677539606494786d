// Mixed precision (nn/mixed_precision.h) in every layout that runs it: bf16 and fp16 weights and
// activations, f32 master weights in AdamW, gradients in bf16 or f32, fp16 loss scaling agreed over
// the world. Each layout is compared with an independent serial mixed-precision run (its own nn::GPT
// in 16 bits, nn::AdamW with master weights, nn::GradScaler) over 5 AdamW steps at lr 1e-2, wd 0.1.
//
// Why the layouts are not bitwise equal to serial, and the bounds the tests use (lr, eps, betas and
// wd from parity_adamw()):
//   every op rounds its output to 16 bits, u = 2^-9 (bf16) or 2^-12 (fp16) relative; a layout sums
//   the same numbers in another order (a ring all-reduce of 16-bit buckets rounds at every hop, a
//   TP row-parallel layer adds partial products the serial matmul adds inside one f32 accumulator),
//   so the same value can land one rounding apart: |Δ| ≤ u·|x| per rounding.
//
//   1. The mean loss and the gradient norm: within 4u relative (sums over the whole batch and model,
//      whose roundings average out instead of adding up).
//   2. Every AdamW step, every element, on the layout's own state (its state pieces: f32 master
//      weights and both moments, before and after the step) and the gradient it reduced: AdamW's
//      formula, written out here, holds up to f32's rounding e = 2^-24 per operation and the 16-bit
//      rounding of the clipped gradient g (u_g = 2^-9 for bf16 gradients, 0 for f32 ones):
//        |m - (b1·m0 + (1-b1)·g)|     ≤ (1-b1)·(u_g + e)·|g| + 4e·(b1·|m0| + (1-b1)·|g|)
//        |v - (b2·v0 + (1-b2)·g²)|    ≤ (1-b2)·3(u_g + e)·g² + 4e·(b2·v0 + (1-b2)·g²)
//        |w - (w0·(1 - lr·wd) - step)| ≤ 4e·(|w0| + |w|) + 8e·|step|,  step = lr/bc1 · m/(sqrt(v/bc2) + eps)
//      A lost decay misses lr·wd·|w0| = 1e-3·|w0|, 2000 times the bound on w; a frozen element keeps
//      m0 while (1-b1)·g arrives, 1/(u_g + 5e) times the bound on m (512 for bf16 gradients). Both
//      fail at the first step they happen, in any tensor, however few the elements.
//      The 16-bit weights are the master weights rounded, bit for bit.
//   3. The first step against serial, element by element: both runs start from the same weights, so
//      their gradients differ by rounding only, |Δg| ≤ Δ = 16u·max|g| over the tensor (8u seen: the
//      ring's hops and the micro-batch sums round once each). AdamW's first step is lr·g/(|g| + eps)
//      (m̂ = g, v̂ = g²), whose slope is eps/(|g| + eps)², so
//        |Δw| ≤ lr·eps·Δ/(|g| - Δ + eps)² + 8e·(|w| + lr)      where |g| > Δ,
//        |Δw| < 2·lr                                            where |g| ≤ Δ: the serial gradient is
//      within noise of 0, the sign of the step may flip; only there an element may be an outlier.
//      Where |g| ≥ 2Δ the first bound is ≤ lr·eps/Δ, far below a lost decay (1e-3·|w|) or a frozen
//      element (lr).
//   4. Later steps against serial: an element that flipped feeds the next forward pass, so from the
//      second step on every gradient moves by more than rounding (0.1·lr was seen in an element whose
//      gradient is 10% of its tensor's largest): no per-element bound in u holds there. The 16-bit
//      weights stay within 4u·(1 + |w|), except at most 1 + n/100 elements of a tensor of n (7 of
//      1024 seen), each within 2·lr per step taken (Adam moves an element by at most lr a step,
//      either way). Checks 2 and 3 are the ones a lost decay or a frozen element cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/trainer.h"
#include "parallel/zero/zero_adamw.h"
#include "tensor/ledger.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

constexpr int64_t kBatch = 12, kT = 8;
constexpr int kSteps = 5;
constexpr uint64_t kSeed = 11;
constexpr double kClip = 1.0;

nn::GPTConfig config(DType dtype, int64_t layers = 2) {
  nn::GPTConfig c{.vocab_size = 32, .block_size = kT, .n_layer = layers, .n_head = 2, .n_embd = 16};
  c.param_dtype = dtype;
  return c;
}

double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12); }

using test_support::nan_max_into;

constexpr double kF32Rounding = 0x1p-24;  // e: one f32 operation's relative rounding

struct SerialStep {
  double loss = 0, norm = 0;
  nn::StateDict params;                                // the 16-bit weights after the step
  std::map<std::string, std::vector<double>> masters;  // AdamW's f32 master weights after the step
  std::map<std::string, std::vector<double>> grads;    // the gradient the step used (unscaled, clipped)
};

// The serial mixed-precision step, written out: scaled backward, unscale, clip, step. The scaling
// is the test's own (not nn::GradScaler's), so a layout that forgets to unscale cannot agree with it:
// 5 steps of the parity stream never overflow, so the scale stays 2^16 (fp16) or 1 (bf16).
std::vector<SerialStep> run_serial(const nn::MixedPrecision& precision, int64_t layers) {
  nn::GPT model(config(precision.param_dtype, layers), kSeed);
  nn::AdamWOptions adamw = parity_adamw();
  adamw.master_weights = true;
  nn::AdamW optimizer(model.parameters(), adamw);
  const double scale = precision.loss_scale.enabled ? 65536.0 : 1.0;
  const nn::TokenStream data = parity_tokens();
  std::vector<SerialStep> steps;
  for (int s = 0; s < kSteps; ++s) {
    nn::zero_grads(model.parameters(), precision);
    nn::Batch batch = data.get_batch(s, kBatch, kT);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    mul(loss, scale).backward();
    for (const Tensor& p : model.parameters()) {
      for (double g : p.grad().to_vector()) EXPECT_TRUE(std::isfinite(g)) << "the serial run overflowed at step " << s;
      p.grad().mul_(1.0 / scale);
    }
    SerialStep step{loss.item(), nn::clip_grad_norm(model.parameters(), kClip), {}, {}, {}};
    optimizer.step();
    for (const auto& [name, p] : model.state_dict()) step.params[name] = p.detach().clone();
    size_t i = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      step.grads[name] = p.grad().to_vector();
      step.masters[name] = optimizer.state(i++).buffers.at("master").to_vector();
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

// AdamW's state of a layout, whole, by parameter name: the f32 master weights and both moments.
struct AdamState {
  std::map<std::string, std::vector<double>> master, exp_avg, exp_avg_sq;
};

// The layout's AdamW state from its state pieces (parallel/train/checkpointing.h), whole on rank 0
// (collective over the world; the other ranks get an empty state). Each rank writes the regions it
// owns into zeros and a sum over the world adds them up (x + 0 is exact in f32); beside the values a
// count of the ranks that wrote each element, which must be 1: an element written by none or by two
// is NaN, and fails every check. `numel`: the serial model's parameters and their sizes.
AdamState gather_adam_state(Trainer& trainer, const nn::GPTConfig& cfg, RankContext& ctx,
                            const std::map<std::string, int64_t>& numel) {
  const std::vector<std::pair<std::string, StateKind>> kinds = {
      {"master", StateKind::master}, {"exp_avg", StateKind::exp_avg}, {"exp_avg_sq", StateKind::exp_avg_sq}};
  std::map<std::string, int64_t> offset;  // by state tensor name ("exp_avg.wte.weight"), into one buffer
  int64_t total = 0;
  for (const auto& [kind_name, kind] : kinds)
    for (const auto& [name, n] : numel) offset[state_tensor_name(kind, name)] = total, total += n;
  const Device host = ctx.device.is_cpu() ? ctx.device : Device::cpu();
  Tensor sum = zeros({2 * total}, TensorOptions(DType::f32, host));  // [values | counts]
  float* into = sum.data<float>();
  for (const StatePiece& piece : state_pieces(trainer, cfg)) {
    if (!piece.owner || !offset.count(piece.tensor)) continue;  // replicas; the 16-bit weights
    EXPECT_EQ(piece.data.dtype(), DType::f32) << piece.tensor;
    int64_t n = 1;
    for (int64_t d : piece.global_shape) n *= d;
    const Region whole{std::vector<int64_t>(piece.global_shape.size(), 0), piece.global_shape, 0, n};
    const Tensor host = piece.data.device().is_cpu() ? piece.data : piece.data.to(Device::cpu());
    std::vector<float> values(static_cast<size_t>(n), 0.0f), written(static_cast<size_t>(n), 0.0f);
    const std::vector<float> ones(static_cast<size_t>(piece.region.numel()), 1.0f);
    copy_overlap(whole, values.data(), piece.region, host.raw_data(), sizeof(float));
    copy_overlap(whole, written.data(), piece.region, ones.data(), sizeof(float));
    const int64_t at = offset.at(piece.tensor);
    for (int64_t i = 0; i < n; ++i) {
      into[at + i] += values[static_cast<size_t>(i)];
      into[total + at + i] += written[static_cast<size_t>(i)];
    }
  }
  if (!ctx.device.is_cpu()) sum = sum.to(ctx.device);
  ctx.world->all_reduce(sum);
  AdamState state;
  if (ctx.rank != 0) return state;
  if (!sum.device().is_cpu()) sum = sum.to(Device::cpu());
  const float* all = sum.data<float>();
  for (const auto& [kind_name, kind] : kinds) {
    auto& out = kind == StateKind::master    ? state.master
                : kind == StateKind::exp_avg ? state.exp_avg
                                             : state.exp_avg_sq;
    for (const auto& [name, n] : numel) {
      const int64_t at = offset.at(state_tensor_name(kind, name));
      std::vector<double>& v = out[name];
      v.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = all[total + at + i] == 1 ? all[at + i] : std::nan("");
    }
  }
  return state;
}

// The largest err/bound over a tensor (NaN if any is NaN: an element no rank wrote, or a NaN
// update), and the element where it is, for the message.
struct Worst {
  double ratio = 0;
  size_t at = 0;
  void add(double err, double bound, size_t i) {
    const double r = err / (bound + std::numeric_limits<double>::denorm_min());  // 0/0 (all zeros) is no error
    if (std::isnan(ratio)) return;                                               // the first NaN is the one to show
    if (std::isnan(r) || r > ratio) at = i;
    nan_max_into(ratio, r);
  }
};

// Check 2 of the header: one AdamW step of the layout, from its state `before` to `after`, with the
// gradient it reduced (`grads`, before clipping) times `clip`; t: the step count after the step.
void expect_adamw_step(const AdamState& before, const AdamState& after, const nn::StateDict& grads, double clip,
                       int64_t t, const nn::StateDict& shapes, int step) {
  const nn::AdamWOptions o = parity_adamw();
  const double e = kF32Rounding;
  // The constants as AdamW holds them, in f32 (1 - b is exact in f32 for b in [0.5, 1)).
  const double b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2), eps = static_cast<float>(o.eps);
  const double step_size = static_cast<float>(o.lr / (1.0 - std::pow(o.beta1, static_cast<double>(t))));
  const double inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t))));
  const double decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  for (const auto& [name, shape] : shapes) {
    ASSERT_TRUE(grads.count(name)) << name << " has no kept gradient at step " << step;
    const Tensor& grad = grads.at(name);
    const double u_g = grad.dtype() == DType::f32 ? 0.0 : unit_roundoff(grad.dtype());
    const std::vector<double> g0 = grad.to_vector();
    const std::vector<double>&w0 = before.master.at(name), &m0 = before.exp_avg.at(name),
          &v0 = before.exp_avg_sq.at(name), &w = after.master.at(name), &m = after.exp_avg.at(name),
          &v = after.exp_avg_sq.at(name);
    const bool decayed = shape.dim() >= 2;  // AdamW decays matrices only (not biases, not LayerNorm)
    Worst wm, wv, ww;
    for (size_t i = 0; i < w.size(); ++i) {
      const double g = g0[i] * clip, dg = (u_g + e) * std::abs(g);
      wm.add(std::abs(m[i] - (b1 * m0[i] + (1 - b1) * g)),
             (1 - b1) * dg + 4 * e * (b1 * std::abs(m0[i]) + (1 - b1) * std::abs(g)), i);
      wv.add(std::abs(v[i] - (b2 * v0[i] + (1 - b2) * g * g)),
             (1 - b2) * 3 * dg * std::abs(g) + 4 * e * (b2 * v0[i] + (1 - b2) * g * g), i);
      const double update = step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
      const double want = w0[i] * (decayed ? decay : 1.0) - update;
      ww.add(std::abs(w[i] - want), 4 * e * (std::abs(w0[i]) + std::abs(w[i])) + 8 * e * std::abs(update), i);
    }
    EXPECT_LE(wm.ratio, 1.0) << "exp_avg." << name << "[" << wm.at << "] at step " << step << ": " << m[wm.at]
                             << ", AdamW gives " << b1 * m0[wm.at] + (1 - b1) * g0[wm.at] * clip << " from "
                             << m0[wm.at] << " and the gradient " << g0[wm.at] * clip;
    EXPECT_LE(wv.ratio, 1.0) << "exp_avg_sq." << name << "[" << wv.at << "] at step " << step << ": " << v[wv.at]
                             << " from " << v0[wv.at] << " and the gradient " << g0[wv.at] * clip;
    const size_t i = ww.at;
    EXPECT_LE(ww.ratio, 1.0) << "master." << name << "[" << i << "] at step " << step << ": " << w[i] << " from "
                             << w0[i] << (decayed ? " (decayed)" : "") << ", AdamW gives "
                             << w0[i] * (decayed ? decay : 1.0) -
                                    step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps)
                             << " (a difference of " << ww.ratio << " times the rounding bound)";
  }
}

// Check 2's last line: the 16-bit weights (`got`, the layout's own gather) are its master weights rounded.
void expect_weights_are_rounded_masters(const nn::StateDict& got, const AdamState& state, int step) {
  for (const auto& [name, master] : state.master) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& w = got.at(name);
    const Tensor rounded = from_vector(master, w.shape(), DType::f32).to(w.dtype());
    EXPECT_EQ(std::memcmp(rounded.raw_data(), w.raw_data(), static_cast<size_t>(w.nbytes())), 0)
        << name << " at step " << step << " is not its master weights rounded to " << dtype_name(w.dtype());
  }
}

// Check 3 of the header: the master weights after the first step, element by element.
void expect_first_step_close(const AdamState& got, const SerialStep& serial, double u) {
  const nn::AdamWOptions o = parity_adamw();
  const double e = kF32Rounding;
  for (const auto& [name, want] : serial.masters) {
    const std::vector<double>& a = got.master.at(name);
    const std::vector<double>& g = serial.grads.at(name);
    double largest = 0;
    for (double x : g) nan_max_into(largest, std::abs(x));
    const double noise = 16 * u * largest;  // Δ
    Worst worst;
    int64_t near_zero = 0, flipped = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::abs(a[i] - want[i]), rounding = 8 * e * (std::abs(want[i]) + o.lr);
      const double gi = std::abs(g[i]);
      if (gi > noise) {
        worst.add(err, o.lr * o.eps * noise / std::pow(gi - noise + o.eps, 2) + rounding, i);
      } else {  // within noise of 0: the step's sign may differ
        near_zero++;
        flipped += err > o.lr ? 1 : 0;
        worst.add(err, 2 * o.lr + rounding, i);
      }
    }
    const size_t i = worst.at;
    EXPECT_LE(worst.ratio, 1.0) << "master." << name << "[" << i << "] after the first step: " << a[i] << " vs serial "
                                << want[i] << " (gradient " << g[i] << ", noise " << noise << "; " << flipped
                                << " of the " << near_zero << " of " << want.size()
                                << " elements whose gradient is within noise of 0 stepped the other way)";
  }
}

// Check 4 of the header: the 16-bit weights within tol of the serial ones, except at most 1 + n/100
// elements of each tensor of n, each within 2·lr per step taken.
void expect_close_but_outliers(const nn::StateDict& got, const nn::StateDict& want, double tol, int rank, int step) {
  ASSERT_EQ(got.size(), want.size());
  const double outlier_bound = 2 * parity_adamw().lr * (step + 1) + tol;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.dtype(), w.dtype()) << name;
    const std::vector<double> a = g.to_vector(), b = w.to_vector();
    int64_t outside = 0;
    Worst worst;
    for (size_t i = 0; i < b.size(); ++i) {
      const double diff = std::abs(a[i] - b[i]);
      if (!(diff <= tol + tol * std::abs(b[i]))) outside++;  // NaN counts
      worst.add(diff, outlier_bound, i);
    }
    const size_t i = worst.at;
    EXPECT_LE(worst.ratio, 1.0) << name << "[" << i << "] on rank " << rank << " at step " << step << ": " << a[i]
                                << " vs serial " << b[i];
    EXPECT_LE(outside, 1 + static_cast<int64_t>(b.size()) / 100)
        << outside << " of the " << b.size() << " elements of " << name << " differ by more than " << tol
        << " (relative) on rank " << rank << " at step " << step;
  }
}

struct MpCase {
  std::string name;
  ParallelismConfig parallelism;
  std::string mode, grads = "";
  int micro_batches = 1;
  bool sp = false;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  DpStrategy dp = DpStrategy::ddp;  // zero1, zero2, fsdp (ZeRO-3, HSDP with dp_replicate)
  bool offload = false;
  int virtual_stages = 1;  // interleaved: model chunks per stage (the GPT then has pp x this many layers)
  CpVariant cp_variant = CpVariant::ring;
  CpBalance cp_balance = CpBalance::zigzag;
  int ulysses_degree = 0;  // cp hybrid: U
  int64_t layers() const { return std::max<int64_t>(2, parallelism.pp * virtual_stages); }
  int world() const { return parallelism.world_size(); }
};
void PrintTo(const MpCase& c, std::ostream* out) { *out << c.name; }

TrainPlan plan_of(const MpCase& c) {
  TrainPlan plan;
  plan.parallelism = c.parallelism;
  plan.micro_batches = c.micro_batches;
  plan.sequence_parallel = c.sp;
  plan.schedule = c.schedule;
  plan.precision = nn::MixedPrecision::parse(c.mode, c.grads);
  plan.dp_strategy = c.dp;
  plan.offload = c.offload;
  plan.virtual_stages = c.virtual_stages;
  plan.cp_variant = c.cp_variant;
  plan.cp_balance = c.cp_balance;
  plan.ulysses_degree = c.ulysses_degree;
  return plan;
}

// Runs `c` on its mesh, as train builds it (parallel/nd/parallelize.h).
std::unique_ptr<Trainer> make_trainer(RankContext& ctx, const MpCase& c) {
  const TrainPlan plan = plan_of(c);
  return make_plan_trainer(ctx, plan, config(plan.precision.param_dtype, c.layers()), kSeed, parity_adamw());
}

class MixedPrecisionParity : public testing::TestWithParam<MpCase> {};

TEST_P(MixedPrecisionParity, MatchesTheSerialMixedPrecisionRun) {
  const MpCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::MixedPrecision precision = nn::MixedPrecision::parse(c.mode, c.grads);
  const std::vector<SerialStep> serial = run_serial(precision, c.layers());
  const double u = unit_roundoff(precision.param_dtype), tol = 4 * u;
  std::map<std::string, int64_t> numel;
  for (const auto& [name, m] : serial[0].masters) numel[name] = static_cast<int64_t>(m.size());
  const nn::GPTConfig cfg = config(precision.param_dtype, c.layers());
  const nn::TokenStream data = parity_tokens();
  launch(
      c.world(),
      [&](RankContext& ctx) {
        std::unique_ptr<Trainer> trainer = make_trainer(ctx, c);
        trainer->keep_gradients();
        AdamState before = gather_adam_state(*trainer, cfg, ctx, numel);
        for (int s = 0; s < kSteps; ++s) {
          const double loss = trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
          EXPECT_NEAR(loss, serial[s].loss, tol * std::abs(serial[s].loss)) << "step " << s;
          EXPECT_NEAR(trainer->last_grad_norm(), serial[s].norm, tol * serial[s].norm) << "step " << s;
          EXPECT_EQ(trainer->strategy().optimizer_steps(), s + 1) << "step " << s;
          AdamState after = gather_adam_state(*trainer, cfg, ctx, numel);
          const nn::StateDict weights = trainer->full_state_dict();
          if (ctx.rank == 0) {  // the whole state, gathered on rank 0
            const double norm = trainer->last_grad_norm();
            expect_adamw_step(before, after, trainer->full_gradients(), norm > kClip ? kClip / (norm + 1e-6) : 1.0,
                              s + 1, serial[s].params, s);
            expect_weights_are_rounded_masters(weights, after, s);
            if (s == 0) expect_first_step_close(after, serial[0], u);
          }
          expect_close_but_outliers(weights, serial[s].params, tol, ctx.rank, s);
          before = std::move(after);
        }
        EXPECT_EQ(trainer->scaler().scale(), precision.loss_scale.enabled ? 65536.0 : 1.0);
      },
      quick(30000));
}

std::vector<MpCase> parity_cases() {
  std::vector<MpCase> cases;
  for (std::string mode : {"bf16", "fp16"}) {
    cases.push_back({mode + "_ddp2", {.dp_replicate = 2}, mode});
    cases.push_back({mode + "_ddp3_micro2", {.dp_replicate = 3}, mode, "", 2});
    cases.push_back({mode + "_pp2_1f1b", {.pp = 2}, mode, "", 2});
    cases.push_back({mode + "_pp2_zero_bubble", {.pp = 2}, mode, "", 2, false, ScheduleKind::zero_bubble});
    cases.push_back({mode + "_tp2_sp", {.tp = 2}, mode, "", 1, true});
    cases.push_back({mode + "_cp2", {.cp = 2}, mode});
    cases.push_back({mode + "_dp2_pp2_tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}, mode, "", 2});
    cases.push_back({mode + "_dp2_cp2_tp2_sp", {.dp_replicate = 2, .cp = 2, .tp = 2}, mode, "", 1, true});
  }
  cases.push_back({"bf16_f32grads_ddp2_micro3", {.dp_replicate = 2}, "bf16", "f32", 3});
  cases.push_back({"bf16_f32grads_pp2_tp2", {.pp = 2, .tp = 2}, "bf16", "f32", 2});
  // The sharded strategies: ZeRO-1/2 reduce-scatter the 16-bit buckets (ZeRO-1's average in place),
  // ZeRO-3/FSDP and HSDP gather 16-bit weights and reduce 16-bit gradients, offload steps on the host.
  // N = 3 pads every bucket; the f32-gradient cases hold main_grad in the flat buffers.
  const ScheduleKind f1b = ScheduleKind::one_f_one_b;
  for (std::string mode : {"bf16", "fp16"}) {
    cases.push_back({mode + "_zero1_dp2", {.dp_shard = 2}, mode, "", 1, false, f1b, DpStrategy::zero1});
    cases.push_back({mode + "_zero2_dp3_micro2", {.dp_shard = 3}, mode, "", 2, false, f1b, DpStrategy::zero2});
    cases.push_back({mode + "_fsdp3", {.dp_shard = 3}, mode, "", 1, false, f1b, DpStrategy::fsdp});
    cases.push_back(
        {mode + "_hsdp_2x2", {.dp_replicate = 2, .dp_shard = 2}, mode, "", 1, false, f1b, DpStrategy::fsdp});
  }
  cases.push_back({"bf16_zero1_dp3_micro2", {.dp_shard = 3}, "bf16", "", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_f32grads_zero1_dp2", {.dp_shard = 2}, "bf16", "f32", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_f32grads_fsdp2", {.dp_shard = 2}, "bf16", "f32", 1, false, f1b, DpStrategy::fsdp});
  cases.push_back({"bf16_zero2_offload_dp2", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2, true});
  cases.push_back({"fp16_zero1_offload_dp2", {.dp_shard = 2}, "fp16", "", 1, false, f1b, DpStrategy::zero1, true});
  cases.push_back({"bf16_fsdp2_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp, true});
  cases.push_back({"bf16_zero2_dp2_tp2_sp", {.dp_shard = 2, .tp = 2}, "bf16", "", 1, true, f1b, DpStrategy::zero2});
  cases.push_back({"bf16_zero1_dp2_pp2", {.dp_shard = 2, .pp = 2}, "bf16", "", 2, false, f1b, DpStrategy::zero1});
  cases.push_back({"bf16_fsdp2_cp2", {.dp_shard = 2, .cp = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp});
  // Ulysses keeps 16-bit q, k, v through its all-to-alls and the serial attention (n_head 2 over cp 2)
  for (std::string mode : {"bf16", "fp16"})
    cases.push_back({mode + "_cp2_ulysses", {.cp = 2}, mode, "", 1, false, f1b, DpStrategy::ddp, false, 1,
                     CpVariant::ulysses});
  // Context parallelism's 16-bit blocks: q, k, v and the K/V passed round the ring stay 16-bit, each
  // block and the merges compute in f32, out and the gradients are rounded once. Every variant and
  // balance, in both modes: the ring over 4 ranks (zigzag), contiguous, all-gather, hybrid (U 2 x R 2).
  for (std::string mode : {"bf16", "fp16"}) {
    cases.push_back({mode + "_cp4_zigzag", {.cp = 4}, mode});
    cases.push_back({mode + "_cp2_contiguous", {.cp = 2}, mode, "", 1, false, f1b, DpStrategy::ddp, false, 1,
                     CpVariant::ring, CpBalance::none});
    cases.push_back({mode + "_cp2_allgather", {.cp = 2}, mode, "", 1, false, f1b, DpStrategy::ddp, false, 1,
                     CpVariant::allgather});
    cases.push_back({mode + "_cp4_hybrid", {.cp = 4}, mode, "", 1, false, f1b, DpStrategy::ddp, false, 1,
                     CpVariant::hybrid, CpBalance::zigzag, 2});
  }
  cases.push_back({"fp16_fsdp2_tp2", {.dp_shard = 2, .tp = 2}, "fp16", "", 1, false, f1b, DpStrategy::fsdp});
  // The schedules not above: naive and GPipe, and interleaved 1F1B (2 chunks per stage, 4 layers).
  cases.push_back({"bf16_pp2_naive", {.pp = 2}, "bf16", "", 2, false, ScheduleKind::naive});
  cases.push_back({"fp16_pp2_gpipe", {.pp = 2}, "fp16", "", 2, false, ScheduleKind::gpipe});
  cases.push_back(
      {"bf16_pp2_interleaved", {.pp = 2}, "bf16", "", 2, false, ScheduleKind::interleaved, DpStrategy::ddp, false, 2});
  cases.push_back({"fp16_zero1_dp2_pp2_interleaved",
                   {.dp_shard = 2, .pp = 2},
                   "fp16",
                   "",
                   2,
                   false,
                   ScheduleKind::interleaved,
                   DpStrategy::zero1,
                   false,
                   2});  // (DDP refuses interleaved)
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, MixedPrecisionParity, testing::ValuesIn(parity_cases()),
                         [](const testing::TestParamInfo<MpCase>& info) { return info.param.name; });

// A loss scale so large that fp16's gradients overflow (65504 is fp16's largest): every rank of every
// mesh dimension must skip the step, and nothing but the scaler moves: not a bit of the weights, the
// f32 master weights or the moments, nor AdamW's step count. The scaler halves the scale, counts the
// skip and starts its run of clean steps again (GradScaler::update). Twice: on the first step, and
// after a clean one, when the moments and the step count are no longer zeros that a slip could keep.
class MixedPrecisionOverflow : public testing::TestWithParam<MpCase> {};

// Everything a skipped step must leave alone, bitwise: the 16-bit weights (the layout's own gather),
// AdamW's state (its state pieces) and step count.
struct Untouched {
  nn::StateDict weights;
  AdamState adam;
  int64_t optimizer_steps = 0;
};

Untouched untouched_state(Trainer& trainer, const nn::GPTConfig& cfg, RankContext& ctx) {
  Untouched u{trainer.full_state_dict(), {}, trainer.strategy().optimizer_steps()};
  std::map<std::string, int64_t> numel;
  for (const auto& [name, w] : u.weights) numel[name] = w.numel();
  u.adam = gather_adam_state(trainer, cfg, ctx, numel);
  return u;
}

// On rank 0, which holds the whole AdamW state (gather_adam_state).
void expect_unmoved(const Untouched& before, const Untouched& after, const std::string& when) {
  for (const auto& [name, t] : before.weights)
    EXPECT_EQ(std::memcmp(t.raw_data(), after.weights.at(name).raw_data(), static_cast<size_t>(t.nbytes())), 0)
        << name << " moved " << when;
  const std::vector<std::pair<const char*, const std::map<std::string, std::vector<double>>*>> kinds = {
      {"master", &before.adam.master}, {"exp_avg", &before.adam.exp_avg}, {"exp_avg_sq", &before.adam.exp_avg_sq}};
  const std::vector<const std::map<std::string, std::vector<double>>*> now = {&after.adam.master, &after.adam.exp_avg,
                                                                              &after.adam.exp_avg_sq};
  for (size_t k = 0; k < kinds.size(); ++k)
    for (const auto& [name, was] : *kinds[k].second) {
      const std::vector<double>& is = now[k]->at(name);
      int64_t moved = 0;
      size_t first = 0;
      for (size_t i = 0; i < was.size(); ++i)
        if (!(is[i] == was[i]) && moved++ == 0) first = i;  // NaN (an element no rank holds) counts
      EXPECT_EQ(moved, 0) << moved << " elements of " << kinds[k].first << "." << name << " moved " << when
                          << ", the first [" << first << "]: " << was[first] << " -> " << is[first];
    }
}

TEST_P(MixedPrecisionOverflow, EveryRankSkipsTheStepAndOnlyTheScalerMoves) {
  MpCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::TokenStream data = parity_tokens();
  const double huge = std::ldexp(1.0, 100);  // loss·2^100 is finite in f32, its fp16 gradients are not
  launch(
      c.world(),
      [&](RankContext& ctx) {
        TrainPlan plan = plan_of(c);
        plan.precision.loss_scale.init_scale = huge;
        const nn::GPTConfig cfg = config(DType::f16);
        std::unique_ptr<Trainer> trainer = make_plan_trainer(ctx, plan, cfg, kSeed, parity_adamw());
        nn::GradScaler& scaler = trainer->scaler();
        // This rank's own part, bitwise (FSDP frees its gathered parameters between steps: there the
        // whole state dict, gathered from every rank's shard, is the check).
        const bool local = c.dp != DpStrategy::fsdp;
        auto local_bytes = [&] {
          std::vector<std::string> bytes;
          for (const auto& [name, p] : trainer->runner()->module().named_parameters())
            if (local) bytes.emplace_back(static_cast<const char*>(p.raw_data()), static_cast<size_t>(p.nbytes()));
          return bytes;
        };
        auto overflow_step = [&](int64_t step, int64_t skipped, const std::string& when) {
          const Untouched before = untouched_state(*trainer, cfg, ctx);
          const std::vector<std::string> local_before = local_bytes();
          trainer->train_step(data, step, kBatch, kT, parity_adamw().lr, kClip);
          EXPECT_EQ(scaler.skipped_steps(), skipped) << when << ", rank " << ctx.rank;
          EXPECT_EQ(scaler.scale(), huge / 2) << when << ", rank " << ctx.rank;
          EXPECT_EQ(scaler.clean_steps(), 0) << when << ", rank " << ctx.rank;
          EXPECT_TRUE(local_bytes() == local_before) << "this rank's weights moved " << when << " on rank " << ctx.rank;
          const Untouched after = untouched_state(*trainer, cfg, ctx);
          EXPECT_EQ(after.optimizer_steps, before.optimizer_steps)
              << "AdamW's step count moved " << when << " on rank " << ctx.rank;
          if (ctx.rank == 0) expect_unmoved(before, after, when);  // the whole state, gathered on rank 0
        };
        overflow_step(0, 1, "on an overflow at the first step");
        // A clean step at fp16's usual scale (the counters kept), then the huge scale again.
        scaler.restore(65536.0, scaler.clean_steps(), scaler.skipped_steps());
        trainer->train_step(data, 1, kBatch, kT, parity_adamw().lr, kClip);
        ASSERT_EQ(scaler.skipped_steps(), 1) << "the step at scale 2^16 overflowed on rank " << ctx.rank;
        ASSERT_EQ(scaler.clean_steps(), 1) << "rank " << ctx.rank;
        ASSERT_EQ(trainer->strategy().optimizer_steps(), 1) << "rank " << ctx.rank;
        scaler.restore(huge, scaler.clean_steps(), scaler.skipped_steps());
        overflow_step(2, 2, "on an overflow after a clean step");
      },
      quick(30000));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MixedPrecisionOverflow,
    testing::Values(
        MpCase{"ddp2", {.dp_replicate = 2}, "fp16"},
        MpCase{"pp2_gpipe", {.pp = 2}, "fp16", "", 2, false, ScheduleKind::gpipe},
        MpCase{"tp2_sp", {.tp = 2}, "fp16", "", 1, true}, MpCase{"cp2", {.cp = 2}, "fp16"},
        MpCase{"dp2_pp2_tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}, "fp16", "", 2},
        MpCase{"zero1_dp2", {.dp_shard = 2}, "fp16", "", 1, false, ScheduleKind::one_f_one_b, DpStrategy::zero1},
        MpCase{"zero2_offload_dp2",
               {.dp_shard = 2},
               "fp16",
               "",
               1,
               false,
               ScheduleKind::one_f_one_b,
               DpStrategy::zero2,
               true},
        MpCase{"hsdp_2x2",
               {.dp_replicate = 2, .dp_shard = 2},
               "fp16",
               "",
               1,
               false,
               ScheduleKind::one_f_one_b,
               DpStrategy::fsdp},
        MpCase{
            "fsdp2_pp2", {.dp_shard = 2, .pp = 2}, "fp16", "", 2, false, ScheduleKind::one_f_one_b, DpStrategy::fsdp}),
    [](const testing::TestParamInfo<MpCase>& info) { return info.param.name; });

// ZeRO's accounting, from Ψ (counted from the config's shapes) and the element sizes: DDP holds
// weights 2Ψ, gradients 2Ψ (bf16 buckets) or 4Ψ (f32 main_grad), optimizer 12Ψ (master + two moments).
TEST(MixedPrecisionMemory, DdpHoldsTwoPlusTwoPlusTwelveBytesPerParameter) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig c = config(DType::bf16);
  const int64_t C = c.n_embd, L = c.n_layer;
  const int64_t psi = c.vocab_size * C + c.block_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  for (const std::string grads : {"bf16", "f32"}) {
    const MpCase mp{"ddp2", {.dp_replicate = 2}, "bf16", grads};
    const nn::TokenStream data = parity_tokens();
    launch(
        2,
        [&](RankContext& ctx) {
          MemoryLedger& ledger = MemoryLedger::instance();
          auto now = [&](MemoryCategory cat) { return ledger.current(ctx.device, cat); };
          const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads),
                        o0 = now(MemoryCategory::optimizer);
          {
            std::unique_ptr<Trainer> trainer = make_trainer(ctx, mp);
            for (int s = 0; s < 2; ++s) trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
            EXPECT_EQ(now(MemoryCategory::weights) - w0, 2 * psi) << grads;
            EXPECT_EQ(now(MemoryCategory::grads) - g0, (grads == "bf16" ? 2 : 4) * psi) << grads;
            EXPECT_EQ(now(MemoryCategory::optimizer) - o0, 12 * psi) << grads;
          }
        },
        quick(30000));
  }
}

// The ZeRO paper's table (§3.1, K = 12) from Ψ and N, for the model states a rank holds between
// steps. Ψ = 7232 divides by 2 and 4 and each FSDP unit's count is even, so no bucket is padded at
// N = 2 and the formulas hold to the byte:
//   ZeRO-1  weights 2Ψ    gradients 2Ψ    optimizer 12Ψ/N (f32 master + two moments)   4Ψ + 12Ψ/N
//   ZeRO-2  weights 2Ψ    gradients 2Ψ/N  optimizer 12Ψ/N                              2Ψ + 14Ψ/N
//   ZeRO-3  weights 2Ψ/N  gradients 2Ψ/N  optimizer 12Ψ/N                              16Ψ/N
//   offload: the optimizer's 12Ψ/N lives on the host ("offload") with the f32 gradient the update
//   reads there (ZeRO-2: 4Ψ/N; FSDP's CPUOffload also keeps its 2+2 bytes of shards there).
TEST(MixedPrecisionMemory, ShardedStrategiesHoldThePapersBytes) {
  SL_SKIP_UNLESS_WORLD(2);
  const nn::GPTConfig c = config(DType::bf16);
  const int64_t C = c.n_embd, L = c.n_layer, N = 2;
  const int64_t psi = c.vocab_size * C + c.block_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  ASSERT_EQ(psi % N, 0);
  struct Expected {
    MpCase mp;
    int64_t weights, grads, optimizer, offload;
  };
  const ScheduleKind f1b = ScheduleKind::one_f_one_b;
  const std::vector<Expected> cases = {
      {{"zero1", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero1}, 2 * psi, 2 * psi, 12 * psi / N, 0},
      {{"zero1_main_grad", {.dp_shard = 2}, "bf16", "f32", 1, false, f1b, DpStrategy::zero1},
       2 * psi,
       4 * psi,
       12 * psi / N,
       0},
      {{"zero2", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2}, 2 * psi, 2 * psi / N, 12 * psi / N, 0},
      {{"zero3", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp},
       2 * psi / N,
       2 * psi / N,
       12 * psi / N,
       0},
      {{"zero2_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::zero2, true},
       2 * psi,
       2 * psi / N,
       0,
       (12 + 4) * psi / N},
      {{"zero3_offload", {.dp_shard = 2}, "bf16", "", 1, false, f1b, DpStrategy::fsdp, true},
       0,
       0,
       0,
       (2 + 2 + 12) * psi / N},
  };
  const nn::TokenStream data = parity_tokens();
  for (const Expected& e : cases) {
    launch(
        2,
        [&](RankContext& ctx) {
          MemoryLedger& ledger = MemoryLedger::instance();
          auto now = [&](MemoryCategory cat) { return ledger.current(ctx.device, cat); };
          const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads),
                        o0 = now(MemoryCategory::optimizer), h0 = now(MemoryCategory::offload);
          std::unique_ptr<Trainer> trainer = make_trainer(ctx, e.mp);
          for (int s = 0; s < 2; ++s) trainer->train_step(data, s, kBatch, kT, parity_adamw().lr, kClip);
          EXPECT_EQ(now(MemoryCategory::weights) - w0, e.weights) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::grads) - g0, e.grads) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::optimizer) - o0, e.optimizer) << e.mp.name;
          EXPECT_EQ(now(MemoryCategory::offload) - h0, e.offload) << e.mp.name;
        },
        quick(30000));
  }
}

// ZeroAdamW on 16-bit parameters keeps nn::AdamW's rule (no update without an f32 master copy), and
// ZeRO-1 with 16-bit gradients, which averages in place, refuses a second reduce before zero_grad():
// adding a backward's sum to an average would silently weigh the two windows differently.
TEST(MixedPrecisionZero, SixteenBitRulesAreSaidNotBroken) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        {
          nn::GPT model(config(DType::bf16), kSeed);
          expect_error([&] { ZeroAdamW zero(model.parameters(), ctx.world, {.stage = 1}); },
                       "set AdamWOptions::master_weights");
        }
        nn::GPT model(config(DType::bf16), kSeed);
        ZeroAdamW zero(model.parameters(), ctx.world, {.stage = 1, .adamw = {.master_weights = true}});
        const nn::Batch batch = parity_tokens().get_batch(0, 2, kT);
        zero.zero_grad();
        model.loss(batch.inputs, batch.targets).backward();
        zero.reduce_gradients();
        model.loss(batch.inputs, batch.targets).backward();
        expect_error([&] { zero.reduce_gradients(); }, "a backward after it needs zero_grad() first");
        zero.zero_grad();  // a new window reduces again
        model.loss(batch.inputs, batch.targets).backward();
        EXPECT_NO_THROW(zero.step());
      },
      quick(10000));
}

TEST(MixedPrecisionPlan, TheNaiveDataParallelIsRefusedNamingWhy) {
  TrainPlan plan = TrainPlan::data_parallel(2);
  plan.dp_strategy = DpStrategy::naive;
  plan.precision = nn::MixedPrecision::parse("bf16");
  expect_error([&] { plan.validate(2); }, "the naive DataParallel keeps f32");
  for (DpStrategy dp : {DpStrategy::zero1, DpStrategy::zero2, DpStrategy::fsdp}) {
    plan = TrainPlan::data_parallel(2, 1);
    plan.dp_strategy = dp;
    plan.precision = nn::MixedPrecision::parse("bf16");
    EXPECT_NO_THROW(plan.validate(2));
  }
}

TEST(MixedPrecisionPlan, AModelOfAnotherDtypeIsRefused) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        TrainPlan plan = TrainPlan::data_parallel(2);
        plan.precision = nn::MixedPrecision::parse("bf16");
        expect_error(
            [&] {
              Trainer trainer(ctx, plan,
                              parallelize(config(DType::f32), kSeed, ctx.world, plan.parallelize_options(parity_adamw())));
            },
                     "build the model with GPTConfig::param_dtype bf16");
      },
      quick(10000));
}

}  // namespace
}  // namespace sl::parallel
