// elementwise — the per-element ops of a GPT step on their own, in elements per second: GELU forward
// and backward, exp, softmax forward and backward, LayerNorm forward and backward. f32, 1 thread.
//
//   build/bench/elementwise [--reps 50] [--warmup 5] [--quick]
//
// Shapes are config B's of bench/gpt_step (B 8, T 128, C 256, NH 8): GELU and exp on the MLP's
// hidden activations [B*T, 4C], softmax on the attention scores [B*NH*T, T], LayerNorm on [B*T, C].
// Prints one JSON line per op with the best time of --reps runs (these machines are noisy; the
// minimum is the least disturbed run) and the median. bench/elementwise_torch.py times PyTorch's
// same ops on the same shapes; bench/compare_torch.sh runs both and prints the ratios.
//
// --quick: 3 runs after 1 warm-up per op (about a second; flags given beside it still apply). In
// every mode the output is checked (bench/bench_check.h), exiting 1 on a failure: one line per op
// (7), its times finite and positive with the best no slower than the median, its rate finite and
// positive.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "tensor/ops.h"

using namespace sl;

namespace {

struct Timing {
  double min_us, median_us;
};

// The best and the median wall time of `reps` calls of `body`, after `warmup` untimed ones.
Timing time_it(const std::function<void()>& body, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(us.begin(), us.end());
  return {us.front(), us[us.size() / 2]};
}

int lines_printed = 0;  // report()'s, one per op this program times (checked: 7)

void report(bench::Checks& checks, const char* op, const Shape& shape, Timing t) {
  const double elements = static_cast<double>(shape.numel());
  checks.positive(t.min_us, op, ": min_us");
  checks.positive(t.median_us, op, ": median_us");
  checks.that(t.min_us <= t.median_us, op, ": min_us ", t.min_us, " above median_us ", t.median_us);
  checks.positive(elements / t.min_us / 1e3, op, ": gelem_per_s");
  std::printf(
      "{\"bench\": \"elementwise\", \"impl\": \"shardlab\", \"op\": \"%s\", \"shape\": \"%s\", \"min_us\": %.1f, "
      "\"median_us\": %.1f, \"gelem_per_s\": %.3f}\n",
      op, shape.str().c_str(), t.min_us, t.median_us, elements / t.min_us / 1e3);
  std::fflush(stdout);
  ++lines_printed;
}

// The backward of y = f(x) alone: the graph is kept (retain_graph) and x's gradient cleared each
// time, so every run is one backward kernel writing a fresh gradient, as in a training step.
Timing time_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int reps, int warmup) {
  return time_it(
      [&] {
        x.set_grad(Tensor());
        y.backward(dy, /*retain_graph=*/true);
      },
      reps, warmup);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::quick_mode(argc, argv);
  int reps = 50, warmup = 5;
  if (quick) reps = 3, warmup = 1;  // defaults: the flags below still override them
  cli::Parser flags("elementwise", "elementwise: GELU, exp, softmax and LayerNorm forward and backward, GB/s");
  flags.integer("--reps", reps, 1, 1 << 20, "timed repetitions per op");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed repetitions before them");
  bench::parse_flags(flags, argc, argv);
  set_num_threads(1);
  bench::Checks checks("elementwise");
  const int64_t B = 8, T = 128, C = 256, NH = 8;
  Generator gen(0);

  // GELU and exp on the MLP's hidden activations [B*T, 4C] (standard normal, as after fc1).
  const Shape hidden{B * T, 4 * C};
  Tensor h = randn(hidden, {}, &gen).set_requires_grad();
  Tensor dh = randn(hidden, {}, &gen);
  Tensor gelu_out = gelu(h);
  report(checks, "gelu_forward", hidden, time_it([&] { gelu(h); }, reps, warmup));
  report(checks, "gelu_backward", hidden, time_backward(h, gelu_out, dh, reps, warmup));
  Tensor exp_out = exp(h);
  report(checks, "exp_forward", hidden, time_it([&] { exp(h); }, reps, warmup));

  // Softmax over the keys of the attention scores [B*NH*T, T].
  const Shape scores{B * NH * T, T};
  Tensor s = randn(scores, {}, &gen).set_requires_grad();
  Tensor ds = randn(scores, {}, &gen);
  Tensor softmax_out = softmax(s);
  report(checks, "softmax_forward", scores, time_it([&] { softmax(s); }, reps, warmup));
  report(checks, "softmax_backward", scores, time_backward(s, softmax_out, ds, reps, warmup));

  // LayerNorm over the channels of the residual stream [B*T, C].
  const Shape rows{B * T, C};
  Tensor x = randn(rows, {}, &gen).set_requires_grad();
  Tensor weight = ones({C}).set_requires_grad(), bias = zeros({C}).set_requires_grad();
  Tensor dx = randn(rows, {}, &gen);
  Tensor ln_out = layer_norm(x, weight, bias);
  report(checks, "layer_norm_forward", rows, time_it([&] { layer_norm(x, weight, bias); }, reps, warmup));
  report(checks, "layer_norm_backward", rows,
         time_it(
             [&] {
               x.set_grad(Tensor());
               weight.set_grad(Tensor());
               bias.set_grad(Tensor());
               ln_out.backward(dx, /*retain_graph=*/true);
             },
             reps, warmup));
  checks.count(lines_printed, 7, "JSON lines (one per op)");
  return checks.finish();
}
