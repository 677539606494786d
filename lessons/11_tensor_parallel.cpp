// Lesson 11 — Megatron tensor parallelism: cut every weight matrix, not the batch.
//
// What you will learn
//   * the two cuts of a Linear Y = X·Wᵀ (W [out, in]) across t ranks:
//       column parallel: rank i holds rows i of W (out/t outputs each); Y stays split by columns
//       row parallel:    rank i holds columns i of W (in/t inputs each); the partial products are summed
//     An MLP is column then row: GeLU runs on each rank's own columns, so the only exchange is one
//     sum at the end.
//   * Megatron's two communication operators, each the other's transpose:
//       f: identity forward, all-reduce backward      g: all-reduce forward, identity backward
//     written on the page below with nothing but ProcessGroup::all_reduce, and checked against the
//     library's make_column_parallel / make_row_parallel (parallel/tensor_parallel/linear.h): the
//     hooks that cut the GPT's own Linears, here on slices of a serial Linear. f sits on the output
//     of the LayerNorm that feeds the column layer, as in a GPT block.
//   * attention splits by heads: c_attn [3C, C] is cut so each rank holds whole heads of q, k AND v
//     (the same rows of each third), not a contiguous third of the fused matrix.
//   * the bytes: per block 2 all-reduces of B·T·C forward and 2 backward, read from the ledger.
//   * the vocabulary: wte and the tied head are cut by rows; the cross-entropy needs only 3
//     all-reduces of B·T numbers (max, target logit, sum of exponentials), never the [B, T, V] logits.
//     Written on the page, checked against the library and the serial loss (also at ×1e3 logits).
//   * and that a GPT cut over tp = 2 trains exactly like the serial one.
//
// Run:    make lesson N=11   (about a second)
// Try:    build/lessons/11_tensor_parallel --tp 4 --batch 8 --T 16 --svg /tmp/svg_11   (bytes and head cut)
//         build/lessons/11_tensor_parallel --break-max   (the loss overflows at x1e3 logits)
// Prints: 1 the split MLP on the page vs the library; 2 the head split of c_attn; 3 bytes per block;
//         4 vocab-parallel cross-entropy on the page; 5 five AdamW steps tp 2 vs serial; "lesson 11: OK".
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/tensor_parallel/tensor_parallel.h"
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;
using namespace sl::parallel;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

// What a student may change: the tensor-parallel degree t (sections 1, 2, 3, 5), the batch B and
// context T whose bytes section 3 counts, the training steps of section 5, and two mistakes.
struct Config {
  int tp = 2;
  int64_t batch = 4, T = 8;
  int steps = 5;
  bool break_bias = false;  // the page's row-parallel layer adds the bias on every rank, before the sum
  bool break_max = false;   // the page's vocab cross-entropy exponentiates without subtracting the max
  std::string svg_dir;
};

