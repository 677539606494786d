// Lesson 04 — one device first: mixed precision and activation recomputation.
//
// What you will learn
//   * mixed precision does not shrink the model states: bf16 weights 2Ψ + bf16 gradients 2Ψ + AdamW's
//     f32 master copy and two f32 moments 12Ψ = 16Ψ, the same total as f32's 4 + 4 + 8 (the ZeRO
//     paper's "K = 12"); Megatron accumulates gradients in f32 (main_grad): 2 + 4 + 12. What 16 bits
//     halve is the activations. All measured by the ledger against the formulas in Ψ.
//   * the two 16-bit formats on the page: f32 -> bf16 and f32 -> fp16 by bit manipulation, rounding to
//     nearest even, checked bit for bit against the library on 400k values. fp16 tops out at 65504 (70000
//     becomes inf) and flushes small gradients to zero; bf16 has f32's range but 8 significant bits.
//   * dynamic loss scaling (PyTorch's GradScaler) in ten lines, checked step by step against
//     nn::GradScaler, and the fp16 gradients of a GPT it saves from flushing to zero
//   * recomputation, memory against time, measured on one GPT step: full costs about one more forward
//   * Korthikanti et al.'s activations per layer from the ledger, and why the blockwise (FlashAttention)
//     core leaves selective recomputation almost nothing to save
//
// Run:    make lesson N=04   (a few seconds)
// Prints: 1 model states per recipe; 2 the formats, by hand vs the library; 3 loss scaling, by hand
//         vs nn::GradScaler; 4 recomputation's memory and time; 5 bytes per layer vs Korthikanti;
//         then "lesson 04: OK".
// Try:    build/lessons/04_memory --n-layer 3 --n-embd 64 --batch 8 --svg /tmp/svg_04
//         build/lessons/04_memory --break-no-unscale   (loss scaling without dividing the scale back out)
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "lesson_args.h"
#include "lesson_svg.h"
#include "nn/addition.h"
#include "nn/gpt.h"
#include "nn/grad_scaler.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"

using namespace sl;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static double kib(double bytes) { return bytes / 1024; }

// f32 -> bf16: keep the top 16 bits (sign, the same 8 exponent bits, 7 of the 23 mantissa bits) and
// round on the 16 dropped: above half up, below down, exactly half to the even neighbour. A carry out
// of the mantissa lands in the exponent, which is right (1.1111111b rounds up to 2; the top to inf).
static uint16_t bf16_by_hand(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  const uint32_t kept = u >> 16, dropped = u & 0xffffu;
  return static_cast<uint16_t>(kept + (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u))));
}

