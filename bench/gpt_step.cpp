// gpt_step — the time of one training step of the tiny GPT (zero_grad, forward, loss, backward,
// AdamW step), 1 thread by default: the median and the minimum over 20 steps after 5 warm-up
// steps (on a shared, noisy machine the minimum is the least disturbed step).
//
//   build/bench/gpt_step [--config A|B] [--seq-len T] [--threads N] [--steps 20] [--warmup 5] [--profile]
//                        [--mixed-precision no|bf16|fp16] [--recompute none|selective|full] [--rounds 2]
//                        [--device cpu|cuda] [--peak-tflops P] [--quick]
//
// --seq-len T runs the config's model at sequence length T (block_size T) with batch B·T0/T (at
// least 1), the same tokens per step as the config: only attention's share grows, as T. PyTorch's
// side: bench/gpt_torch_seq.py --config B --seq-len T.
// --mixed-precision and --recompute run train's step (nn/mixed_precision.h: 16-bit weights and
// activations, f32 master weights in AdamW, fp16's loss scaling; nn/gpt.h: Recompute) against the
// f32 step without recomputation in the same sitting, alternating them for --rounds rounds, and
// print a "versus" line: the step's ratio to f32's, the activation peak's (the ledger's
// activations, highest over the steps), and for recomputation its extra time against the formula's:
// one more forward for full (the forward, loss included, timed in the step itself), the attention
// core's forward of every layer for selective (timed alone).
// --device cuda runs the same step on cuda:0 (the batch drawn on the host and copied, outside the
// timed step); every timed interval ends with a device synchronize, so it is the GPU's work, not its
// launches; the activation peak is the ledger's on cuda:0. The JSON lines then carry "device": "cuda:0".
// Without a GPU it exits 1: "gpt_step: no CUDA device: ...".
// --help lists the flags; a bad flag or value is one line naming it, and exit code 2.
// --quick: config A alone, 2 steps after 1 warm-up (about a second; flags given beside it still
// apply). In every mode the output is checked (bench/bench_check.h), exiting 1 on a failure: one
// line per config and variant (and the "versus" line when there is one), --steps x rounds timed
// steps each, times finite and positive with the fastest step no slower than the median and its
// fastest forward faster than it (a step's forward is part of it), an activation peak above zero,
// and the versus line's ratios finite.
// Every line carries the model's FLOPs per step and their rate over the median step (bench/model_flops.h:
// 6N + 6·L·C·T per token) and, on a GPU whose dense peak is known (or with --peak-tflops), MFU.
// --config gpt2 runs GPT-2 small (V 50,257, T 1024, B 8), the shape MFU is usually quoted at.
// Prints one JSON line per config and variant, e.g. {"bench": "gpt_step", "config": "A", "T": 64, "batch": 16,
// "threads": 1, "median_ms": ..., "min_ms": ...}. Compare in one run with ../shared/bench/gpt_torch.py (same
// shapes; see docs/results.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/profiler.h"
#include "bench/bench_check.h"
#include "bench/model_flops.h"
#include "nn/gpt.h"
#include "nn/mixed_precision.h"
#include "nn/optim.h"
#include "tensor/attention.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda_info.h"
#include "tensor/cpu/convert.h"
#include "tensor/ledger.h"

using namespace sl;
using Clock = std::chrono::steady_clock;

struct BenchConfig {
  const char* name;
  nn::GPTConfig model;
  int64_t batch;
  bool on_request = false;  // runs only when --config names it (too large for the default sweep)
};

// One way of running the step: its precision (train's --mixed-precision) and recomputation.
struct Variant {
  std::string precision_name;  // "no", "bf16", "fp16"
  nn::Recompute recompute = nn::Recompute::none;
  bool operator==(const Variant&) const = default;
};

struct StepTimes {
  std::vector<double> step_ms, forward_ms;  // every timed step, over all rounds
  int64_t activation_peak = 0;              // bytes, the most any step held at once
  int64_t params = 0;                       // the model's parameters (N of model_flops.h)
  double median_ms() const { return at_fraction(step_ms, 0.5); }
  double min_ms() const { return at_fraction(step_ms, 0.0); }
  double forward_min_ms() const { return at_fraction(forward_ms, 0.0); }
  static double at_fraction(std::vector<double> v, double f) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(f * static_cast<double>(v.size() - 1) + 0.5)];
  }
};

