// Lesson 17 — mixtures of experts: a router sends each token to k of E expert MLPs.
//
// What you will learn
//   * the router on the page: softmax over the E experts, then the top k (softmax-topk: Switch, GShard),
//     or the top k logits, then softmax over those k (topk-softmax: Mixtral); checked against nn::route
//   * capacity: an expert computes at most ceil(factor · N · k / E) assignments; the rest are dropped,
//     first choices before second ones. A token that loses every choice gets a zero output, so the
//     block's residual carries it through unchanged. Drops counted and the loss measured per factor
//   * the load-balancing loss at work: a router that starts by sending most tokens to one expert,
//     trained with and without Switch's E · Σ f_e · P_e; tokens per expert over the steps, drawn
//   * expert parallelism written out (section 4, in 17_expert_parallel_on_the_page.h): E/ep experts per
//     rank, the routing choices all-gathered so that capacity counts the GLOBAL batch, a dispatch
//     all-to-all, the experts, a combine all-to-all; output and gradients checked against the serial
//     nn::MoE, the output against the library's parallel::ExpertParallelMoE, bytes against
//     tokens · k · C · 4 · (ep-1)/ep
//
// Run:    make lesson N=17        Prints: the story below, then "lesson 17: OK".
// Try:    build/lessons/17_mixture_of_experts --ep 4 --svg /tmp/svg_17   (the load curves drawn)
//         build/lessons/17_mixture_of_experts --aux-weight 0.3 --steps 80;  --capacity-factor 1.5
//         --break-local-capacity (each rank counts capacity over its own tokens),
//         --break-detached-weights (the combine's weights detached: the router learns nothing)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/gpt.h"
#include "nn/moe.h"
#include "nn/optim.h"
#include "tensor/ops.h"
#include "17_expert_parallel_on_the_page.h"  // section 4
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

// What a student may change: the experts and k, the capacity factor of sections 2 and 4, the
// balancing run (its weight and steps), the ep ranks of section 4, and two mistakes.
struct Config {
  int64_t experts = 4, top_k = 2;
  double capacity_factor = 1.0, aux_weight = 0.1;
  int64_t steps = 60;
  int ep = 2;
  lesson17::Breaks breaks;
  std::string svg_dir;
};

struct Checker {
  bool ok = true;
  void operator()(bool condition, const std::string& what) {
    std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
    ok = ok && condition;
  }
};

static nn::GPTConfig moe_layer_config(const Config& cfg, int64_t C) {
  nn::GPTConfig config{.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = C};
  config.moe_experts = cfg.experts;
  config.moe_top_k = cfg.top_k;
  config.moe_capacity_factor = cfg.capacity_factor;
  return config;
}

// The toy layer of sections 2 (who is lost) and 3 (balance): E 4, k 2, C 16, whatever the flags say.
constexpr int64_t kToyExperts = 4, kToyTopK = 2;
static nn::GPTConfig toy_config() {
  nn::GPTConfig config{.vocab_size = 32, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16};
  config.moe_experts = kToyExperts;
  config.moe_top_k = kToyTopK;
  return config;
}

// ---- 1. the router on the page ----------------------------------------------------------------------
// Row n of the logits [N, E]: p = softmax(logits) over all E. Top k by value, ties to the lower expert.
//   softmax-topk: weight_j = p[e_j]                       (sums to less than 1)
//   topk-softmax: weight_j = exp(l[e_j]) / Σ_i exp(l[e_i]) over the k chosen (sums to 1)
// The chosen experts are the same: softmax keeps the order of the logits.
struct RowRouting {
  std::vector<int64_t> experts;
  std::vector<double> weights;
};
static RowRouting route_row_by_hand(const std::vector<double>& logits, int64_t k, nn::MoERouter order) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t e = 0; e < logits.size(); ++e) total += (p[e] = std::exp(logits[e] - top));
  for (double& x : p) x /= total;
  std::vector<int64_t> order_of(logits.size());
  std::iota(order_of.begin(), order_of.end(), 0);
  std::stable_sort(order_of.begin(), order_of.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  RowRouting row{{order_of.begin(), order_of.begin() + k}, {}};
  double chosen = 0;
  for (int64_t e : row.experts) chosen += p[static_cast<size_t>(e)];
  for (int64_t e : row.experts)
    row.weights.push_back(order == nn::MoERouter::softmax_topk ? p[static_cast<size_t>(e)] : p[static_cast<size_t>(e)] / chosen);
  return row;
}