// f32 -> fp16 (1 sign, 5 exponent bits biased by 15, 10 mantissa bits). The significand 1.m has 24
// bits; a normal fp16 keeps its top 11 (the implicit 1 and 10 more), so 13 are dropped. Below 2^-14
// fp16 is subnormal: steps of 2^-24, one more bit dropped per binade down, until nothing is left.
static uint16_t fp16_by_hand(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f), sign = (u >> 16) & 0x8000u;
  const int exponent = static_cast<int>((u >> 23) & 0xff) - 127;
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (exponent > 15) return static_cast<uint16_t>(sign | 0x7c00u);                    // >= 2^16: inf
  const int shift = exponent >= -14 ? 13 : 13 + (-14 - exponent);
  if (shift > 24) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: 0
  const uint32_t significand = (u & 0x7fffffu) | 0x800000u, half = 1u << (shift - 1);
  uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1);
  kept += dropped > half || (dropped == half && (kept & 1u));
  // kept carries the implicit 1 at bit 10 (one more in the exponent field), so a normal number is
  // ((exponent + 14) << 10) + kept; a subnormal's exponent field is 0. A carry may reach inf.
  const uint32_t bits = exponent >= -14 ? (static_cast<uint32_t>(exponent + 14) << 10) + kept : kept;
  return static_cast<uint16_t>(sign | std::min(bits, 0x7c00u));
}
static float bf16_value(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
static float fp16_value(uint16_t bits) {
  f16 h;
  h.bits = bits;
  return h;
}

// PyTorch's GradScaler on the page: multiply the loss by `scale`; after backward, if any gradient is
// inf or NaN skip the step and halve the scale, else step, and double the scale after `interval`
// clean steps in a row. Returns whether the optimizer steps.
struct HandScaler {
  double scale = 65536.0;  // 2^16
  int64_t interval = 2000, clean = 0;
  bool update(bool found_inf) {
    if (found_inf) {
      scale *= 0.5, clean = 0;
      return false;  // the weights and the optimizer state stay as they were
    }
    if (++clean == interval) scale *= 2.0, clean = 0;
    return true;
  }
};

struct States {
  int64_t weights, grads, optimizer, activations;
};

// One training step of the GPT in `param` with gradients in `grad` and AdamW's master weights; the
// bytes each category holds afterwards, and the activations the forward kept.
static States train_step_states(const nn::GPTConfig& base, DType param, DType grad, const nn::Batch& batch) {
  const Device device = current_device();
  MemoryLedger& ledger = MemoryLedger::instance();
  auto now = [&](MemoryCategory c) { return ledger.current(device, c); };
  const int64_t w0 = now(MemoryCategory::weights), g0 = now(MemoryCategory::grads), o0 = now(MemoryCategory::optimizer),
                a0 = now(MemoryCategory::activations);
  nn::GPTConfig config = base;
  config.param_dtype = param;
  nn::GPT model(config, 1);
  nn::AdamW optimizer(model.parameters(), {.master_weights = true});
  nn::zero_grads(model.parameters(), {.param_dtype = param, .grad_dtype = grad});
  Tensor loss = model.loss(batch.inputs, batch.targets);
  const int64_t activations = now(MemoryCategory::activations) - a0;
  loss.backward();
  optimizer.step();
  return {now(MemoryCategory::weights) - w0, now(MemoryCategory::grads) - g0, now(MemoryCategory::optimizer) - o0,
          activations};
}

// The gradients of one backward of `loss_scale` x loss, unscaled by nn::GradScaler, as f32 vectors.
// The loss is divided by 2^10 first, as a batch of 1024 times the tokens divides every gradient (its
// mean runs over them all): the small gradients of a real run, from a small model.
static std::vector<std::vector<double>> gradients(const nn::GPTConfig& base, DType param, double loss_scale,
                                                  const nn::Batch& batch, bool* found_inf) {
  nn::GPTConfig config = base;
  config.param_dtype = param;
  nn::GPT model(config, 1);
  nn::zero_grads(model.parameters(), {.param_dtype = param, .grad_dtype = DType::f32});  // fp16: f32 grads
  mul(model.loss(batch.inputs, batch.targets), std::ldexp(loss_scale, -10)).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
  *found_inf = nn::GradScaler({.init_scale = loss_scale}).unscale(grads);
  std::vector<std::vector<double>> out;
  for (const Tensor& g : grads) out.push_back(g.to_vector());
  return out;
}

struct StepCost {
  int64_t activation_peak = 0;
  double forward_ms = 1e30, step_ms = 1e30;  // the fastest seen: load only ever slows a run down
};

// This thread's CPU time: what the step computed, not the time other jobs on the machine took from it.
static double cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) * 1e-6;
}

// One forward and backward of `model`: the activations' peak above what was held before, and the
// CPU times of the forward and of the whole step.
static void time_step(nn::GPT& model, const nn::Batch& batch, StepCost& cost) {
  MemoryLedger& ledger = MemoryLedger::instance();
  const Device device = current_device();
  model.zero_grad();
  ledger.reset_peak(device);
  const int64_t before = ledger.current(device, MemoryCategory::activations);
  const double start = cpu_ms();
  Tensor loss = model.loss(batch.inputs, batch.targets);
  cost.forward_ms = std::min(cost.forward_ms, cpu_ms() - start);
  loss.backward();
  cost.step_ms = std::min(cost.step_ms, cpu_ms() - start);
  cost.activation_peak = ledger.peak(device, MemoryCategory::activations) - before;
}

// The reference attention core, eager: the [T, T] probabilities are made, dropped out and kept for
// backward. q, k, v [B, NH, T, HS] -> [B, NH, T, HS].
static Tensor eager_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p) {
  Tensor probabilities = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(double(q.size(3))));
  return matmul(dropout(probabilities, dropout_p), v);
}

