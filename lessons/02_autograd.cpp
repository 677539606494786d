// Lesson 02 — autograd: how backward() finds every gradient.
//
// What you will learn
//   * each op records a node on a tape; backward() walks the tape in reverse (chain rule)
//   * gradients of a tensor used twice add up; leaf gradients accumulate across backward calls
//   * finite differences check any backward (gradcheck)
//   * a custom differentiable op is a Function: forward and backward side by side — this is how
//     the parallel chapters write all-reduce-in-backward ops
//   * a post-accumulate-grad hook runs as soon as a parameter's gradient is ready — DDP and ZeRO
//     start communicating from it, while backward is still running
//
// Run:    make lesson N=02        Prints: the story below, then "lesson 02: OK".
// Try:    build/lessons/02_autograd --steps 300 --lr 0.05 --slope -2 --intercept 4
//         build/lessons/02_autograd --break-zero-grad   (gradients pile up across steps)
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>

#include "autograd/function.h"
#include "lesson_args.h"
#include "lesson_svg.h"
#include "autograd/gradcheck.h"
#include "tensor/ops.h"

using namespace sl;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

// Prints the graph that produced `t`, one node per line, indented by depth.
static void print_graph(const std::shared_ptr<Node>& node, int depth, std::set<Node*>& seen) {
  if (!node) return;
  std::printf("  %*s%s%s\n", 2 * depth, "", node->name().c_str(), seen.count(node.get()) ? " (seen)" : "");
  if (!seen.insert(node.get()).second) return;
  for (const Edge& edge : node->next_edges) print_graph(edge.node, depth + 1, seen);
}

// Megatron's "f": identity in forward, all-reduce in backward. With one rank the all-reduce is the
// identity too; here backward just reports that it ran, to show where communication would go.
struct CopyToParallelRegion : Function<CopyToParallelRegion> {
  static Tensor forward(FunctionCtx&, const Tensor& x) { return x; }
  static TensorList backward(FunctionCtx&, const TensorList& grads) {
    std::printf("  CopyToParallelRegion backward: here a tensor-parallel rank would all-reduce a %s gradient\n",
                grads[0].shape().str().c_str());
    return {grads[0]};
  }
};

// Section 7's knobs: the line to fit and how gradient descent fits it.
struct FitConfig {
  int64_t steps;
  double lr, slope, intercept;
  uint64_t seed;
  bool keep_gradients;  // --break-zero-grad: never reset .grad between steps
};