static void router_on_the_page(const Config& cfg, Checker& check) {
  section("1. the router: softmax and top-k, in both orders, by hand against nn::route");
  const int64_t N = 6, E = cfg.experts, k = cfg.top_k;
  Generator g(1);
  const Tensor logits = randn({N, E}, DType::f32, &g);
  const std::vector<double> all = logits.to_vector();
  for (nn::MoERouter order : {nn::MoERouter::softmax_topk, nn::MoERouter::topk_softmax}) {
    const nn::Routing lib = nn::route(logits, k, order);
    const std::vector<double> lib_experts = lib.experts.to_vector(), lib_weights = lib.weights.to_vector();
    bool same_experts = true;
    double worst = 0, weight_sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const RowRouting row = route_row_by_hand({all.begin() + n * E, all.begin() + (n + 1) * E}, k, order);
      for (int64_t j = 0; j < k; ++j) {
        same_experts = same_experts && lib_experts[n * k + j] == static_cast<double>(row.experts[j]);
        worst = std::max(worst, std::abs(lib_weights[n * k + j] - row.weights[j]));
        if (n == 0) weight_sum += row.weights[j];
      }
      if (n == 0) {
        std::printf("  %s, token 0: logits", nn::moe_router_name(order));
        for (int64_t e = 0; e < E; ++e) std::printf(" %.3f", all[e]);
        std::printf(" -> experts");
        for (int64_t j = 0; j < k; ++j) std::printf(" %lld (w %.4f)", (long long)row.experts[j], row.weights[j]);
        std::printf(", weights sum %.4f\n", weight_sum);
      }
    }
    check(same_experts && worst < 1e-6, std::string(nn::moe_router_name(order)) + ": experts equal nn::route's, weights within 1e-6");
  }
  std::printf("  softmax-topk keeps a chosen expert's probability as is (the weights sum to < 1, and every logit\n"
              "  gets gradient); topk-softmax renormalises over the k (they sum to 1; only the chosen logits learn)\n");
}

// ---- 2. capacity: who is dropped, what it does to the output and the loss -------------------------------
static void drops_pass_through(Checker& check) {
  nn::GPTConfig config = toy_config();
  config.moe_capacity_factor = 0.5;  // half the assignments fit: many drops
  Generator g(2);
  nn::MoE moe(config, {0.5, &g});
  const Tensor x = randn({32, 16}, DType::f32, &g);
  NoGradGuard no_grad;
  const Tensor out = moe(x), block = add(x, out);  // the block's residual: x + MoE(x)
  const nn::Routing routing = nn::route((*moe.router)(x), config.moe_top_k, config.moe_router);
  const nn::DispatchPlan plan = nn::plan_dispatch(routing.experts, config.moe_experts, moe.stats().capacity, Device::cpu());
  std::vector<int64_t> kept_choices(32, 0);
  for (double n : plan.token.to_vector()) ++kept_choices[static_cast<size_t>(n)];
  int64_t lost = 0;
  bool zero_rows = true, passes = true;
  for (int64_t n = 0; n < 32; ++n) {
    if (kept_choices[n] > 0) continue;
    ++lost;
    zero_rows = zero_rows && max_abs_diff(out.narrow(0, n, 1), zeros({1, 16})) == 0.0;
    passes = passes && max_abs_diff(block.narrow(0, n, 1), x.narrow(0, n, 1)) == 0.0;
  }
  std::printf("  capacity factor 0.5, N 32, k %lld, E %lld: capacity %lld, %lld of %lld assignments dropped; %lld tokens lost "
              "every choice\n", (long long)config.moe_top_k, (long long)config.moe_experts, (long long)moe.stats().capacity,
              (long long)moe.stats().dropped(), (long long)(32 * config.moe_top_k), (long long)lost);
  check(lost > 0 && zero_rows && passes, "a token that lost every choice: MoE output 0, x + MoE(x) == x exactly");
}