// A check that prints its line and remembers a failure.
struct Checker {
  bool ok = true;
  void operator()(bool condition, const std::string& what) {
    std::printf("  check: %-72s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  }
};

// ---- the tensor-parallel MLP on one page ------------------------------------------------------------
//   H ─f─▶ GeLU(H·A_iᵀ + a_i) ─▶ ·B_iᵀ ─g─▶ + b        A [4C, C] cut by rows, B [C, 4C] by columns
// H is the LayerNorm's output, the same on every rank. Forward runs the local math under autograd
// from a detached copy of H; the two exchanges are plain all-reduces: g's in forward (the partial
// sums), f's in backward (each rank's part of dH).
struct HandMLP {
  Tensor A, a, B, b;  // A_i [4C/t, C], a_i [4C/t], B_i [C, 4C/t], b [C]
  ProcessGroupPtr group;
  bool bias_before_sum = false;  // the mistake: every rank adds b to its share, so the sum holds t·b
  Tensor h_local, partial;  // saved for backward

  Tensor forward(const Tensor& h) {
    h_local = h.detach().clone().set_requires_grad();  // f forward: identity
    partial = linear(gelu(linear(h_local, A, a)), B);  // [N, C], this rank's share of the sum
    Tensor z = partial.detach().clone();
    if (bias_before_sum) z = add(z, b.detach());
    group->all_reduce(z);  // g forward: sum the shares
    return bias_before_sum ? z : add(z, b.detach());  // the bias once, after the sum
  }
  Tensor backward(const Tensor& dz) {  // dz [N, C], the same on every rank
    partial.backward(dz);              // g backward: identity
    Tensor dh = h_local.grad().clone();
    group->all_reduce(dh);  // f backward: sum every rank's part of dH
    return dh;
  }
};

// ---- vocab-parallel cross-entropy on one page ------------------------------------------------------------
// logits [N, Vs]: this rank's columns, ids [start, start + Vs); targets [N]. Returns the mean loss.
// (subtract_max = false is the mistake: exp of a logit in the thousands overflows float to inf.)
static double hand_vocab_cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets, int64_t start,
                                       const ProcessGroupPtr& group, bool subtract_max = true) {
  const int64_t N = logits.size(0), Vs = logits.size(1);
  const std::vector<float> x = logits.values<float>();
  Tensor m = full({N}, -INFINITY), xt = zeros({N}), S = zeros({N});
  float *pm = m.data<float>(), *pxt = xt.data<float>(), *pS = S.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vs; ++v) pm[n] = std::max(pm[n], x[n * Vs + v]);
  group->all_reduce(m, ReduceOp::max);  // 1. the row max over all columns
  if (!subtract_max) m.fill_(0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < Vs; ++v) pS[n] += std::exp(x[n * Vs + v] - pm[n]);
    if (targets[n] >= start && targets[n] < start + Vs) pxt[n] = x[n * Vs + targets[n] - start] - pm[n];
  }
  group->all_reduce(xt);  // 2. the target's logit (one owner)
  group->all_reduce(S);   // 3. Σ exp over all columns
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += std::log(pS[n]) - pxt[n];
  return loss / static_cast<double>(N);
}