// On a GPU the kernels run after their launch returns: wait for them before reading the clock.
static double ms_since(Clock::time_point start) {
  if (current_device().is_cuda()) cuda::synchronize(current_device().index);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// `steps` timed steps after `warmup` of the variant, added to `times`.
static void run(const BenchConfig& bench, const Variant& variant, int steps, int warmup, bool profile,
                StepTimes& times) {
  const nn::MixedPrecision precision = nn::MixedPrecision::parse(variant.precision_name);
  nn::GPTConfig config = bench.model;
  config.param_dtype = precision.param_dtype;
  config.recompute = variant.recompute;
  nn::GPT model(config, /*seed=*/0);
  times.params = 0;
  for (const Tensor& p : model.parameters()) times.params += p.numel();
  nn::AdamWOptions options;
  options.master_weights = precision.enabled();
  nn::AdamW optimizer(model.parameters(), options);
  nn::GradScaler scaler(precision.loss_scale);
  MemoryLedger& ledger = MemoryLedger::instance();
  Generator data_gen(1);
  const int64_t B = bench.batch, T = config.block_size, V = config.vocab_size;
  static const std::string optimizer_name = "AdamW.step";
  for (int step = 0; step < warmup + steps; ++step) {
    Tensor inputs, targets;
    {
      ProfilerPause untimed;  // the batch is drawn outside the timed step, and outside the profile
      // Drawn on the host (the same tokens on every device), then moved to the step's device.
      Tensor tokens = cast(mul(rand({B, T + 1}, TensorOptions(DType::f32, Device::cpu()), &data_gen),
                               static_cast<double>(V)),
                           DType::i64)
                          .to(current_device());
      inputs = tokens.narrow(1, 0, T);
      targets = tokens.narrow(1, 1, T);
    }
    if (profile && step == warmup) Profiler::enable();
    const Device device = current_device();
    if (device.is_cuda()) cuda::synchronize(device.index);  // the batch's copy is not the step's
    ledger.reset_peak(device);
    const int64_t held = ledger.current(device, MemoryCategory::activations);
    const auto start = Clock::now();
    nn::zero_grads(model.parameters(), precision);
    Tensor loss = model.loss(inputs, targets);
    const double forward_ms = ms_since(start);
    (scaler.enabled() ? mul(loss, scaler.scale()) : loss).backward();
    bool found_inf = false;
    if (scaler.enabled()) {
      std::vector<Tensor> grads;
      for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
      found_inf = scaler.unscale(grads);
    }
    if (!found_inf) {
      ProfileScope scope_optimizer(optimizer_name, ProfilePhase::optimizer);
      optimizer.step();
    }
    scaler.update(found_inf);
    const double ms = ms_since(start);
    if (step < warmup) continue;
    times.step_ms.push_back(ms);
    times.forward_ms.push_back(forward_ms);
    times.activation_peak =
        std::max(times.activation_peak, ledger.peak(device, MemoryCategory::activations) - held);
  }
  if (profile) {
    std::printf("profile of config %s (%s, recompute %s) over %d steps (inclusive times):\n%s", bench.name,
                precision.str().c_str(), nn::recompute_name(variant.recompute), steps, Profiler::report().c_str());
    Profiler::disable();
    Profiler::reset();
  }
}

// What selective recomputation reruns: the attention core's forward in every layer, timed alone
// (no graph), the fastest of 5 runs.
static double attention_core_forward_ms(const BenchConfig& bench, const Variant& variant) {
  const DType dtype = nn::MixedPrecision::parse(variant.precision_name).param_dtype;
  const nn::GPTConfig& c = bench.model;
  Generator gen(2);
  Tensor qkv = rand({bench.batch, c.block_size, 3 * c.n_embd}, TensorOptions(DType::f32, Device::cpu()), &gen)
                   .to(current_device())
                   .to(dtype);
  NoGradGuard no_grad;
  double best = 1e300;
  for (int repeat = 0; repeat < 5; ++repeat) {
    const auto start = Clock::now();
    for (int64_t layer = 0; layer < c.n_layer; ++layer) causal_attention_packed(qkv, c.n_head);
    best = std::min(best, ms_since(start));
  }
  return best;
}

struct Options {
  std::string only;
  int threads = 1, steps = 20, warmup = 5, seq_len = 0, rounds = 2;
  bool profile = false;
  bool cuda = false;  // --device cuda
  double peak_tflops = 0;  // --peak-tflops: the device's dense peak for MFU (0: a known GPU's, or none)
  Variant variant{"no"};
};

// The flags over `o`'s defaults (--quick's, or the plain ones).
static Options parse_options(int argc, char** argv, const std::vector<BenchConfig>& configs, Options o) {
  std::vector<std::string> names;
  for (const BenchConfig& config : configs) names.push_back(config.name);
  std::string recompute = "none", device = "cpu";
  cli::Parser flags("gpt_step", "gpt_step: one GPT training step's time, per config, precision and recomputation");
  flags.choice("--config", o.only, names,
               "one config only (A: 4 layers, 128 wide; B: 6 layers, 256 wide; gpt2: GPT-2 small, only when named)");
  flags.integer("--seq-len", o.seq_len, 1, 65536, "another sequence length, the same tokens per step");
  flags.integer("--threads", o.threads, 1, 1024, "GEMM threads");
  flags.integer("--steps", o.steps, 1, 1000000, "timed steps per round (the median needs one)");
  flags.integer("--warmup", o.warmup, 0, 1000000, "untimed steps before them");
  flags.integer("--rounds", o.rounds, 1, 1000, "rounds of the variants, interleaved");
  flags.choice("--mixed-precision", o.variant.precision_name, {"no", "bf16", "fp16"}, "the variant's precision");
  flags.choice("--recompute", recompute, {"none", "selective", "full"}, "the variant's activation recomputation");
  flags.choice("--device", device, {"cpu", "cuda"}, "where the steps run");
  flags.flag("--profile", o.profile, "time per op kind");
  flags.real("--peak-tflops", o.peak_tflops, cli::number_at_least(0), ">= 0",
             "the device's dense peak in TFLOP/s for MFU (0: a known GPU's data sheet)");
  bench::parse_flags(flags, argc, argv);
  o.variant.recompute = nn::parse_recompute(recompute);
  o.cuda = device == "cuda";
  return o;
}

// What holds for a variant's line on any machine.
static void check_variant(bench::Checks& checks, const BenchConfig& config, const Variant& variant,
                          const StepTimes& times, int64_t timed_steps) {
  const std::string where = bench::Checks::label("config ", config.name, ", ", variant.precision_name, ", recompute ",
                                                 nn::recompute_name(variant.recompute), ": ");
  checks.count(static_cast<int64_t>(times.step_ms.size()), timed_steps, where, "timed steps (--steps x rounds)");
  if (times.step_ms.empty()) return;
  checks.positive(times.median_ms(), where, "median_ms");
  checks.positive(times.min_ms(), where, "min_ms");
  checks.that(times.min_ms() <= times.median_ms(), where, "min_ms ", times.min_ms(), " above median_ms ",
              times.median_ms());
  checks.positive(times.forward_min_ms(), where, "forward_min_ms");
  checks.that(times.forward_min_ms() < times.min_ms(), where, "forward_min_ms ", times.forward_min_ms(),
              " not below min_ms ", times.min_ms(), " (the forward is part of every step)");
  checks.positive(static_cast<double>(times.activation_peak), where, "activation_peak (bytes)");
}

// The model FLOP rate of the median step (model_flops.h), and MFU against the dense peak when known.
static std::string flops_fields(bench::Checks& checks, const BenchConfig& config, const Variant& variant,
                                const StepTimes& times, double given_peak) {
  const double flops = bench::gpt_step_flops(times.params, config.model, config.batch);
  const double tflops = flops / (times.median_ms() * 1e-3) / 1e12;
  checks.positive(tflops, "config ", config.name, ": model_tflops");
  const std::string device_name = current_device().is_cuda() && !cuda_info().names.empty() ? cuda_info().names[0] : "";
  const bench::PeakRate peak =
      bench::dense_peak(device_name, nn::MixedPrecision::parse(variant.precision_name).param_dtype, given_peak);
  char text[512];
  std::snprintf(text, sizeof text, ", \"vocab\": %lld, \"params\": %lld, \"model_gflop_per_step\": %.3f, "
                "\"model_tflops\": %.4f", static_cast<long long>(config.model.vocab_size),
                static_cast<long long>(times.params), flops / 1e9, tflops);
  std::string out = text;
  if (peak.tflops > 0) {
    std::snprintf(text, sizeof text, ", \"peak_tflops\": %.1f, \"peak\": \"%s\", \"mfu\": %.4f", peak.tflops,
                  peak.source.c_str(), tflops / peak.tflops);
    out += text;
  }
  return out;
}

static void print_variant(bench::Checks& checks, const BenchConfig& config, const Variant& variant,
                          const StepTimes& times, int threads, double given_peak) {
  std::printf(
      "{\"bench\": \"gpt_step\", \"config\": \"%s\", \"T\": %lld, \"batch\": %lld, \"threads\": %d, "
      "\"mixed_precision\": \"%s\", \"recompute\": \"%s\", \"median_ms\": %.3f, \"min_ms\": %.3f, "
      "\"forward_min_ms\": %.3f, \"activation_peak_mib\": %.2f%s%s}\n",
      config.name, static_cast<long long>(config.model.block_size), static_cast<long long>(config.batch), threads,
      variant.precision_name.c_str(), nn::recompute_name(variant.recompute), times.median_ms(), times.min_ms(),
      times.forward_min_ms(), static_cast<double>(times.activation_peak) / (1 << 20),
      flops_fields(checks, config, variant, times, given_peak).c_str(),
      current_device().is_cuda() ? ", \"device\": \"cuda:0\"" : "");
}

// The variant against f32 (and recomputation against its own precision without it), fastest steps.
static void print_versus(bench::Checks& checks, const BenchConfig& config, const Variant& variant, const StepTimes& f32,
                         const StepTimes& kept, const StepTimes& times) {
  checks.positive(times.min_ms() / f32.min_ms(), "versus: ratio_min");
  checks.positive(times.median_ms() / f32.median_ms(), "versus: ratio_median");
  checks.positive(static_cast<double>(times.activation_peak) / static_cast<double>(f32.activation_peak),
                  "versus: activation_ratio");
  std::printf("{\"bench\": \"gpt_step_versus_f32\", \"config\": \"%s\", \"mixed_precision\": \"%s\", \"recompute\": "
              "\"%s\", \"conversions\": \"%s\", \"ratio_min\": %.3f, \"ratio_median\": %.3f, \"activation_ratio\": %.3f",
              config.name, variant.precision_name.c_str(), nn::recompute_name(variant.recompute),
              cpu::conversion_isa(), times.min_ms() / f32.min_ms(), times.median_ms() / f32.median_ms(),
              static_cast<double>(times.activation_peak) / static_cast<double>(f32.activation_peak));
  if (variant.recompute != nn::Recompute::none) {
    // full reruns every block's forward (about the whole forward); selective only the attention core
    const double expected = variant.recompute == nn::Recompute::full ? kept.forward_min_ms()
                                                                     : attention_core_forward_ms(config, variant);
    const double extra = times.min_ms() - kept.min_ms();
    checks.positive(expected, "versus: expected_extra_ms");
    checks.finite(extra / expected, "versus: extra_vs_expected");
    std::printf(", \"extra_ms\": %.3f, \"expected_extra_ms\": %.3f, \"extra_vs_expected\": %.3f", extra, expected,
                extra / expected);
  }
  std::printf("}\n");
}

int main(int argc, char** argv) {
  const std::vector<BenchConfig> configs = {
      {"A", nn::GPTConfig{256, 64, 4, 4, 128, 0.0}, 16},
      {"B", nn::GPTConfig{256, 128, 6, 8, 256, 0.0}, 8},
      // GPT-2 small: 124M parameters, its 50,257-token vocabulary, T 1024 (a GPU's config: minutes per step on a CPU)
      {"gpt2", nn::GPTConfig{50257, 1024, 12, 12, 768, 0.0}, 8, true},
  };
  Options defaults;
  if (bench::quick_mode(argc, argv)) defaults.only = "A", defaults.steps = 2, defaults.warmup = 1;
  const Options o = parse_options(argc, argv, configs, defaults);
  set_num_threads(o.threads);
  if (o.cuda && cuda_info().device_count == 0) {
    std::fprintf(stderr, "gpt_step: no CUDA device: %s\n", cuda_info().error.c_str());
    return 1;
  }
  DeviceGuard on_device(o.cuda ? Device::cuda(0) : current_device());  // every tensor of the run
  // f32 without recomputation first, then the variant's precision without it, then the variant.
  std::vector<Variant> variants = {Variant{"no"}};
  for (const Variant& v : {Variant{o.variant.precision_name}, o.variant})
    if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(v);
  const int rounds = variants.size() == 1 ? 1 : o.rounds;
  bench::Checks checks("gpt_step");
  int64_t lines = 0, asked = 0;
  for (BenchConfig config : configs) {
    if (o.only.empty() ? config.on_request : o.only != config.name) continue;
    if (o.seq_len > 0) {  // the same tokens per step at another length
      config.batch = std::max<int64_t>(1, config.batch * config.model.block_size / o.seq_len);
      config.model.block_size = o.seq_len;
    }
    std::vector<StepTimes> times(variants.size());
    for (int round = 0; round < rounds; ++round)  // alternating, so a noisy stretch hits every variant
      for (size_t v = 0; v < variants.size(); ++v) run(config, variants[v], o.steps, o.warmup, o.profile, times[v]);
    for (size_t v = 0; v < variants.size(); ++v) {
      check_variant(checks, config, variants[v], times[v], static_cast<int64_t>(o.steps) * rounds);
      print_variant(checks, config, variants[v], times[v], o.threads, o.peak_tflops);
      ++lines;
    }
    if (variants.size() > 1) {
      print_versus(checks, config, o.variant, times.front(), times[variants.size() == 2 ? 0 : 1], times.back());
      ++lines;
    }
    asked += static_cast<int64_t>(variants.size()) + (variants.size() > 1 ? 1 : 0);
    std::fflush(stdout);
  }
  checks.that(asked > 0, "at least one config runs");
  checks.count(lines, asked, "JSON lines (one per config and variant, and the versus line)");
  return checks.finish();
}