static void capacity_and_drops(const Config& cfg, Checker& check) {
  section("2. capacity: ceil(factor · N · k / E) per expert; first choices first, then token order");
  drops_pass_through(check);
  nn::GPTConfig config = moe_layer_config(cfg, 16);
  nn::GPT gpt(config, 7);
  std::vector<double> ids(65);  // a fixed token stream: rows of 8 inputs, the next token as target
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>((i * 7 + i / 5 + (i * i) % 11) % 32);
  const Tensor idx = from_vector({ids.begin(), ids.begin() + 64}, {8, 8}, DType::i64),
               targets = from_vector({ids.begin() + 1, ids.end()}, {8, 8}, DType::i64);
  const double dropless_factor = static_cast<double>(config.moe_experts) / static_cast<double>(config.moe_top_k);
  std::printf("  GPT 2 layers of E %lld experts, N = 64 tokens, k %lld; the cross-entropy (aux losses left out) per factor:\n",
              (long long)config.moe_experts, (long long)config.moe_top_k);
  std::printf("  factor  capacity  dropped (layer 0 + 1)  cross-entropy\n");
  std::vector<int64_t> dropped;
  std::vector<double> losses;
  NoGradGuard no_grad;
  for (double factor : {0.0, dropless_factor, 1.25, 1.0, 0.5, 0.25}) {
    for (int64_t l = 0; l < config.n_layer; ++l) gpt.block(l).moe->capacity_factor = factor;
    const Tensor loss = gpt.loss(idx, targets);
    const double ce = loss.item() - gpt.moe_loss().item();
    int64_t drops = 0;
    for (int64_t l = 0; l < config.n_layer; ++l) drops += gpt.block(l).moe->stats().dropped();
    std::printf("  %-6.2f  %-8lld  %-21lld  %.6f%s\n", factor, (long long)gpt.block(0).moe->stats().capacity,
                (long long)drops, ce, factor == 0 ? "   (dropless)" : factor == dropless_factor ? "   (capacity = N)" : "");
    dropped.push_back(drops), losses.push_back(ce);
  }
  check(dropped[0] == 0 && dropped[1] == 0 && losses[1] == losses[0], "capacity N drops nothing: the loss equals dropless, bitwise");
  check(std::is_sorted(dropped.begin() + 1, dropped.end()) && dropped.back() > 0, "a smaller factor drops more");
  std::printf("  A drop is not an error: the token skips that expert's MLP. But who is dropped depends on the rest\n"
              "  of the batch, so the function a token sees changes with the factor (here, at initialisation, the\n"
              "  experts' outputs are small and the loss moves in the fourth decimal).\n");
}

// ---- 3. the load-balancing loss at work -----------------------------------------------------------------
// A router that starts skewed: every token carries a shared component u, and the router's row of
// expert 0 points along u, so expert 0 is every token's first choice. The task: fit y = tanh(x·A).
struct LoadCurve {
  std::vector<std::vector<int64_t>> routed;  // [steps][E]
};
static LoadCurve train_balance(const Config& cfg, double aux_weight) {
  nn::GPTConfig config = toy_config();
  config.moe_capacity_factor = 0;  // dropless: the loads are what the router chose
  config.moe_aux_weight = aux_weight;
  config.moe_z_weight = 0;
  Generator g(4);
  nn::MoE moe(config, {0.1, &g});
  const Tensor teacher = mul(randn({16, 16}, DType::f32, &g), 0.3);
  {
    NoGradGuard no_grad;
    float* router = moe.router->weight.data<float>();
    for (int64_t c = 0; c < 16; ++c) router[c] += 0.5f;  // row 0 (expert 0) along u = (1, ..., 1)
  }
  nn::AdamW adamw(moe.parameters(), {.lr = 3e-2, .weight_decay = 0});
  LoadCurve curve;
  for (int64_t step = 0; step < cfg.steps; ++step) {
    Generator data(100 + static_cast<uint64_t>(step));
    const Tensor x = add(randn({128, 16}, DType::f32, &data), 1.0);  // [N, C] = noise + u
    const Tensor target = tanh(matmul(x, teacher));
    const Tensor diff = sub(moe(x), target);
    const Tensor loss = add(mean(mul(diff, diff)), moe.aux_loss());
    moe.zero_grad();
    loss.backward();
    adamw.step();
    curve.routed.push_back(moe.stats().routed);
  }
  return curve;
}