// The head cut of c_attn [3C, C]: three bars (q, k, v) of C rows each, coloured by the rank holding them.
static void draw_head_cut(const Config& cfg, int64_t C, int64_t t) {
  if (cfg.svg_dir.empty()) return;
  const char* colours[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756"};
  const double row_w = 8;
  lesson::Canvas canvas(3 * C * row_w + 80, 110);
  canvas.text(10, 18, "c_attn [3C, C] rows, cut by heads over t = " + std::to_string(t) + " (colour = tp rank)", 12);
  for (int part = 0; part < 3; ++part) {
    const double x0 = 20 + part * (C * row_w + 20);
    canvas.text(x0 + C * row_w / 2, 40, std::string(1, "qkv"[part]), 12, "middle");
    for (int64_t r = 0; r < t; ++r)
      canvas.box(x0 + r * (C / t) * row_w, 50, (C / t) * row_w, 30, colours[r], "rank " + std::to_string(r));
  }
  lesson::write_picture(cfg.svg_dir, "c_attn_heads.svg", canvas.str());
}

static void mlp_split(const Config& cfg, Checker& check) {
  section("1. The MLP split: column (c_fc) then row (c_proj), f and g on the page vs the library");
  std::printf(
      "        X [N, C] ─ LayerNorm ─ H       rank i\n"
      "   f ──┴── (identity; backward: all-reduce dH)\n"
      "        H·A_iᵀ + a_i   [N, 4C/t]       A_i = rows i of A      (column parallel)\n"
      "        GeLU           [N, 4C/t]       elementwise: no exchange needed\n"
      "        ·B_iᵀ          [N, C] partial  B_i = columns i of B   (row parallel)\n"
      "   g ──┬── (all-reduce; backward: identity)\n"
      "        + b            [N, C]          the bias once, after the sum\n");
  const int t = cfg.tp;
  const int64_t N = 6, C = 8;
  double out_err = 0, dx_err = 0, grad_err = 0;
  launch(t, [&](RankContext& ctx) {
    Generator g1(3), gx(4), gz(5);
    nn::Linear c_fc(C, 4 * C, true, {0.2, &g1}), c_proj(4 * C, C, true, {0.2, &g1});  // the serial A, B
    {
      NoGradGuard no_grad;
      c_proj.bias.fill_(0.5);  // a bias that would show if it were added t times
    }
    // The library: this rank's slices of the serial layers, made parallel by the calls that cut
    // every block of the GPT (parallel_block.cpp): f on the LayerNorm's output, g + b after c_proj.
    TPGroup group{ctx.world, false};
    nn::LayerNorm ln(C);
    std::shared_ptr<nn::Linear> fc = column_shard(c_fc, group), proj = row_shard(c_proj, group);
    HandMLP hand{fc->weight.detach(),
                 fc->bias.detach(),
                 proj->weight.detach().clone().set_requires_grad(),
                 proj->bias.detach(),  // before make_row_parallel takes the handle
                 ctx.world,
                 cfg.break_bias,
                 {},
                 {}};
    make_column_parallel(*fc, ln, group);
    make_row_parallel(*proj, group);
    Tensor x = randn({N, C}, {}, &gx);
    Tensor x_lib = x.clone().set_requires_grad(), x_page = x.clone().set_requires_grad();
    Tensor y = (*proj)(gelu((*fc)(ln(x_lib))));  // the library: f and g are autograd Functions
    nn::LayerNorm page_ln(C);                    // the page: the same LayerNorm, then f and g by hand
    Tensor h = page_ln(x_page);
    Tensor z = hand.forward(h);
    Tensor dz = randn({N, C}, {}, &gz);  // the same on every rank
    y.backward(dz);
    h.backward(hand.backward(dz));
    if (ctx.rank == 0) {
      out_err = max_abs_diff(y, z);
      dx_err = max_abs_diff(x_lib.grad(), x_page.grad());
      grad_err = max_abs_diff(proj->weight.grad(), hand.B.grad());
    }
  });
  std::printf("  tp %d: |library - page|: output %.1e, dX %.1e, dB_0 %.1e\n", t, out_err, dx_err, grad_err);
  if (cfg.break_bias)
    std::printf("  --break-bias: every rank added b = 0.5 before the sum: the output is off by (t-1)·0.5 = %.1f\n",
                (t - 1) * 0.5);
  check(out_err < 1e-6 && dx_err < 1e-6 && grad_err < 1e-6,
        "f and g on the page == make_column_parallel -> make_row_parallel");
}

static void head_split(const Config& cfg, Checker& check) {
  section("2. Attention splits by heads: c_attn [3C, C] cut as whole heads of q, k and v");
  const int64_t t = cfg.tp, C = 16, rows = C / t, heads = 4 / t;  // 4 heads of 4
  const nn::GPTConfig config{.vocab_size = 32, .block_size = 8, .n_layer = 1, .n_head = 4, .n_embd = C};
  nn::GPT serial(config, 1);
  const Tensor& w = serial.block(0).attn->c_attn->weight;  // rows: q 0..15 | k 16..31 | v 32..47
  bool slices = true;
  for (int64_t r = 0; r < t; ++r) {
    nn::GPT shard(config, 1, nn::GPTShardSpec::whole().with_tensor_parallel(r, t));
    const Tensor& mine = shard.block(0).attn->c_attn->weight;  // [3C/t, C]
    const auto n = [](int64_t x) { return static_cast<long long>(x); };
    std::printf("  tp rank %lld: c_attn [%lld, %lld] = q rows [%lld, %lld) + k rows [%lld, %lld) + v rows [%lld, %lld): heads %lld..%lld\n",
                n(r), n(3 * rows), n(C), n(rows * r), n(rows * r + rows), n(C + rows * r), n(C + rows * r + rows),
                n(2 * C + rows * r), n(2 * C + rows * r + rows), n(heads * r), n(heads * r + heads - 1));
    Tensor expected = cat({w.narrow(0, rows * r, rows), w.narrow(0, C + rows * r, rows), w.narrow(0, 2 * C + rows * r, rows)}, 0);
    slices = slices && max_abs_diff(mine, expected) == 0 && shard.block(0).attn->n_head == heads;
  }
  draw_head_cut(cfg, C, t);
  std::printf("  A contiguous third of the fused rows would give rank 0 all of q and half of k: no whole head.\n");
  check(slices, "each shard's c_attn is its heads' rows of q, k, v of the serial draw, bitwise");
}

static void bytes_per_block(const Config& cfg, Checker& check) {
  section("3. Bytes per block: 2 all-reduces of B·T·C forward (g), 2 backward (f)");
  const int t = cfg.tp;
  const int64_t B = cfg.batch, T = cfg.T, C = 16;
  const nn::GPTConfig config{.vocab_size = 32, .block_size = T, .n_layer = 2, .n_head = 4, .n_embd = C};
  nn::TokenStream data;
  data.vocab_size = 32;
  for (int i = 0; i < 200; ++i) data.tokens.push_back((i * 7 + i / 3) % 32);
  std::vector<CommStats> stats(2);
  launch(t, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, {.tp = t});
    for (int layers : {1, 2}) {
      nn::GPTConfig c = config;
      c.n_layer = layers;
      TensorParallelRunner runner(c, 5, mesh);
      mesh.group(MeshDim::tp)->ledger().reset();
      auto micros = data.micro_batches(0, B, T, 1);
      runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
      if (ctx.rank == 0) stats[layers - 1] = mesh.group(MeshDim::tp)->ledger()[CommOp::all_reduce];
    }
  });
  const int64_t act = B * T * C * 4, per_block = 4 * act * 2 * (t - 1) / t;
  const int64_t rest = 2 * act * 2 * (t - 1) / t + 3 * (B * T * 4) * 2 * (t - 1) / t;
  std::printf("  all-reduce, per rank:  1 block %lld calls %lld bytes   2 blocks %lld calls %lld bytes\n",
              (long long)stats[0].calls, (long long)stats[0].bytes_sent, (long long)stats[1].calls,
              (long long)stats[1].bytes_sent);
  std::printf("  one block adds %lld calls, %lld bytes = 4 x ring(B·T·C·4 = %lld B) = %lld\n",
              (long long)(stats[1].calls - stats[0].calls), (long long)(stats[1].bytes_sent - stats[0].bytes_sent),
              (long long)act, (long long)per_block);
  std::printf(
      "  outside the blocks: the embedding's g, the head's f (its input feeds the vocab shards),\n"
      "  and the loss's 3 all-reduces of B·T floats: %lld bytes\n",
      (long long)rest);
  if (!cfg.svg_dir.empty()) {
    lesson::BarChart chart("tp all-reduce bytes per rank, B=" + std::to_string(B) + " T=" + std::to_string(T) +
                               " t=" + std::to_string(t), "bytes");
    chart.bar("1 block", static_cast<double>(stats[0].bytes_sent), static_cast<double>(per_block + rest));
    chart.bar("2 blocks", static_cast<double>(stats[1].bytes_sent), static_cast<double>(2 * per_block + rest));
    lesson::write_picture(cfg.svg_dir, "tp_bytes.svg", chart.svg());
  }
  check(stats[1].calls - stats[0].calls == 4 && stats[1].bytes_sent - stats[0].bytes_sent == per_block,
        "per block: 4 all-reduces of B·T·C (2 forward, 2 backward)");
  check(stats[0].calls == 4 + 5 && stats[0].bytes_sent == per_block + rest, "embedding + head + loss: 5 more");
}