// The activation bytes one layer keeps from forward to backward: the held activations of a
// 2-layer model after forward, less a 1-layer model's.
static int64_t layer_bytes(nn::GPTConfig config, nn::Recompute recompute, bool eager, const nn::Batch& batch) {
  auto held = [&](int64_t layers) {
    config.n_layer = layers;
    config.recompute = recompute;
    nn::GPT model(config, 1);
    const double p = config.dropout;
    for (int64_t l = 0; eager && l < layers; ++l)
      model.block(l).attn->core = [p](const Tensor& q, const Tensor& k, const Tensor& v) {
        return eager_attention(q, k, v, p);
      };
    const Device device = current_device();
    const int64_t before = MemoryLedger::instance().current(device, MemoryCategory::activations);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    return MemoryLedger::instance().current(device, MemoryCategory::activations) - before;
  };
  return held(2) - held(1);
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "04_memory", "one device: mixed precision, loss scaling, recomputation");
  const int64_t n_layer = args.integer("n-layer", 2, "layers of the GPT in sections 1 and 3", 1, 4);
  const int64_t n_embd = args.integer("n-embd", 128, "n_embd C of the GPT (a multiple of NH = 4)", 32, 192);
  const int64_t batch_rows = args.integer("batch", 16, "rows B of the batch in sections 1 and 3", 4, 32);
  const int64_t growth_interval = args.integer("growth-interval", 3, "clean steps before the loss scale doubles", 1, 6);
  const bool no_unscale = args.breaks("no-unscale", "scale the loss by 2^16 and never divide the gradient back");
  const std::string svg_dir = args.svg();
  args.done();
  if (n_embd % 4 != 0) {
    std::fprintf(stderr, "04_memory: --n-embd %lld is not a multiple of the 4 heads\n", (long long)n_embd);
    return 2;
  }
  std::printf("values: n-layer %lld, n-embd %lld, batch %lld, growth-interval %lld%s\n", (long long)n_layer,
              (long long)n_embd, (long long)batch_rows, (long long)growth_interval,
              no_unscale ? ", BROKEN: no-unscale" : "");
  bool ok = true;
  auto check = [&](bool condition, const std::string& what) {
    std::printf("  check: %-72s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  };
  const Device gpu = Device::cpu(4);  // a clean account: everything here lives on virtual device cpu:4
  DeviceGuard on(gpu);
  nn::AdditionTask task;
  const nn::TokenStream stream = task.train_stream(20000, 1);
  const nn::GPTConfig config{.vocab_size = 256, .block_size = 32, .n_layer = n_layer, .n_head = 4, .n_embd = n_embd};
  const nn::Batch batch = stream.get_batch(0, batch_rows, 32);

  section("1. Model states: what mixed precision keeps, per parameter");
  {
    const int64_t psi = nn::GPT(config, 1).num_parameters();
    std::printf("  GPT of %lld layers, n_embd %lld: Ψ = %lld parameters; AdamW with master weights\n",
                (long long)config.n_layer, (long long)config.n_embd, (long long)psi);
    std::printf("  %-30s %8s %8s %10s %8s  %-10s %s\n", "recipe (weights, grads)", "weights", "grads", "optimizer",
                "total", "formula", "activations");
    struct Recipe {
      const char* name;
      DType param, grad;
      int64_t w, g, o;  // bytes per parameter, the formula
    };
    const Recipe recipes[] = {{"f32", DType::f32, DType::f32, 4, 4, 8},
                              {"bf16, bf16 (ZeRO's 2 + 2 + 12)", DType::bf16, DType::bf16, 2, 2, 12},
                              {"bf16, f32 (Megatron main_grad)", DType::bf16, DType::f32, 2, 4, 12},
                              {"fp16, f32 (fp16's only way)", DType::f16, DType::f32, 2, 4, 12}};
    std::vector<int64_t> activations;  // per recipe, kept by one forward
    lesson::BarChart states_chart("model states per recipe, Ψ = " + std::to_string(psi) + " (mark: the formula)", "KiB");
    for (const Recipe& r : recipes) {
      const States s = train_step_states(config, r.param, r.grad, batch);
      const double per = static_cast<double>(psi);
      std::printf("  %-30s %7.2fΨ %7.2fΨ %9.2fΨ %7.2fΨ  %lld+%lld+%-6lld %7.1f KiB\n", r.name, s.weights / per,
                  s.grads / per, s.optimizer / per, (s.weights + s.grads + s.optimizer) / per, (long long)r.w,
                  (long long)r.g, (long long)r.o, kib(s.activations));
      check(s.weights == r.w * psi && s.grads == r.g * psi && s.optimizer == r.o * psi,
            std::string(r.name) + ": ledger == formula");
      activations.push_back(s.activations);
      states_chart.bar(r.name, kib(s.weights + s.grads + s.optimizer), kib((r.w + r.g + r.o) * psi));
      states_chart.bar(std::string("  its activations"), kib(s.activations), -1, "#f58518");
    }
    lesson::write_picture(svg_dir, "04_model_states.svg", states_chart.svg());
    const double ratio = static_cast<double>(activations[1]) / activations[0];  // bf16 / f32
    std::printf(
        "  The 16 bytes stay 16: 16-bit weights and gradients save 4Ψ, the f32 master copy costs 4Ψ back\n"
        "  (ZeRO's K = 12 is master 4 + moments 8). Megatron's f32 main_grad adds 2Ψ for exact accumulation.\n"
        "  What 16 bits halve are the activations: bf16 keeps %.2fx f32's (LayerNorm's statistics stay f32).\n",
        ratio);
    check(ratio > 0.5 && ratio <= 0.55, "bf16 activations are at most 0.55x f32's");
  }

  section("2. fp16 and bf16 on the page");
  {
    std::printf("  %-5s %-24s %12s %15s %18s %12s\n", "", "sign | exponent | mantissa", "largest", "smallest normal",
                "smallest subnormal", "1 ulp at 1");
    std::printf("  %-5s %-24s %12.6g %15.4g %18.4g %12.4g\n", "f32", "1 | 8 | 23", 3.4028235e38, 1.1754944e-38,
                1.4012985e-45, std::ldexp(1.0, -23));
    std::printf("  %-5s %-24s %12.6g %15.4g %18.4g %12.4g\n", "bf16", "1 | 8 | 7", bf16_value(0x7f7f),
                bf16_value(0x0080), bf16_value(0x0001), bf16_value(0x3f81) - 1.0);
    std::printf("  %-5s %-24s %12.6g %15.4g %18.4g %12.4g\n", "fp16", "1 | 5 | 10", fp16_value(0x7bff),
                fp16_value(0x0400), fp16_value(0x0001), fp16_value(0x3c01) - 1.0);
    check(fp16_value(0x7bff) == 65504.0f && fp16_value(0x0400) == std::ldexp(1.0f, -14) &&
              bf16_value(0x0080) == std::ldexp(1.0f, -126),
          "fp16's range (2 - 2^-10)·2^15 .. 2^-14, bf16's down to f32's 2^-126");
    struct Example {
      float value;
      const char* what;
    };
    const Example examples[] = {{70000.0f, "70000"},
                                {65504.0f, "65504, fp16's largest"},
                                {1.0f + std::ldexp(1.0f, -8), "1 + 2^-8, a tie: down"},
                                {1.0f + 3 * std::ldexp(1.0f, -8), "1 + 3 x 2^-8, a tie: up"},
                                {1e-5f, "1e-5, fp16 subnormal"},
                                {1e-8f, "1e-8, a smaller one"}};
    std::printf("  %-26s %-24s %s\n", "f32", "fp16 (by hand)", "bf16 (by hand)");
    for (const Example& x : examples) {
      const uint16_t h = fp16_by_hand(x.value), b = bf16_by_hand(x.value);
      std::printf("  %-26s 0x%04x = %-14.8g 0x%04x = %.8g\n", x.what, h, fp16_value(h), b, bf16_value(b));
    }
    check(std::isinf(fp16_value(fp16_by_hand(70000.0f))) && bf16_value(bf16_by_hand(70000.0f)) == 70144.0f,
          "70000 overflows fp16 to inf; bf16 holds it as 70144 (8 significant bits)");
    check(bf16_value(bf16_by_hand(1.0f + std::ldexp(1.0f, -8))) == 1.0f && fp16_value(fp16_by_hand(1e-8f)) == 0.0f,
          "bf16 rounds 1 + 2^-8 to 1 (ties to even); fp16 flushes 1e-8 to 0");
    // The hand conversions against the library's (Tensor::to) on 400k values: random bit patterns of
    // every exponent, and values with exactly half an ulp dropped (the ties) at every bit position.
    const int64_t n = 400000;
    Tensor values = Tensor::empty(Shape({n}), DType::f32);
    float* v = values.data<float>();
    uint64_t state = 12345;
    auto next = [&] {
      return static_cast<uint32_t>((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 32);
    };
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u = next();
      if (i % 2) {  // a tie: bits below position k cleared, bit k-1 set, with an exponent near fp16's range
        const uint32_t k = 1 + next() % 23, exponent = 97 + next() % 48;
        u = (u & 0x80000000u) | (exponent << 23) | (((u & 0x7fffffu) >> k << k) | (1u << (k - 1)));
      }
      v[i] = std::bit_cast<float>(u);
    }
    const Tensor as_bf16 = values.to(DType::bf16), as_fp16 = values.to(DType::f16);
    int64_t bf16_wrong = 0, fp16_wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      bf16_wrong += as_bf16.data<bf16>()[i].bits != bf16_by_hand(v[i]);
      fp16_wrong += as_fp16.data<f16>()[i].bits != fp16_by_hand(v[i]);
    }
    std::printf("  %lld values through Tensor::to: %lld bf16 and %lld fp16 results differ from the hand ones\n",
                (long long)n, (long long)bf16_wrong, (long long)fp16_wrong);
    check(bf16_wrong == 0 && fp16_wrong == 0, "hand f32 -> bf16 and f32 -> fp16 == the library's, bit for bit");
  }

  section("3. Loss scaling: shift the gradients into fp16's range, and back");
  {
    const float g = 1e-8f, scale = 65536.0f;  // a gradient of 1e-8, and GradScaler's first scale 2^16
    const float scaled = fp16_value(fp16_by_hand(g * scale));
    // The mistake (--break-no-unscale): the optimizer gets the scaled gradient, 2^16 times too large.
    const float unscaled = no_unscale ? scaled : scaled / scale;
    std::printf("  fp16(%g) = %g: flushed.   fp16(%g x 2^16) = %.6g, unscaled in f32: %.6g\n", g,
                fp16_value(fp16_by_hand(g)), g, scaled, unscaled);
    check(fp16_value(fp16_by_hand(g)) == 0 && std::abs(unscaled - g) < 1e-3 * g,
          "scaled by 2^16, a 1e-8 gradient survives fp16 within 0.1%");
    // The rule, by hand and by nn::GradScaler, over a run of found-inf flags (growth after 3 clean steps).
    HandScaler hand{.interval = growth_interval};
    nn::GradScaler library({.growth_interval = growth_interval});
    const bool overflows[] = {false, false, false, true, false, false, false, false, true, true, false, false, false};
    std::printf("  step  found inf  hand: steps? scale     nn::GradScaler: scale  skipped\n");
    bool same = true;
    for (int step = 0; step < 13; ++step) {
      const bool steps = hand.update(overflows[step]);
      library.update(overflows[step]);
      std::printf("  %4d  %-9s  %-12s %-9g %22g %8lld\n", step, overflows[step] ? "yes" : "no", steps ? "step" : "skip",
                  hand.scale, library.scale(), (long long)library.skipped_steps());
      same = same && hand.scale == library.scale();
    }
    check(same && library.skipped_steps() == 3, "the hand scaler == nn::GradScaler at every step (3 skipped)");
    // The same GPT in f32 and in fp16 (drawn from one seed), one backward each: in fp16 the gradients
    // flowing between ops are 16-bit, and the small ones flush, unless the loss is scaled.
    bool inf_f32 = false, inf_plain = false, inf_scaled = false;
    const auto exact = gradients(config, DType::f32, 1.0, batch, &inf_f32);
    const auto plain = gradients(config, DType::f16, 1.0, batch, &inf_plain);
    const auto scaled_grads = gradients(config, DType::f16, 65536.0, batch, &inf_scaled);
    // Two measures against f32: gradients that came out exactly 0, and the relative error of all of them.
    auto compare = [&](const std::vector<std::vector<double>>& grads, int64_t* flushed) {
      double error = 0, norm = 0;
      for (size_t t = 0; t < exact.size(); ++t)
        for (size_t i = 0; i < exact[t].size(); ++i) {
          *flushed += exact[t][i] != 0 && grads[t][i] == 0;
          error += (grads[t][i] - exact[t][i]) * (grads[t][i] - exact[t][i]), norm += exact[t][i] * exact[t][i];
        }
      return std::sqrt(error / norm);
    };
    int64_t flushed_plain = 0, flushed_scaled = 0, gradient_count = 0;
    for (const auto& t : exact) gradient_count += static_cast<int64_t>(t.size());
    const double error_plain = compare(plain, &flushed_plain), error_scaled = compare(scaled_grads, &flushed_scaled);
    std::printf(
        "  The GPT in fp16, one backward of its loss / 2^10 (the gradients of a 1024x larger batch), against\n"
        "  the f32 model's (%lld gradients, f32 accumulation in both):\n"
        "    loss as it is   %6lld gradients flushed to 0, relative error %.2e\n"
        "    loss x 2^16     %6lld gradients flushed to 0, relative error %.2e\n",
        (long long)gradient_count, (long long)flushed_plain, error_plain, (long long)flushed_scaled, error_scaled);
    check(!inf_scaled && flushed_scaled < flushed_plain && error_scaled * 4 < error_plain,
          "scaled, fp16's gradients flush less and land 4x closer to f32's");
  }

  section("4. Recomputation: activation memory against time, one GPT step");
  {
    nn::GPTConfig big = config;
    big.n_layer = 4, big.block_size = 128;
    const nn::Batch rows = stream.get_batch(1, 8, 128);
    std::printf("  %lld layers, B 8, T 128, n_embd %lld; the three take turns, 7 steps each, fastest CPU time kept\n",
                (long long)big.n_layer, (long long)big.n_embd);
    std::vector<std::unique_ptr<nn::GPT>> models;
    for (nn::Recompute mode : {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full}) {
      big.recompute = mode;
      models.push_back(std::make_unique<nn::GPT>(big, 1));
    }
    std::vector<StepCost> costs(3);
    for (int round = 0; round < 7; ++round)
      for (int m = 0; m < 3; ++m) time_step(*models[m], rows, costs[m]);
    std::printf("  %-10s %18s %12s %12s %20s\n", "recompute", "activation peak", "forward", "step",
                "extra / none's fwd");
    for (int m = 0; m < 3; ++m)
      std::printf("  %-10s %14.1f KiB %9.1f ms %9.1f ms %20.2f\n", nn::recompute_name(models[m]->config().recompute),
                  kib(costs[m].activation_peak), costs[m].forward_ms, costs[m].step_ms,
                  (costs[m].step_ms - costs[0].step_ms) / costs[0].forward_ms);
    auto grads = [&](int m) {
      std::vector<double> all;
      for (const Tensor& p : models[m]->parameters())
        for (double g : p.grad().to_vector()) all.push_back(g);
      return all;
    };
    std::printf(
        "  full keeps each block's input and reruns the block in backward: about one more forward (less the\n"
        "  embedding, the head and the loss, which it does not rerun). selective reruns the attention core.\n");
    check(grads(1) == grads(0) && grads(2) == grads(0),
          "selective and full give bitwise the gradients of keeping everything");
    check(costs[2].activation_peak * 2 < costs[0].activation_peak, "full recomputation halves the activation peak");
    const double extra = (costs[2].step_ms - costs[0].step_ms) / costs[0].forward_ms;
    check(extra > 0.4 && extra < 1.6, "full pays for it with about one more forward (0.4 to 1.6 of none's)");
  }

  section("5. Bytes per layer, from the ledger, vs Korthikanti et al. 2022 (Table 2)");
  {
    std::printf(
        "  s = T, b = B, h = C, a = NH. The paper counts 2-byte activations, 1-byte dropout masks:\n"
        "    none sbh(34 + 5as/h)     selective 34sbh     full 2sbh\n"
        "  shardlab keeps the same 16 sbh elements and one sbh mask (one dropout, before attn.c_proj, not two),\n"
        "  e bytes each (4 in f32, 2 in bf16), and LayerNorm's mean and 1/std in f32 (16sb, the paper omits):\n"
        "    none 17e·sbh + 16sb + core     selective 17e·sbh + 16sb     full e·sbh\n"
        "  where the core keeps, besides its input q | k | v:\n"
        "    eager      the [s, s] probabilities, their mask, the dropped-out copy: 3e·as²b (the 5as/h term)\n"
        "    blockwise  its output and the rows' log-sum-exp (f32), e·sbh + 4asb: linear in s (FlashAttention)\n");
    std::printf("  %-5s %-9s %4s %11s %11s %11s   %s\n", "dtype", "core", "s", "none", "selective", "full",
                "none - selective");
    struct Row {
      DType dtype;
      bool eager;
      int64_t s;
    };
    const int64_t b = 2, h = 64, a = 4;
    std::vector<int64_t> savings;  // none - selective, per row
    bool all_match = true;
    for (const Row& row : {Row{DType::f32, true, 64}, Row{DType::f32, true, 128}, Row{DType::f32, false, 64},
                           Row{DType::f32, false, 128}, Row{DType::bf16, true, 128}, Row{DType::bf16, false, 128}}) {
      const int64_t s = row.s, e = static_cast<int64_t>(dtype_size(row.dtype)), sbh = s * b * h, asb = a * s * b;
      nn::GPTConfig layer{.vocab_size = 256, .block_size = s, .n_head = a, .n_embd = h, .dropout = 0.1};
      layer.param_dtype = row.dtype;
      const nn::Batch tokens = stream.get_batch(2, b, s);
      // The blockwise kernel runs f32, bf16 and fp16 on the CPU (16-bit: computed in f32, out rounded
      // to 16 bits, lse kept in f32); CUDA still falls back to the eager composition.
      const int64_t core = row.eager ? 3 * e * asb * s : e * sbh + 4 * asb;
      const int64_t formula[] = {17 * e * sbh + 16 * s * b + core, 17 * e * sbh + 16 * s * b, e * sbh};
      int64_t measured[3];
      for (int m = 0; m < 3; ++m) {
        measured[m] = layer_bytes(layer, static_cast<nn::Recompute>(m), row.eager, tokens);
        all_match = all_match && measured[m] == formula[m];
      }
      savings.push_back(measured[0] - measured[1]);
      std::printf("  %-5s %-9s %4lld %11lld %11lld %11lld   %lld (%.0f%% of none)\n", dtype_name(row.dtype),
                  row.eager ? "eager" : "blockwise",
                  (long long)s, (long long)measured[0], (long long)measured[1], (long long)measured[2],
                  (long long)savings.back(), 100.0 * savings.back() / measured[0]);
    }
    check(all_match, "every measured byte count == its formula (f32 and bf16, both cores, 3 modes)");
    check(savings[1] == 4 * savings[0] && savings[3] == 2 * savings[2] && savings[4] * 2 == savings[1],
          "selective saves T² bytes with the eager core (x4 at 2T, half in bf16), T with the blockwise (x2)");
    check(savings[5] < savings[4] / 10, "bf16, blockwise: no T² term either (selective saves under a tenth of eager's)");
    std::printf(
        "  Selective recomputation was made to drop the 5as/h term: for GPT-3 (a 96, s 2048, h 12288) that is\n"
        "  80 sbh against 34, most of a layer, for a rerun of attention's few FLOPs. The blockwise core never\n"
        "  keeps it (its backward recomputes the probabilities from lse anyway), so selective is left with\n"
        "  out and lse to drop, the 6%% above, for a second attention forward. bf16 runs the same kernel on\n"
        "  16-bit q, k, v (widened to f32 a head at a time, out rounded once to bf16, lse kept in f32), so\n"
        "  the T² term is gone there too; bf16's 17e = 34 is the paper's 34 sbh: one 2-byte mask weighs\n"
        "  what the paper's two 1-byte masks do.\n");
  }

  std::printf("\nlesson 04: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