// max_e routed_e / (N·k/E): 1 is perfect balance, E/k when one expert is in every token's top k.
static double imbalance(const std::vector<int64_t>& routed) {
  const double total = static_cast<double>(std::accumulate(routed.begin(), routed.end(), int64_t{0}));
  return static_cast<double>(*std::max_element(routed.begin(), routed.end())) * static_cast<double>(routed.size()) / total;
}
static double late_imbalance(const LoadCurve& curve) {  // the mean over the last 10 steps
  double total = 0;
  for (size_t s = curve.routed.size() - 10; s < curve.routed.size(); ++s) total += imbalance(curve.routed[s]);
  return total / 10;
}

static void draw_load_curves(const Config& cfg, const LoadCurve& without, const LoadCurve& with) {
  const char* colours[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6"};
  const double panel_w = 360, panel_h = 200, left = 50, top = 50;
  lesson::Canvas canvas(2 * (panel_w + left) + 30, panel_h + top + 60);
  canvas.text(10, 18, "tokens routed to each expert per step (E " + std::to_string(kToyExperts) + ", k " +
                          std::to_string(kToyTopK) + ", 128 tokens; dashed: balance N·k/E)", 12);
  int64_t most = 0;
  for (const LoadCurve* curve : {&without, &with})
    for (const auto& step : curve->routed) most = std::max(most, *std::max_element(step.begin(), step.end()));
  int side = 0;
  for (const LoadCurve* curve : {&without, &with}) {
    const double x0 = left + side * (panel_w + left + 20), y0 = top;
    canvas.text(x0, y0 - 10, side ? "aux weight " + std::to_string(cfg.aux_weight).substr(0, 5) : "aux weight 0", 12);
    canvas.line(x0, y0 + panel_h, x0 + panel_w, y0 + panel_h);
    canvas.line(x0, y0, x0, y0 + panel_h);
    canvas.text(x0 - 6, y0 + 4, std::to_string(most), 10, "end");
    canvas.text(x0 - 6, y0 + panel_h, "0", 10, "end");
    canvas.text(x0 + panel_w, y0 + panel_h + 16, "step " + std::to_string(cfg.steps - 1), 10, "end");
    const double balance = 128.0 * static_cast<double>(kToyTopK) / static_cast<double>(kToyExperts);
    const double yb = y0 + panel_h * (1 - balance / static_cast<double>(most));
    for (double x = x0; x < x0 + panel_w; x += 8) canvas.line(x, yb, x + 4, yb, "#999");
    const size_t steps = curve->routed.size();
    for (int64_t e = 0; e < kToyExperts; ++e) {
      std::vector<std::pair<double, double>> points;
      for (size_t s = 0; s < steps; ++s)
        points.emplace_back(x0 + panel_w * static_cast<double>(s) / static_cast<double>(steps - 1),
                            y0 + panel_h * (1 - static_cast<double>(curve->routed[s][e]) / static_cast<double>(most)));
      canvas.polyline(points, colours[e % 8], 1.5);
    }
    ++side;
  }
  for (int64_t e = 0; e < kToyExperts; ++e)
    canvas.box(left + 90 * static_cast<double>(e), top + panel_h + 30, 12, 12, colours[e % 8]),
        canvas.text(left + 90 * static_cast<double>(e) + 16, top + panel_h + 40, "expert " + std::to_string(e), 11);
  lesson::write_picture(cfg.svg_dir, "load_balance.svg", canvas.str());
}

static void load_balancing(const Config& cfg, Checker& check) {
  section("3. the load-balancing loss E · Σ f_e · P_e at work: a skewed router, trained with and without it");
  const LoadCurve without = train_balance(cfg, 0.0), with = train_balance(cfg, cfg.aux_weight);
  std::printf("  tokens routed to each expert (128 tokens x k %lld = %lld assignments; balance = %lld each)\n",
              (long long)kToyTopK, (long long)(128 * kToyTopK), (long long)(128 * kToyTopK / kToyExperts));
  std::printf("  step   aux weight 0                 max/balance   aux weight %-5g               max/balance\n", cfg.aux_weight);
  for (int64_t s = 0; s < cfg.steps; s += std::max<int64_t>(1, cfg.steps / 6)) {
    std::string a, b;
    for (int64_t e = 0; e < kToyExperts; ++e)
      a += std::to_string(without.routed[s][e]) + " ", b += std::to_string(with.routed[s][e]) + " ";
    std::printf("  %-5lld  %-28s %-12.2f  %-28s %.2f\n", (long long)s, a.c_str(), imbalance(without.routed[s]), b.c_str(),
                imbalance(with.routed[s]));
  }
  const double end_without = late_imbalance(without), end_with = late_imbalance(with);
  std::printf("  the last 10 steps: max/balance %.2f without, %.2f with (1: every expert N·k/E; E/k = %.0f: one expert in\n"
              "  every token's top k). Each step draws fresh tokens, so the load moves a little from step to step.\n",
              end_without, end_with, static_cast<double>(kToyExperts) / static_cast<double>(kToyTopK));
  check(imbalance(with.routed.front()) > 1.5 && end_with < 1.4 && end_with < 0.75 * end_without,
        "with the balancing loss the load converges toward N·k/E per expert (max/balance < 1.4 over the last 10 "
        "steps); without it, it does not");
  if (!cfg.svg_dir.empty()) draw_load_curves(cfg, without, with);
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "17_mixture_of_experts", "mixtures of experts: routing, capacity, balance, expert parallelism");
  Config cfg;
  cfg.experts = args.integer("experts", 4, "experts E of sections 1, 2 (the GPT) and 4 (a multiple of --ep)", 2, 16);
  cfg.top_k = args.integer("top-k", 2, "experts per token k of sections 1, 2 (the GPT) and 4 (at most E)", 1, 4);
  cfg.capacity_factor = args.real("capacity-factor", 1.0, "the capacity factor of section 4 (0: dropless)", 0, 4);
  cfg.aux_weight = args.real("aux-weight", 0.1, "the load-balancing loss's weight in section 3's second run (E 4, k 2)", 0.05, 1);
  cfg.steps = args.integer("steps", 60, "training steps of section 3", 40, 300);
  cfg.ep = static_cast<int>(args.integer("ep", 2, "expert-parallel ranks of section 4 (divides E)", 2, 8));
  cfg.breaks.local_capacity = args.breaks("local-capacity", "section 4 counts each expert's capacity over the rank's own "
                                          "tokens (ceil(factor · N/ep · k / E)), not over the global batch");
  cfg.breaks.detached_weights = args.breaks("detached-weights", "section 4's combine multiplies by the router's weights "
                                            "detached: the router gets no gradient");
  cfg.svg_dir = args.svg();
  args.done();
  if (cfg.experts % cfg.ep != 0 || cfg.top_k > cfg.experts) {
    std::fprintf(stderr, "17_mixture_of_experts: --ep must divide --experts (%lld) and --top-k be at most it\n",
                 (long long)cfg.experts);
    return 2;
  }
  std::printf("Lesson 17: mixtures of experts\n");
  std::printf("with E = %lld experts, k = %lld, capacity factor %g, ep = %d%s%s\n", (long long)cfg.experts,
              (long long)cfg.top_k, cfg.capacity_factor, cfg.ep,
              cfg.breaks.local_capacity ? ", BROKEN: capacity per rank" : "",
              cfg.breaks.detached_weights ? ", BROKEN: detached combine weights" : "");
  Checker check;
  router_on_the_page(cfg, check);
  capacity_and_drops(cfg, check);
  load_balancing(cfg, check);
  lesson17::expert_parallel(moe_layer_config(cfg, std::max<int64_t>(8, cfg.experts)), cfg.ep, cfg.breaks,
                            [&](bool ok, const std::string& what) { check(ok, what); });
  std::printf("\nlesson 17: %s\n", check.ok ? "OK" : "FAILED");
  return check.ok ? 0 : 1;
}