// The fit's loss per step on a log scale: a straight fall is gradient descent's linear convergence.
static std::string loss_curve_svg(const std::vector<double>& losses) {
  const double left = 60, width = 480, top = 30, height = 200;
  lesson::Canvas canvas(left + width + 20, top + height + 40);
  canvas.text(10, 18, "fit y = slope x + intercept: loss per step (log10)", 13);
  double lo = 0, hi = 0;
  for (double loss : losses) {
    lo = std::min(lo, std::log10(std::max(loss, 1e-30)));
    hi = std::max(hi, std::log10(std::max(loss, 1e-30)));
  }
  auto x_of = [&](size_t step) { return left + width * step / std::max<size_t>(1, losses.size() - 1); };
  auto y_of = [&](double loss) { return top + height * (hi - std::log10(std::max(loss, 1e-30))) / std::max(1e-9, hi - lo); };
  canvas.line(left, top, left, top + height);
  canvas.line(left, top + height, left + width, top + height);
  canvas.text(left - 6, top + 4, "1e" + std::to_string(static_cast<int>(std::ceil(hi))), 10, "end");
  canvas.text(left - 6, top + height, "1e" + std::to_string(static_cast<int>(std::floor(lo))), 10, "end");
  canvas.text(left + width, top + height + 16, "step " + std::to_string(losses.size()), 10, "end");
  for (size_t step = 1; step < losses.size(); ++step)
    canvas.line(x_of(step - 1), y_of(losses[step - 1]), x_of(step), y_of(losses[step]), "#4c78a8", 1.5);
  return canvas.str();
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "02_autograd", "autograd: the tape, backward, gradcheck, Functions, hooks");
  FitConfig fit;
  fit.steps = args.integer("steps", 100, "gradient-descent steps of the y = slope x + intercept fit", 100, 2000);
  fit.lr = args.real("lr", 0.1, "learning rate of the fit", 0.05, 0.5);
  fit.slope = args.real("slope", 3.0, "slope of the line to recover (|slope| >= 0.5)", -10, 10);
  fit.intercept = args.real("intercept", -1.0, "intercept of the line to recover", -10, 10);
  fit.seed = args.integer("seed", 0, "seed of the 64 inputs", 0, 1000000);
  fit.keep_gradients = args.breaks("zero-grad", "forget to zero the gradients between steps");
  const std::string svg_dir = args.svg();
  args.done();
  if (std::abs(fit.slope) < 0.5) {  // a flat line starts near zero loss: "fell by 10^4" would not mean much
    std::fprintf(stderr, "02_autograd: --slope must be at least 0.5 away from 0\n");
    return 2;
  }
  std::printf("values: steps %lld, lr %g, slope %g, intercept %g, seed %llu%s\n", (long long)fit.steps, fit.lr,
              fit.slope, fit.intercept, (unsigned long long)fit.seed, fit.keep_gradients ? ", BROKEN: zero-grad" : "");
  bool ok = true;
  auto check = [&](bool condition, const char* what) {
    std::printf("  check: %-58s %s\n", what, condition ? "ok" : "FAILED");
    ok = ok && condition;
  };

  section("1. The tape: every op remembers how to send gradients back");
  Tensor w = from_vector({0.5, -1.0, 2.0}, {3}, TensorOptions().with_requires_grad());
  Tensor x = from_vector({1.0, 2.0, 3.0}, {3});
  Tensor loss = sum(mul(tanh(mul(w, x)), w));  // w is used twice
  std::cout << "loss = " << loss << "\n  the graph behind it:\n";
  std::set<Node*> seen;
  print_graph(loss.grad_fn(), 0, seen);

  section("2. backward(): reverse topological order, chain rule at each node");
  loss.backward();
  std::cout << "dloss/dw = " << w.grad() << "\n";
  // By hand: loss = sum w*tanh(w x)  =>  d/dw = tanh(w x) + w x (1 - tanh^2(w x))
  bool matches = true;
  for (int i = 0; i < 3; ++i) {
    double wi = w.to_vector()[i], xi = x.to_vector()[i], t = std::tanh(wi * xi);
    matches = matches && std::abs(w.grad().to_vector()[i] - (t + wi * xi * (1 - t * t))) < 1e-5;
  }
  check(matches, "backward == the derivative worked out by hand");

  section("3. Leaf gradients accumulate: zero them between steps");
  Tensor before = w.grad().clone();
  sum(mul(tanh(mul(w, x)), w)).backward();
  check(allclose(w.grad(), mul(before, 2.0)), "a second backward adds the same gradient again");
  w.set_grad(Tensor());

  section("4. gradcheck: finite differences as the referee");
  Tensor a = randn({4, 3}, TensorOptions(DType::f64).with_requires_grad());
  Tensor b = randn({3, 5}, TensorOptions(DType::f64).with_requires_grad());
  GradcheckResult result = gradcheck([](const TensorList& in) { return softmax(gelu(matmul(in[0], in[1]))); }, {a, b});
  std::printf("  softmax(gelu(a @ b)): %lld input elements checked: %s\n", (long long)result.checked,
              result.ok ? "backward == finite differences" : result.message.c_str());
  check(result.ok, "gradcheck of a small network");

  section("5. A custom Function: where the parallel chapters put their communication");
  Tensor h = from_vector({1, 2}, {1, 2}, TensorOptions().with_requires_grad());
  Tensor y = CopyToParallelRegion::apply(h);
  std::printf("  y was made by %s\n", y.grad_fn()->name().c_str());
  sum(mul(y, 3.0)).backward();
  check(h.grad().to_vector() == std::vector<double>({3, 3}), "gradient flowed through the custom op");

  section("6. Hooks: act the moment a parameter's gradient is ready");
  Tensor layer1 = from_vector({1.0}, {1}, TensorOptions().with_requires_grad());
  Tensor layer2 = from_vector({2.0}, {1}, TensorOptions().with_requires_grad());
  std::vector<std::string> ready_order;
  layer1.register_post_accumulate_grad_hook([&](Tensor&) { ready_order.push_back("layer1"); });
  layer2.register_post_accumulate_grad_hook([&](Tensor&) { ready_order.push_back("layer2"); });
  sum(mul(mul(ones({1}), layer1), layer2)).backward();
  std::printf("  gradients became ready in the order: %s, %s  (last layer first)\n", ready_order[0].c_str(),
              ready_order[1].c_str());
  check(ready_order == std::vector<std::string>({"layer2", "layer1"}), "the last layer's gradient is ready first");

  section("7. Putting it together: fit y = slope x + intercept by gradient descent");
  Generator gen(fit.seed);
  Tensor inputs = randn({64, 1}, {}, &gen);
  Tensor targets = add(mul(inputs, fit.slope), fit.intercept);
  Tensor weight = zeros({1, 1}, TensorOptions().with_requires_grad());
  Tensor offset = zeros({1}, TensorOptions().with_requires_grad());
  double first_loss = 0, last_loss = 0;
  std::vector<double> losses;  // for the picture
  const int64_t last_step = fit.steps - 1;
  for (int64_t step = 0; step < fit.steps; ++step) {
    Tensor prediction = add(matmul(inputs, weight, false, true), offset);
    Tensor mse = mean(pow(sub(prediction, targets), 2.0));
    mse.backward();
    {
      NoGradGuard no_grad;  // the update itself is not part of the model
      weight.add_(weight.grad(), -fit.lr);
      offset.add_(offset.grad(), -fit.lr);
    }
    if (!fit.keep_gradients) {  // the mistake: without this, step k descends along the sum of k gradients
      weight.set_grad(Tensor());
      offset.set_grad(Tensor());
    }
    if (step == 0) first_loss = mse.item();
    last_loss = mse.item();
    losses.push_back(last_loss);
    if (step % 25 == 0 || step == last_step)
      std::printf("  step %3lld  loss %.6f  w %.4f  b %.4f\n", (long long)step, mse.item(), weight.item(), offset.item());
  }
  check(last_loss < 1e-4 * first_loss, "loss fell by more than 10^4");
  std::printf("  recovered w %.4f (want %g), b %.4f (want %g)\n", weight.item(), fit.slope, offset.item(), fit.intercept);
  check(std::abs(weight.item() - fit.slope) < 1e-2 && std::abs(offset.item() - fit.intercept) < 1e-2,
        "recovered w = slope, b = intercept");

  lesson::write_picture(svg_dir, "02_fit_loss.svg", loss_curve_svg(losses));

  std::printf("\nlesson 02: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