static void vocab_cross_entropy(const Config& cfg, Checker& check) {
  section("4. Vocab-parallel cross-entropy on the page: 3 all-reduces of N numbers, no [N, V]");
  const int t = 4;
  const int64_t N = 6, V = 20, Vs = V / t;
  std::vector<int64_t> targets = {0, 4, 7, 12, 15, 19};  // one in every shard
  Generator g(11);
  for (double scale : {1.0, 1e3}) {
    Tensor logits = mul(randn({N, V}, {}, &g), scale);
    const double serial = cross_entropy(logits, from_vector({0, 4, 7, 12, 15, 19}, {N}, DType::i64)).item();
    std::vector<double> hand(t), library(t);
    launch(t, [&](RankContext& ctx) {
      Tensor mine = logits.narrow(1, ctx.rank * Vs, Vs);
      hand[ctx.rank] = hand_vocab_cross_entropy(mine, targets, ctx.rank * Vs, ctx.world, !cfg.break_max);
      library[ctx.rank] = vocab_parallel_cross_entropy(mine, from_vector({0, 4, 7, 12, 15, 19}, {N}, DType::i64),
                                                           VocabRange::of(V, ctx.rank, t), ctx.world)
                              .item();
    });
    std::printf("  logits x%-5g serial %.6f   page %.6f   library %.6f   (each rank held [%lld, %lld])\n", scale,
                serial, hand[0], library[0], (long long)N, (long long)Vs);
    if (cfg.break_max && !std::isfinite(hand[0]))
      std::printf("  --break-max: exp of logits near %g overflowed float: the page's loss is %f\n", scale, hand[0]);
    check(std::abs(hand[0] - serial) < 1e-4 * std::max(1.0, serial) &&
              std::abs(library[0] - serial) < 1e-4 * std::max(1.0, serial) && std::isfinite(library[0]),
          "page == library == serial cross_entropy (no overflow)");
  }
  std::printf("  Backward needs no exchange: softmax - one_hot on my columns, from the saved m and S.\n");
}

static void trains_like_serial(const Config& cfg, Checker& check) {
  std::printf("\n--- 5. A GPT cut over tp %d trains like the serial GPT (%d AdamW steps)\n", cfg.tp, cfg.steps);
  const int steps = cfg.steps;
  const nn::GPTConfig config{.vocab_size = 31, .block_size = 8, .n_layer = 2, .n_head = std::max(2, cfg.tp), .n_embd = 16};
  nn::TokenStream data;
  data.vocab_size = 31;
  for (int i = 0; i < 300; ++i) data.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 31);
  const nn::AdamWOptions adamw{.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1};
  nn::GPT serial(config, 5);
  nn::AdamW serial_opt(serial.parameters(), adamw);
  std::vector<double> serial_losses, tp_losses(steps);
  for (int s = 0; s < steps; ++s) {
    serial_opt.zero_grad();
    nn::Batch batch = data.get_batch(s, 4, 8);
    Tensor loss = serial.loss(batch.inputs, batch.targets);
    loss.backward();
    serial_opt.step();
    serial_losses.push_back(loss.item());
  }
  double param_err = 0;
  launch(cfg.tp, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, {.tp = cfg.tp});
    TensorParallelRunner runner(config, 5, mesh);
    nn::AdamW opt(runner.module().parameters(), adamw);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto micros = data.micro_batches(s, 4, 8, 1);
      const double loss = runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
      runner.finish_gradients();
      opt.step();
      if (runner.holds_loss()) tp_losses[s] = loss;
    }
    nn::StateDict full = runner.full_state_dict();
    if (ctx.rank == 0)
      for (const auto& [name, p] : serial.named_parameters())
        param_err = std::max(param_err, max_abs_diff(full.at(name), p));
  });
  bool same = true;
  for (int s = 0; s < steps; ++s) {
    std::printf("  step %d  serial %.6f   tp %d %.6f\n", s, serial_losses[s], cfg.tp, tp_losses[s]);
    same = same && std::abs(serial_losses[s] - tp_losses[s]) < 4e-5 + 1e-5 * serial_losses[s];
  }
  std::printf("  max |parameter - serial| after %d steps: %.1e (vocab 31 is padded to 32 on %d ranks)\n", steps, param_err,
              cfg.tp);
  check(same && param_err < 1e-4, "tp " + std::to_string(cfg.tp) + " == serial: losses and parameters (rtol 1e-5, atol 4e-5)");
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "11_tensor_parallel", "Megatron tensor parallelism: cut every weight matrix");
  Config cfg;
  cfg.tp = static_cast<int>(args.integer("tp", 2, "tensor-parallel degree t, 2 or 4 (divides the 4 heads; section 4 keeps 4)", 2, 4));
  cfg.batch = args.integer("batch", 4, "B, rows whose all-reduce bytes section 3 counts", 1, 32);
  cfg.T = args.integer("T", 8, "T, the context of section 3", 1, 64);
  cfg.steps = static_cast<int>(args.integer("steps", 5, "AdamW steps of section 5, tp against serial", 1, 20));
  cfg.break_bias = args.breaks("bias", "the page's row-parallel layer adds its bias on every rank, before the sum");
  cfg.break_max = args.breaks("max", "the page's vocab cross-entropy forgets to subtract the row max before exp");
  cfg.svg_dir = args.svg();
  args.done();
  if (cfg.tp == 3) {
    std::fprintf(stderr, "11_tensor_parallel: --tp 3 does not divide the 4 heads (take 2 or 4)\n");
    return 2;
  }
  std::printf("lesson 11 with tp = %d, B = %lld, T = %lld, %d steps%s%s\n", cfg.tp, (long long)cfg.batch, (long long)cfg.T,
              cfg.steps, cfg.break_bias ? ", BROKEN bias" : "", cfg.break_max ? ", BROKEN max" : "");
  Checker check;
  mlp_split(cfg, check);
  head_split(cfg, check);
  bytes_per_block(cfg, check);
  vocab_cross_entropy(cfg, check);
  trains_like_serial(cfg, check);
  std::printf("\nlesson 11: %s\n", check.ok ? "OK" : "FAILED");
  return check.ok ? 0 : 1;
}
